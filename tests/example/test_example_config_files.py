"""Both examples take --config FILE: the Trainer's options, the checkpoint policy and the example's own flags
from a TOML file, the command line winning."""

from __future__ import annotations

from dcgan import cli as dcgan_cli  # examples/, on pytest's pythonpath
from lm import cli as lm_cli


def test_the_lm_example_reads_a_config_file(tmp_path):
    config = tmp_path / "lm.toml"
    config.write_text("steps = 40\naccumulate = 2\nsave-every = 5\nkeep-checkpoints = 0\nlog-every = 4\nseed = 9\n")
    settings = lm_cli.resolve(lm_cli.parse(["--config", str(config), "--seed", "3", "--out", str(tmp_path / "o")]))
    trainer = settings.trainer
    assert settings.args.steps == 40
    assert (trainer.accumulate_grad_batches, trainer.log_every, trainer.seed, trainer.progress) == (2, 4, 3, False)
    assert trainer.checkpoints is not None
    assert (trainer.checkpoints.every_n_steps, trainer.checkpoints.keep_last) == (5, None)
    assert trainer.checkpoints.directory == str(tmp_path / "o" / "checkpoints")
    assert trainer.log_dir == str(tmp_path / "o" / "tensorboard")


def test_the_dcgan_example_reads_a_config_file(tmp_path):
    config = tmp_path / "dcgan.json"
    config.write_text('{"batch-size": 16, "save-every": 7, "channels-last": false, "price-per-hour": 2.5}')
    settings = dcgan_cli.resolve(dcgan_cli.parse(["--config", str(config), "--out", str(tmp_path / "o")]))
    trainer = settings.trainer
    assert settings.args.batch_size == 16 and settings.args.explicit >= {"batch_size", "every_n_steps"}
    assert (trainer.channels_last, trainer.price_per_hour, trainer.checkpoints.every_n_steps) == (False, 2.5, 7)
    default = dcgan_cli.resolve(dcgan_cli.parse(["--out", str(tmp_path / "p")])).trainer
    assert default.channels_last == "auto" and default.checkpoints.every_n_steps == 1000  # the plugin's layout

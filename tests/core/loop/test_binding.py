"""`devplug.ConfigParser`: TrainerConfig and CheckpointPolicy bound to flags and to a TOML or JSON config file."""

from __future__ import annotations

import json

import pytest

import devplug
from devplug import CheckpointPolicy, ConfigParser, Flag, TrainerConfig


def _parser() -> ConfigParser:
    parser = ConfigParser("demo.py", description="a demo")
    parser.bind(TrainerConfig, ["device", "precision", "seed", "log_every", "strategy", "compile",
                                Flag("accumulate_grad_batches", "--accumulate")])
    parser.bind_checkpoints(save_every=100)
    parser.add_argument("--lr", type=ConfigParser.number(0, strict=True), default=0.1, help="the learning rate")
    return parser


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        _parser().parse(argv)
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("demo: error: "), lines
    return lines[0]


def test_flags_build_the_trainer_config_and_the_checkpoint_policy(tmp_path):
    parser = _parser()
    args = parser.parse(["--device", "cpu", "--log-every", "7", "--accumulate", "2", "--compile", "--seed", "3",
                         "--save-every", "5", "--keep-checkpoints", "0", "--strategy", "ddp"])
    policy = parser.build(CheckpointPolicy, args, directory=tmp_path / "ckpt")
    config = parser.build(TrainerConfig, args, log_dir=str(tmp_path), progress=False, checkpoints=policy)
    assert (config.device, config.log_every, config.accumulate_grad_batches, config.compile, config.seed,
            config.strategy, config.progress) == ("cpu", 7, 2, True, 3, "ddp", False)
    assert (policy.every_n_steps, policy.keep_last, policy.directory) == (5, None, str(tmp_path / "ckpt"))
    assert args.explicit == {"device", "log_every", "accumulate_grad_batches", "compile", "seed", "every_n_steps",
                             "keep_last", "strategy"}


def test_defaults_are_the_configs_own_unless_the_script_says_otherwise(tmp_path):
    parser = _parser()
    args = parser.parse([])
    config = parser.build(TrainerConfig, args)
    assert config == TrainerConfig()  # every bound field at the class's default
    assert parser.build(CheckpointPolicy, args, directory=tmp_path).every_n_steps == 100
    assert args.explicit == set()


@pytest.mark.parametrize(("argv", "needles"), [
    (["--log-every", "0"], ["argument --log-every: must be a positive integer, got 0"]),
    (["--log-every", "x"], ["--log-every", "'x'"]),
    (["--seed", "-1"], ["--seed", "from 0 to 9223372036854775807"]),
    (["--strategy", "pipeline"], ["--strategy: invalid choice: 'pipeline'"]),
    (["--lr", "nan"], ["--lr", "finite"]),
    (["--lr", "0"], ["--lr", "positive"]),
    (["--keep-checkpoints", "-1"], ["--keep-checkpoints", "an integer >= 0"]),
    (["--log-ev", "3"], ["unrecognized arguments: --log-ev"]),  # spelled out: no abbreviations
])
def test_a_bad_value_is_one_line_naming_the_flag(capsys, argv, needles):
    line = _error(capsys, argv)
    for needle in needles:
        assert needle in line, line


def test_help_documents_every_bound_flag_from_the_configs_docstrings():
    text = " ".join(_parser().format_help().split())
    assert "--log-every LOG_EVERY steps between log points, the only places values are read back from the device. " \
           "(default: 50)" in text
    assert "--compile, --no-compile" in text and "--save-every" in text and "--config FILE" in text
    assert "``" not in text


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_config_file_sets_values_and_the_command_line_wins(tmp_path, suffix):
    values = {"log-every": 10, "seed": 5, "compile": True, "save_every": 20, "lr": 0.5, "device": "cpu"}
    path = tmp_path / f"run{suffix}"
    path.write_text(json.dumps(values) if suffix == ".json" else
                    'log-every = 10\nseed = 5\ncompile = true\nsave_every = 20\nlr = 0.5\ndevice = "cpu"\n')
    parser = _parser()
    args = parser.parse(["--config", str(path), "--seed", "6"])
    config = parser.build(TrainerConfig, args)
    assert (config.log_every, config.seed, config.compile, config.device, args.lr) == (10, 6, True, "cpu", 0.5)
    assert parser.build(CheckpointPolicy, args, directory=tmp_path).every_n_steps == 20
    assert args.explicit == {"log_every", "seed", "compile", "every_n_steps", "lr", "device"}


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("True", True), ("off", False), ("auto", "auto")])
def test_a_field_of_true_false_or_a_word_takes_each_from_the_command_line(text, expected):
    parser = ConfigParser("demo.py")
    parser.bind(TrainerConfig, ["channels_last"])  # True, False or "auto"
    assert parser.build(TrainerConfig, parser.parse(["--channels-last", text])).channels_last == expected


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("false", False), ('"auto"', "auto")])
def test_a_field_of_true_false_or_a_word_takes_each_from_a_config_file(tmp_path, text, expected):
    path = tmp_path / "run.toml"
    path.write_text(f"channels-last = {text}\n")
    parser = ConfigParser("demo.py")
    parser.bind(TrainerConfig, ["channels_last"])
    assert parser.build(TrainerConfig, parser.parse(["--config", str(path)])).channels_last == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("no-eval = true\n", (True, True)),
    ("cpu-only = true\n", (False, False)),  # the flag given: its store_false destination turns False
    ("cpu-only = false\n", (False, True)),
])
def test_a_config_file_sets_the_scripts_own_switches(tmp_path, text, expected):
    # a script's own store_true flag whose name starts with "no-", and a store_false flag, as keys of the file
    path = tmp_path / "run.toml"
    path.write_text(text)
    parser = _parser()
    parser.add_argument("--no-eval", action="store_true", help="skip the evaluation")
    parser.add_argument("--cpu-only", dest="cuda", action="store_false", help="train on the CPU")
    args = parser.parse(["--config", str(path)])
    assert (args.no_eval, args.cuda) == expected


def test_a_config_file_gives_a_required_flag(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('data = "corpus.txt"\n')
    assert _parser_with_data().parse(["--config", str(path)]).data == "corpus.txt"
    with pytest.raises(SystemExit):  # given nowhere: still required
        _parser_with_data().parse([])
    assert "--data" in capsys.readouterr().err


def _parser_with_lists() -> ConfigParser:
    parser = _parser()
    parser.add_argument("--tag", action="append", help="a tag for the run (repeat the flag for more)")
    parser.add_argument("--layers", nargs="+", type=int, help="widths of the hidden layers")
    parser.add_argument("--size", nargs=2, type=int, help="height and width")
    parser.add_argument("--mode", nargs="*", choices=("a", "b"), default=[], help="modes")
    parser.add_argument("--depth", type=int, default=2, help="blocks")
    return parser


def test_a_config_file_gives_list_flags_their_lists(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('tag = ["gan", "cpu"]\nlayers = [64, 32]\nsize = [48, 64]\nmode = "b"\n')
    args = _parser_with_lists().parse(["--config", str(path)])
    assert (args.tag, args.layers, args.size, args.mode) == (["gan", "cpu"], [64, 32], [48, 64], ["b"])
    # the command line replaces the file's list, also for a flag that appends
    args = _parser_with_lists().parse(["--config", str(path), "--tag", "run2", "--layers", "8"])
    assert (args.tag, args.layers) == (["run2"], [8])
    assert {"tag", "layers", "size", "mode"} <= args.explicit


@pytest.mark.parametrize(("text", "needle"), [
    ("size = [48]\n", "size takes 2 values, got [48]"),
    ("layers = []\n", "layers takes values, got []"),
    ("layers = [64, 'wide']\n", "layers (--layers) invalid int value: 'wide'"),
    ("mode = ['c']\n", "mode must be one of a, b, got 'c'"),
    ("tag = [['nested']]\n", "tag must be a string or a number, got ['nested']"),
    ("depth = 'deep'\n", "depth (--depth) invalid int value: 'deep'"),  # a plain type: no traceback either
])
def test_a_bad_list_in_a_config_file_is_one_line(tmp_path, capsys, text, needle):
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exited:
        _parser_with_lists().parse(["--config", str(path)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and needle in err and "Traceback" not in err, err


def _parser_with_data() -> ConfigParser:
    parser = _parser()
    parser.add_argument("--data", required=True, help="the training text")
    return parser


@pytest.mark.parametrize(("text", "needles"), [
    ("log-every = 0\n", ["log-every (--log-every) must be a positive integer, got 0"]),
    ("colour = 'red'\n", ["unknown key 'colour'", "log-every"]),
    ("compile = 'yes'\n", ["compile must be true or false"]),
    ("strategy = 'pipeline'\n", ["strategy must be one of auto, ddp, fsdp, tp, fsdp+tp, got 'pipeline'"]),
    ("log-every = [1, 2]\n", ["log-every must be a string or a number"]),
    ("log-every = \n", ["is not valid TOML"]),
])
def test_a_bad_config_file_is_one_line(tmp_path, capsys, text, needles):
    path = tmp_path / "run.toml"
    path.write_text(text)
    line = _error(capsys, ["--config", str(path)])
    for needle in [str(path), *needles]:
        assert needle in line, line


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    assert "cannot be read" in _error(capsys, ["--config", str(tmp_path / "nope.toml")])


def test_the_run_folder_resolves_out_resume_and_auto_resume(tmp_path):
    parser = ConfigParser("demo.py")
    parser.add_run_arguments(runs=str(tmp_path / "runs"))
    fresh = parser.run_folder(parser.parse([]))
    assert fresh.out.parent == tmp_path / "runs" and fresh.resume is None and not fresh.auto_resume
    (tmp_path / "old" / "checkpoints").mkdir(parents=True)
    with pytest.raises(devplug.CheckpointError, match="no checkpoint"):
        parser.run_folder(parser.parse(["--resume", str(tmp_path / "old")]))
    (tmp_path / "old" / "checkpoints" / "step_0000004.pt").write_bytes(b"")
    resumed = parser.run_folder(parser.parse(["--resume", str(tmp_path / "old")]))
    assert (resumed.out, resumed.resume) == (tmp_path / "old", tmp_path / "old" / "checkpoints")
    with pytest.raises(devplug.ConfigError, match="--auto-resume needs --out"):
        parser.run_folder(parser.parse(["--auto-resume"]))
    with pytest.raises(devplug.ConfigError, match="contradict"):
        parser.run_folder(parser.parse(["--auto-resume", "--out", "x", "--resume", str(tmp_path / "old")]))
    with pytest.raises(devplug.CheckpointError, match="does not exist"):
        parser.run_folder(parser.parse(["--resume", str(tmp_path / "missing")]))


def test_run_reports_bad_input_in_one_line_and_interrupts_with_130(capsys):
    parser = ConfigParser("demo.py")

    def bad(_args):
        raise devplug.DataError("no images in\nthe folder")

    def interrupted(_args):
        raise KeyboardInterrupt

    assert parser.run(bad, []) == 2
    assert capsys.readouterr().err == "demo: error: no images in the folder\n"
    assert parser.run(interrupted, []) == 130
    assert capsys.readouterr().err == "demo: interrupted\n"
    assert parser.run(lambda args: 0, []) == 0


def test_run_as_script_keeps_the_collector_off_what_outlives_it():
    # what the script imported (torch: millions of objects) and what is left when main returns (the process
    # ends) are frozen: full collections and the collections at exit no longer sweep them (about a second of CPU)
    import subprocess
    import sys

    script = """
import atexit, gc, devplug
at_start = []
def main():
    at_start.append(gc.get_freeze_count())
    print("frozen at start", at_start[0] > 0, flush=True)
    main.kept = [[i] for i in range(1000)]  # made by main, alive when it returns
    return 3
atexit.register(lambda: print("main's objects frozen", gc.get_freeze_count() >= at_start[0] + 900))
devplug.ConfigParser.run_as_script(main)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["frozen at start True", "main's objects frozen True"], done.stdout

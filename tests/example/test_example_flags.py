"""Flags of the examples that a user combines wrongly or whose printed advice must work as printed."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from dcgan_runs import run as dcgan_run
from dcgan_runs import write_images
from paths import REPO

from dcgan import train as dcgan_example  # examples/dcgan/train.py
from lm import train as lm_example  # examples/lm/train.py


@pytest.mark.parametrize("strategy", [[], ["--strategy", "ddp"], ["--strategy", "fsdp"]])
def test_lm_tp_without_a_tensor_parallel_strategy_is_one_line_not_ignored(tmp_path, capsys, strategy):
    code = lm_example.main(["--device", "cpu", "--tp", "2", *strategy, "--steps", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("lm: error: --tp 2 splits layers only under --strategy tp or fsdp+tp"), err
    assert not (tmp_path / "o").exists()


def test_the_dcgan_summarys_tensorboard_command_works_pasted_into_a_shell(tmp_path, capsys):
    out = tmp_path / "my run's folder"
    assert dcgan_run(["--data", "fake", "--steps", "1", "--out", str(out)]) == 0
    command = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("tensorboard "))
    assert shlex.split(command.strip())[1:] == ["tensorboard", "--logdir", str(out / "tensorboard")], command
    assert (out / "tensorboard").is_dir()


@pytest.mark.parametrize(("example", "flag"), [("dcgan", "--out"), ("dcgan", "--resume"), ("dcgan", "--cache-dir"),
                                               ("lm", "--out"), ("lm", "--consolidate")])
def test_an_empty_path_is_one_line_not_the_current_folder(tmp_path, monkeypatch, capsys, example, flag):
    """``--out "$OUT"`` with OUT unset: an error, not a run (or a resume) in the folder the user stands in."""
    monkeypatch.chdir(tmp_path)
    main = dcgan_example.main if example == "dcgan" else lm_example.main
    with pytest.raises(SystemExit) as stopped:
        main(["--device", "cpu", "--steps", "1", flag, ""])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{example}: error: argument {flag}: must be a path, got empty"), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [["--sample-every", "0"], ["--epochs", "-1"]])
def test_the_minimal_example_refuses_counts_below_one(tmp_path, argv):
    """``--sample-every 0`` was a division by zero after the first step; ``--epochs -1`` a run that trained nothing."""
    result = subprocess.run([sys.executable, str(REPO / "examples" / "dcgan" / "minimal.py"), "--device", "cpu",
                             *argv, "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    last = lines[0]
    assert last == f"minimal.py: error: {argv[0]} must be a positive integer, got {argv[1]}", last
    assert not (tmp_path / "run").exists()


def test_ctrl_c_before_the_first_dcgan_step_leaves_no_empty_run_folder(tmp_path, monkeypatch, capsys):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the data is being prepared

    monkeypatch.setattr(dcgan_example, "load_training_data", interrupted)
    assert dcgan_run(["--data", "fake", "--steps", "1", "--out", str(tmp_path / "run")]) == 130
    assert capsys.readouterr().err.endswith("dcgan: interrupted\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("target", ["run/checkpoints/step_0000002.pt", "run/checkpoints/final.pt",
                                    "elsewhere/step_0000300.pt"])
def test_lm_consolidate_never_writes_over_or_among_checkpoints(tmp_path, capsys, target):
    """Before: ``--consolidate OUT/checkpoints/step_0000002.pt`` replaced the run's last checkpoint with plain weights,
    and the next --auto-resume found none it could use."""
    code = lm_example.main(["--device", "cpu", "--steps", "2", "--out", str(tmp_path / "run"),
                            "--consolidate", str(tmp_path / target)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--consolidate" in err and "name a file outside" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("inside", ["run", "."])
def test_a_dcgan_out_inside_the_data_folder_is_refused(tmp_path, capsys, inside):
    """Before: the run's sample grids (PNG files) were written into the image folder, and the next run trained on
    them too (3000 images became 3001 after one run, silently)."""
    images = tmp_path / "images"
    write_images(images, 10)
    before = sorted(p.relative_to(images) for p in images.rglob("*"))
    code = dcgan_run(["--data", str(images), "--steps", "1", "--cache-dir", str(tmp_path / "cache"),
                      "--out", str(images / inside)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is inside --data" in err, err
    assert sorted(p.relative_to(images) for p in images.rglob("*")) == before

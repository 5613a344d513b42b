"""The DCGAN example on bad input: one clear ``dcgan: error:`` line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dcgan_runs import TINY, write_images
from paths import REPO

from dcgan import train as example  # examples/dcgan/train.py

SCRIPT = REPO / "examples" / "dcgan.py"


def fails_with(capsys, argv: list[str], *needles: str) -> str:
    """Run in-process; assert status 2 and exactly one stderr line that contains every needle."""
    status = example.main([*TINY, "--steps", "2", *argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("dcgan: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_missing_data_folder(tmp_path, capsys):
    fails_with(capsys, ["--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "does not exist")


def test_empty_data_folder(tmp_path, capsys):
    (tmp_path / "empty" / "class_a").mkdir(parents=True)
    fails_with(capsys, ["--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], "holds no images")


def test_data_path_is_a_file(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    fails_with(capsys, ["--data", str(tmp_path / "file.txt"), "--out", str(tmp_path / "o")], "not a folder")


def test_no_readable_image(tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    for name in ("a.jpg", "b.png", "c.jpeg"):
        (folder / name).write_bytes(b"garbage")
    fails_with(capsys, ["--data", str(folder), "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "o")],
               "none of the 3 images", "can be read")
    assert not list((tmp_path / "cache").glob("*.npy"))  # no half-built cache left behind


def test_fewer_images_than_one_batch(tmp_path, capsys):
    write_images(tmp_path / "few", 3)
    fails_with(capsys, ["--data", str(tmp_path / "few"), "--cache-dir", str(tmp_path / "cache"),
                        "--out", str(tmp_path / "o")], "fewer than one batch")


#: Another process takes a folder's lock at once, or fails (BlockingIOError) while someone holds it.
TAKE_FOLDER_LOCK = ("import fcntl, os, sys; "
                    "fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)")


def test_a_run_stopped_by_bad_input_lets_go_of_its_folder(tmp_path, capsys):
    """The Trainer was made before the data check failed: its run lock on a run folder that stays (it held
    checkpoints before) is let go when main returns, not when this process ends."""
    write_images(tmp_path / "few", 3)
    (tmp_path / "o" / "checkpoints").mkdir(parents=True)
    fails_with(capsys, ["--data", str(tmp_path / "few"), "--cache-dir", str(tmp_path / "cache"),
                        "--out", str(tmp_path / "o")], "fewer than one batch")
    probe = subprocess.run([sys.executable, "-c", TAKE_FOLDER_LOCK, str(tmp_path / "o" / "checkpoints")],
                           capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr


@pytest.mark.parametrize("size", ["48", "8", "2048"])
def test_unsupported_image_size(tmp_path, capsys, size):
    fails_with(capsys, ["--image-size", size, "--out", str(tmp_path / "o")], f"image size {size} is not supported")


def test_unknown_device(tmp_path, capsys):
    fails_with(capsys, ["--device", "tpu9", "--out", str(tmp_path / "o")], "unknown device 'tpu9'", "cpu")


def test_unavailable_device(tmp_path, capsys):
    fails_with(capsys, ["--device", "cpu:5", "--out", str(tmp_path / "o")], "cpu:5")


def test_unavailable_device_from_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DEVPLUG_DEVICE", "tpu9")
    status = example.main(["--no-progress", "--steps", "1", "--out", str(tmp_path / "o")])
    assert status == 2 and "unknown device 'tpu9'" in capsys.readouterr().err


def test_missing_checkpoint(tmp_path, capsys):
    fails_with(capsys, ["--resume", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "o")], "does not exist")


def test_run_folder_without_checkpoints(tmp_path, capsys):
    fails_with(capsys, ["--resume", str(tmp_path), "--out", str(tmp_path / "o")], "no checkpoint")


def test_corrupt_checkpoint(tmp_path, capsys):
    bad = tmp_path / "step_0000001.pt"
    bad.write_bytes(b"\x00garbage" * 100)
    fails_with(capsys, ["--resume", str(bad), "--out", str(tmp_path / "o")], "is not a checkpoint")


def test_checkpoint_of_another_model(tmp_path, capsys):
    assert example.main([*TINY, "--steps", "1", "--out", str(tmp_path / "small")]) == 0
    capsys.readouterr()
    checkpoint = tmp_path / "small" / "checkpoints" / "step_0000001.pt"
    line = fails_with(capsys, ["--ngf", "8", "--resume", str(checkpoint), "--out", str(tmp_path / "o")],
                      "does not match", "--ngf")
    assert "shape" in line


def test_bad_flag_values_are_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as info:
        example.main(["--batch-size", "0"])
    assert info.value.code == 2 and "--batch-size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--data", "/nonexistent/images"], "does not exist"),
        (["--device", "cuda:7"], "cuda"),
        (["--resume", "CORRUPT"], "not a checkpoint"),
    ],
)
def test_real_script_prints_one_line_and_no_traceback(tmp_path, argv, needle):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    argv = [str(corrupt) if a == "CORRUPT" else a for a in argv]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, "--steps", "1", "--out", str(tmp_path / "o"), *argv],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcgan: error: ") and needle in lines[0], result.stderr

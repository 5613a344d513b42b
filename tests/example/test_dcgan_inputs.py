"""The DCGAN example checks every input before the first training step: one ``dcgan: error:`` line, status 2.

Each bad input is run in-process with the training step replaced by one that fails the test, so "before
the first step" is checked, not assumed; a few also run through the real script (no traceback). Data
faults that are not bad input (a decompression bomb, a file name that is not UTF-8) must not stop a run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from dcgan_runs import TINY, write_images
from image_samples import decompression_bomb, latin1_names
from paths import REPO

from dcgan import checks
from dcgan import train as example  # examples/dcgan/train.py
from dcgan.step import DCGANStep

SCRIPT = REPO / "examples" / "dcgan.py"


@pytest.fixture
def no_step(monkeypatch):
    """Fail the test if a training step runs."""

    def step(self, real):
        raise AssertionError("a training step ran before the bad input was reported")

    monkeypatch.setattr(DCGANStep, "__call__", step)


def bad_input(capsys, argv: list[str], *needles: str) -> str:
    """Run the example in-process; assert status 2 and one ``dcgan: error:`` line holding every needle."""
    try:
        status = example.main([*TINY, "--steps", "2", *argv])
    except SystemExit as exc:  # argparse
        status = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("dcgan: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---- --out ------------------------------------------------------------------------------------------


def test_out_is_a_file(tmp_path, capsys, no_step):
    (tmp_path / "file").write_text("x")
    bad_input(capsys, ["--out", str(tmp_path / "file")], "--out", "is a file, not a folder")


def test_every_rank_checks_the_shared_out_at_once(tmp_path):
    """Under torchrun every process checks --out at the same moment: one rank's probe file, present for that
    moment, must not make another rank's check fail ("it exists and is not a folder")."""
    out = tmp_path / "run"
    checks.prepare_output_dir(out)
    names = set()
    real_open = os.open

    def open_and_note(path, flags, mode=0o777, **kwargs):
        names.add(os.path.basename(path))
        return real_open(path, flags, mode, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checks.os, "open", open_and_note)
        checks.prepare_output_dir(out)
    for name in names:  # another rank's probe, there at the instant this process probes
        (out / name).write_bytes(b"")
        (out / "checkpoints" / name).write_bytes(b"")
    pid = os.fork()
    if pid == 0:  # the other rank: a process of its own
        try:
            checks.prepare_output_dir(out)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_out_is_below_a_file(tmp_path, capsys, no_step):
    (tmp_path / "file").write_text("x")
    bad_input(capsys, ["--out", str(tmp_path / "file" / "run")], "is below", "which is a file")


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write in: a read-only tmpfs as root, else a folder without write permission."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = os.geteuid() == 0 and shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True).returncode == 0
    if not mounted:
        folder.chmod(0o555)
        if os.access(folder, os.W_OK):
            pytest.skip("cannot make a folder read-only here")
    yield folder
    if mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
    else:
        folder.chmod(0o755)


def test_out_in_a_read_only_folder(read_only_folder, capsys, no_step):
    line = bad_input(capsys, ["--out", str(read_only_folder / "run")], "--out", "cannot be written")
    assert "read-only" in line or "permission denied" in line


def test_out_with_a_name_longer_than_the_file_system_allows(tmp_path, capsys, no_step):
    bad_input(capsys, ["--out", str(tmp_path / ("n" * 300))], "a name in it is 300 bytes long", "(255)")


def test_out_with_a_path_longer_than_the_file_system_allows(tmp_path, capsys, no_step):
    deep = tmp_path.joinpath(*["d" * 200] * 21)
    bad_input(capsys, ["--out", str(deep)], "the path is too long for the file system")
    assert not (tmp_path / ("d" * 200)).exists()  # the folders made while checking were removed


# ---- numbers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--seed", "1e25"], ["--seed", "from 0 to 9223372036854775807", "'1e25'"]),
        (["--seed", str(2**64)], ["--seed", "from 0 to"]),
        (["--seed", "-1"], ["--seed", "from 0 to"]),
        (["--lr", "inf"], ["--lr", "finite"]),
        (["--lr", "nan"], ["--lr", "finite"]),
        (["--lr", "0"], ["--lr", "positive"]),
        (["--lr", "fast"], ["--lr", "must be a number"]),
        (["--price-per-hour", "inf"], ["--price-per-hour", "finite"]),
        (["--beta1", "nan"], ["--beta1", "finite"]),
        (["--batch-size", "0"], ["--batch-size", "positive integer"]),
        (["--workers", "100000"], ["--workers", "from 0 to"]),
    ],
)
def test_out_of_range_numbers(tmp_path, capsys, no_step, argv, needles):
    bad_input(capsys, [*argv, "--out", str(tmp_path / "o")], *needles)
    assert not (tmp_path / "o").exists()


def test_a_generator_too_wide_for_memory_fails_before_it_is_built(tmp_path, capsys, no_step):
    line = bad_input(capsys, ["--ngf", "30000", "--out", str(tmp_path / "o")], "the model is too large", "--ngf")
    assert "ngf 30000" in line and "parameters" in line
    assert not (tmp_path / "o").exists()


def test_a_batch_too_large_for_memory_fails_before_the_first_step(tmp_path, capsys, no_step):
    bad_input(capsys, ["--batch-size", str(10**12), "--out", str(tmp_path / "o")], "too large to train",
              "--batch-size")


def test_the_largest_seed_trains(tmp_path):
    assert example.main([*TINY, "--steps", "3", "--seed", str(2**63 - 1), "--data", "fake", "--batch-size", "4",
                       "--out", str(tmp_path / "o")]) == 0


# ---- --data -----------------------------------------------------------------------------------------


def test_empty_data_path_is_not_the_current_directory(tmp_path, capsys, no_step, monkeypatch):
    write_images(tmp_path / "cwd", 10)
    monkeypatch.chdir(tmp_path / "cwd")
    bad_input(capsys, ["--data", "", "--out", str(tmp_path / "o")], "--data is empty")


def test_a_decompression_bomb_does_not_stop_a_no_cache_run(tmp_path, caplog):
    folder = tmp_path / "images"
    write_images(folder, 8, classes=False)
    decompression_bomb(folder / "huge.png")
    with caplog.at_level("WARNING", logger="devplug.core.data.torch_loader"):
        assert example.main([*TINY, "--data", str(folder), "--no-cache", "--batch-size", "9", "--steps", "2",
                           "--out", str(tmp_path / "run")]) == 0
    assert any("huge.png" in r.getMessage() and "MAX_IMAGE_PIXELS" in r.getMessage() for r in caplog.records)


def test_a_latin1_file_name_trains_and_prints_readably(tmp_path, capsys):
    folder = tmp_path / "images"
    latin1_names(folder)
    write_images(folder, 6, classes=False)
    assert example.main([*TINY, "--data", str(folder), "--cache-dir", str(tmp_path / "cache"), "--steps", "1",
                       "--out", str(tmp_path / "run")]) == 0
    assert "(first: d\\xe9j\\xe0.jpg:" in capsys.readouterr().out


# ---- through the real script ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["--out", "FILE"], "is a file"), (["--seed", "1e25"], "--seed"), (["--ngf", "30000"], "too large")],
)
def test_real_script_reports_bad_input_in_one_line(tmp_path, argv, needle):
    (tmp_path / "file").write_text("x")
    argv = [str(tmp_path / "file") if a == "FILE" else a for a in argv]
    result = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--steps", "1", "--out", str(tmp_path / "o"), *argv],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcgan: error: ") and needle in lines[0], result.stderr
    assert not (tmp_path / "o").exists()


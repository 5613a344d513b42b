"""The LM example's checks before it spends anything: a model too large for the memory, a --consolidate file
that cannot be written, a --resume folder that has no checkpoint or cannot be written: each one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import devplug

from lm import memory
from lm import train as example
from lm.models import ModelSpec

TINY = ["--device", "cpu", "--precision", "32-true", "--workers", "0", "--width", "32", "--layers", "1",
        "--heads", "2", "--context", "16", "--batch-size", "8", "--corpus-mb", "0.5", "--eval-batches", "4",
        "--sample-bytes", "8", "--keep-checkpoints", "0"]


def run(*argv: str) -> int:
    return example.main([*TINY, *argv])


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lm: error: "), err
    return err[0]


def test_a_model_too_large_for_the_host_is_one_line_before_anything_is_allocated(tmp_path, capsys):
    assert run("--width", "1000000", "--steps", "1", "--out", str(tmp_path / "run")) == 2
    line = _error(capsys)
    assert "the model is too large to build" in line and "--width 1000000" in line and "lower --width" in line
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []


def test_a_model_too_large_for_the_device_names_what_it_needs():
    spec = ModelSpec(width=512, layers=8, heads=8, context=256)
    params = memory.parameter_count(spec)
    assert params > 25_000_000
    with pytest.raises(devplug.ConfigError, match=r"too large to train: .* and the device has 100\.0 MB"):
        memory.check_memory(spec, 64, shards=1, device_total=100_000_000, host_available=10**12)
    memory.check_memory(spec, 64, shards=1, device_total=10**11, host_available=10**12)  # fits: no error


def test_a_consolidate_file_that_cannot_be_written_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / "run"
    assert run("--steps", "2", "--out", str(out), "--consolidate", str(tmp_path / "a-file" / "w.pt")) == 2
    line = _error(capsys)
    assert "--consolidate" in line and "cannot be written" in line and "a-file" in line
    assert list((out / "checkpoints").iterdir()) == []  # refused before the first step


def _read_only(monkeypatch) -> None:
    """The folders' write probes fail from now on as on a read-only file system (as root, permissions would not)."""
    real = Path.write_bytes

    def write_bytes(self, data):
        if self.name.startswith(".lm-probe"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)


def test_resuming_a_folder_without_checkpoints_says_so_and_not_something_about_out(tmp_path, capsys, monkeypatch):
    _read_only(monkeypatch)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert run("--steps", "2", "--resume", str(tmp_path / "run")) == 2
    line = _error(capsys)
    assert "no checkpoint (step_*.pt)" in line and "to resume from" in line and "--out" not in line


def test_resuming_a_read_only_run_folder_says_to_pass_out(tmp_path, capsys, monkeypatch):
    assert run("--steps", "2", "--out", str(tmp_path / "run")) == 0
    capsys.readouterr()
    _read_only(monkeypatch)
    assert run("--steps", "3", "--resume", str(tmp_path / "run")) == 2
    line = _error(capsys)
    assert "the resumed run's folder" in line and "pass --out" in line and "Read-only file system" in line


class _Creates:
    """A pickle that creates the file ``marker`` when loaded (standing in for any command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_resume_from_a_sharded_checkpoint_with_a_crafted_metadata_file_is_refused_and_runs_nothing(tmp_path,
                                                                                                   capsys):
    import pickle

    from devplug.core.checkpoint.manifest import write_manifest

    out, marker = tmp_path / "run", tmp_path / "ran"
    assert run("--steps", "2", "--eval-every", "0", "--strategy", "fsdp", "--out", str(out)) == 0
    capsys.readouterr()
    folder = out / "checkpoints" / "step_0000002.pt"
    (folder / ".metadata").write_bytes(pickle.dumps(_Creates(marker)))
    write_manifest(folder)  # whoever crafted it rewrote the manifest too
    assert run("--steps", "4", "--eval-every", "0", "--resume", str(folder), "--out", str(tmp_path / "again")) == 2
    line = _error(capsys)
    assert "not plain checkpoint metadata" in line and "nothing in it was run" in line
    assert not marker.exists()

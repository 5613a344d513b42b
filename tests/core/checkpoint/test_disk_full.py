"""A full disk at each write is one line and loses nothing: a plain save running out mid-file, a sharded save, an
asynchronous sharded save (in the background, or on a disk full before it began), a logger and a sample image.
The previous checkpoint stays intact, no temporary file or staging folder is left, a logger or image that
cannot be written is one warning and training goes on. The full disk is simulated by writes that fail with
ENOSPC part-way, as a real one does."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
import torch
from dist_scripts.fsdp_model import Block, lm_loss, make_lm, rank_batch

import devplug
from devplug.core.checkpoint import sharded
from devplug.core.checkpoint.diskfull import disk_full_cause
from devplug.core.checkpoint.policy import INDEX_NAME, RunCheckpoints
from devplug.core.errors import CheckpointError

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FillsUp:
    """A binary file that takes ``room`` bytes, then fails like a full disk."""

    def __init__(self, handle, room: int) -> None:
        self._handle, self._room = handle, room

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self._room:
            self._handle.write(data[: self._room])
            self._room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._handle.write(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _plain_trainer(folder: Path, **options) -> tuple[devplug.Trainer, torch.nn.Module, torch.optim.Optimizer]:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              checkpoints=devplug.CheckpointPolicy(directory=folder), **options)
    model = trainer.setup(torch.nn.Linear(64, 64), name="m")
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-3)
    return trainer, model, opt


def test_a_plain_save_that_runs_out_of_space_mid_file_is_one_line_and_keeps_the_previous(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    trainer, _model, _opt = _plain_trainer(folder)
    trainer._position.global_step = 1
    previous = Path(trainer.checkpoint_now())
    kept = previous.read_bytes()
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: _FillsUp(real_fdopen(fd, mode, *a, **k), 5000))
    trainer._position.global_step = 2
    with pytest.raises(CheckpointError) as info:
        trainer.checkpoint_now()
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and message.startswith("the disk is full: could not write")
    assert "step_0000002.pt" in message and f"the previous checkpoint {previous} is intact" in message
    assert _names(folder) == ["step_0000001.pt"] and previous.read_bytes() == kept  # no temporary file left


def test_a_full_disk_at_the_checkpoint_index_is_the_same_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    runs = RunCheckpoints(devplug.CheckpointPolicy(directory=folder, monitor="loss"))
    runs.save(1, lambda path: path.write_bytes(b"checkpoint 1"), 0.5)
    index = (folder / INDEX_NAME).read_text()
    real_fdopen, real_write_text = os.fdopen, Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name.startswith(f".{INDEX_NAME}."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write_text(self, *args, **kwargs)

    # whichever way the index is written, its temporary file takes a few bytes and the disk is full
    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: _FillsUp(real_fdopen(fd, mode, *a, **k), 4))
    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(CheckpointError) as info:
        runs.save(2, lambda path: path.write_bytes(b"checkpoint 2"), 0.25)
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and message.startswith("the disk is full: could not write")
    assert str(folder / INDEX_NAME) in message and "free some space" in message
    assert _names(folder) == [INDEX_NAME, "step_0000001.pt", "step_0000002.pt"]  # no temporary file left
    assert (folder / INDEX_NAME).read_text() == index  # the previous index, whole


def test_torchs_zip_writer_hides_the_full_disk_in_its_context():
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 10432 vs 10384") from None
    except RuntimeError as exc:
        hidden = exc
    hidden.__context__ = ENOSPC
    assert disk_full_cause(hidden) is ENOSPC
    assert disk_full_cause(RuntimeError("something else")) is None


def _sharded_trainer(folder: Path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, strategy="fsdp",
                              checkpoints=devplug.CheckpointPolicy(directory=folder))
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    trainer.backward(lm_loss(model, rank_batch(0, 0, 1)))
    trainer.step(opt)
    return trainer


def _fail_shard_writes(monkeypatch):
    from torch.distributed.checkpoint import filesystem

    real = filesystem._write_item

    def write_item(transforms, stream, data, *args, **kwargs):
        stream.write(b"half a shard")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(filesystem, "_write_item", write_item)
    return real


def test_a_sharded_save_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    trainer = _sharded_trainer(folder)
    trainer._position.global_step = 1
    previous = Path(trainer.checkpoint_now())
    _fail_shard_writes(monkeypatch)
    trainer._position.global_step = 2
    with pytest.raises(CheckpointError) as info:
        trainer.checkpoint_now()
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and message.startswith("the disk is full: could not write")
    assert f"the previous checkpoint {previous} is intact" in message
    assert _names(folder) == ["step_0000001.pt"] and sharded.is_sharded_checkpoint(previous)
    sharded.check_sharded(previous)


def test_an_asynchronous_sharded_save_on_a_full_disk_is_one_line_at_close(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    trainer = _sharded_trainer(folder)
    trainer.save(folder / "step_0000001.pt", async_save=True)
    trainer._keeper.writer.wait()
    _fail_shard_writes(monkeypatch)
    trainer.save(folder / "step_0000002.pt", async_save=True)
    with pytest.raises(CheckpointError) as info:
        trainer.close()
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and message.startswith("the disk is full") and "Traceback" not in message
    assert _names(folder) == ["step_0000001.pt"]
    sharded.check_sharded(folder / "step_0000001.pt")


def test_an_asynchronous_sharded_save_on_a_disk_already_full_is_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    trainer = _sharded_trainer(folder)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sharded.ckpt, "atomic_save", full)
    with pytest.raises(CheckpointError, match=r"^the disk is full") as info:
        trainer.save(folder / "step_0000001.pt", async_save=True)
    assert "\n" not in str(info.value)
    assert _names(folder) == []  # no staging folder left


class _FullDiskLogger:
    def __init__(self) -> None:
        self.calls = 0

    def devplug_log(self, point) -> None:
        self.calls += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_logger_or_image_on_a_full_disk_is_one_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    from devplug.core.observe import grid

    full = _FullDiskLogger()
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[full], log_every=1)
    model = trainer.setup(torch.nn.Linear(4, 1), name="m")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader([torch.ones(4) for _ in range(8)], 2)

    def half_a_png(tensor, handle):
        handle.write(b"\x89PNG half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(grid, "write_png", half_a_png)
    with caplog.at_level(logging.WARNING, logger="devplug"):
        for _ in trainer.epochs(2):
            for x in loader:
                loss = model(x).pow(2).mean()
                trainer.backward(loss)
                trainer.step(opt)
                trainer.log(loss=loss)
                trainer.log_images("samples", torch.zeros(2, 3, 4, 4), path=str(tmp_path / "samples" / "a.png"))
        trainer.close()
    assert trainer.global_step == 8 and full.calls > 4
    warned = [r.getMessage() for r in caplog.records if "disk is full" in r.getMessage()]
    assert len(warned) == 2 and all("training goes on" in w and "\n" not in w for w in warned), warned
    assert _names(tmp_path / "samples") == []  # no 0-byte or half PNG, no temporary file


def _locked_elsewhere(folder: Path) -> bool:
    """True when the folder's run lock is held (a new open of it, as another job's, cannot take the flock)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_close_that_reports_a_failed_background_save_still_lets_go_of_the_folder(tmp_path, monkeypatch):
    """The failure is raised, but the run lock is released and the loggers closed all the same."""
    from devplug.core.checkpoint import runlock

    folder = tmp_path / "ckpt"
    trainer = _sharded_trainer(folder)
    assert _locked_elsewhere(folder)
    _fail_shard_writes(monkeypatch)
    trainer.save(folder / "step_0000001.pt", async_save=True)
    with pytest.raises(CheckpointError, match=r"^the disk is full"):
        trainer.close()
    monkeypatch.undo()
    assert str(folder.resolve()) not in runlock._HELD
    assert not _locked_elsewhere(folder)  # the next job may write the folder
    assert trainer._reporter.closed

"""TensorBoard images: the PNG the Trainer wrote goes into the event file as it is, with checksums computed in C."""

from __future__ import annotations

import random

import pytest
import torch

import devplug

pytest.importorskip("tensorboard")


def _images(log_dir) -> dict[tuple[int, str], bytes]:
    """Every image in the event files of ``log_dir``, read back by tensorboard (which checks each record's CRC)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    return {(e.step, tag): e.encoded_image_string for tag in events.Tags()["images"] for e in events.Images(tag)}


def test_the_board_shows_the_png_file_the_trainer_wrote_byte_for_byte(tmp_path):
    trainer = devplug.Trainer(device="cpu", log_dir=str(tmp_path / "tb"), progress=False)
    trainer.global_step = 3
    images = torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    trainer.log_images("samples", images, nrow=3, path=str(tmp_path / "grid.png"))
    trainer.log_images("no_file", images)  # no PNG written: encoded for the board alone, as before
    trainer.close()
    shown = _images(tmp_path / "tb")
    assert shown[(3, "samples")] == (tmp_path / "grid.png").read_bytes()  # one encoding, the same pixels
    assert shown[(3, "no_file")].startswith(b"\x89PNG")


def test_a_png_file_that_cannot_be_read_falls_back_to_encoding_the_grid(tmp_path, monkeypatch):
    from devplug.core.observe import tensorboard

    trainer = devplug.Trainer(device="cpu", log_dir=str(tmp_path / "tb"), progress=False)
    monkeypatch.setattr(tensorboard, "_read_png", lambda path: None)
    trainer.log_images("samples", torch.zeros(2, 3, 4, 4), path=str(tmp_path / "grid.png"))
    trainer.close()
    assert _images(tmp_path / "tb")[(0, "samples")].startswith(b"\x89PNG")


def test_record_checksums_are_tensorboards_own_computed_in_c(tmp_path):
    pytest.importorskip("google_crc32c")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as pure_python
    from tensorboard.summary.writer import record_writer

    trainer = devplug.Trainer(device="cpu", log_dir=str(tmp_path / "tb"), progress=False)
    trainer.log_images("samples", torch.zeros(2, 3, 4, 4))  # creates the writer
    trainer.close()
    native = record_writer.masked_crc32c
    assert native is not pure_python and getattr(native, "devplug_native", False)
    rng = random.Random(0)
    for size in (0, 1, 7, 8, 9, 63, 64, 1000, 4099):
        data = bytes(rng.getrandbits(8) for _ in range(size))
        assert native(data) == pure_python(data), size
    assert _images(tmp_path / "tb")  # tensorboard's reader checks every record against its own checksum


def test_without_google_crc32c_tensorboard_is_left_as_it_is(monkeypatch):
    import sys

    from tensorboard.summary.writer import record_writer

    from devplug.core.observe.event_checksums import use_native_record_checksums

    before = record_writer.masked_crc32c
    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # import fails
    monkeypatch.setattr(record_writer, "masked_crc32c", before)  # restored after the test either way
    if getattr(before, "devplug_native", False):  # replaced by an earlier test in this process
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as pure_python

        monkeypatch.setattr(record_writer, "masked_crc32c", pure_python)
    original = record_writer.masked_crc32c
    assert use_native_record_checksums() is False
    assert record_writer.masked_crc32c is original


def test_no_record_is_checksummed_in_python(tmp_path, monkeypatch):
    """Tensorboard's Python checksum takes ~85 ms for a 700 KB sample grid, on its writer thread with the GIL held."""
    pytest.importorskip("google_crc32c")
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    in_python = []
    pure_python = pywrap_tensorflow.crc_update
    monkeypatch.setattr(pywrap_tensorflow, "crc_update", lambda crc, data: in_python.append(len(data))
                        or pure_python(crc, data))
    trainer = devplug.Trainer(device="cpu", log_dir=str(tmp_path / "tb"), log_every=1, progress=False)
    trainer.global_step = 1
    trainer.log(loss=torch.tensor(0.5))
    trainer.log_images("samples", torch.rand(16, 3, 32, 32) * 2 - 1, path=str(tmp_path / "grid.png"))
    trainer.close()
    assert in_python == []
    assert _images(tmp_path / "tb")

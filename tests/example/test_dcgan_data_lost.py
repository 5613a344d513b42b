"""Data gone mid-training: the images deleted under a --no-cache run stop it with one line naming the cause
(the worker's own reason, not torch's wrapped traceback) after the last finished step is saved; an image
cache truncated under a running reader is a one-line DataError, never SIGBUS."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch
from dcgan_runs import run, write_images
from torch.utils.data import DataLoader

import devplug

from dcgan.cache import prepare_cache


@pytest.mark.parametrize("workers", ["0", "2"])
def test_images_deleted_mid_run_stop_it_in_one_line_after_saving_the_last_step(tmp_path, monkeypatch, capsys,
                                                                                  workers):
    images = tmp_path / "images"
    write_images(images, 24)
    real_step = devplug.Trainer.step

    def step(self, *args, **kwargs):
        done = real_step(self, *args, **kwargs)
        if self.global_step == 2 and images.exists():
            shutil.rmtree(images)  # every image gone while the run goes on
        return done

    monkeypatch.setattr(devplug.Trainer, "step", step)
    out = tmp_path / "run"
    code = run(["--data", str(images), "--no-cache", "--workers", workers, "--steps", "40", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    line = err[0]
    match = re.search(r"the training data failed after step (\d+): .*No such file", line)
    assert match and "Traceback" not in line and "DataLoader worker" not in line, line
    assert f"step {match[1]} was saved first" in line
    assert (out / "checkpoints" / f"step_{int(match[1]):07d}.pt").is_file()


def test_an_image_cache_truncated_under_a_reader_is_one_line_not_sigbus(tmp_path):
    write_images(tmp_path / "images", 16, classes=False)
    dataset, _report = prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0)
    first = dataset[15][0].clone()
    assert first.shape == (3, 16, 16) and first.dtype == torch.uint8
    path = dataset.path
    with open(path, "r+b") as handle:  # another job truncates (rebuilds) the file
        handle.truncate(os.path.getsize(path) // 2)
    with pytest.raises(devplug.DataError, match="changed while this run was reading it") as info:
        dataset[15]
    assert "\n" not in str(info.value)
    loader = DataLoader(dataset, batch_size=4, num_workers=1)  # in a worker: torch's wrapping, one reason
    with pytest.raises(devplug.DataError) as wrapped:
        list(loader)
    from devplug.core.data.device_loader import data_lost_reason

    assert data_lost_reason(wrapped.value).startswith("the image cache")
    dataset.close()

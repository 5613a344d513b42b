"""Data sources: image folders, empty or missing folders, loader defaults."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

import devplug
from devplug.core.data import list_images
from devplug.core.errors import DataError


def write_images(root, n=6, size=(40, 30)):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        image = Image.new("RGB", size, (i * 40 % 256, 100, 200))
        image.save(root / f"img{i}.{'png' if i % 2 else 'jpg'}")


def test_missing_and_empty_folders_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        list_images(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(DataError, match="holds no images"):
        list_images(tmp_path / "empty")


def test_image_folder_layouts(tmp_path):
    write_images(tmp_path / "flat", 3)
    assert {label for _, label in list_images(tmp_path / "flat")} == {0}
    write_images(tmp_path / "classes" / "cats", 2)
    write_images(tmp_path / "classes" / "dogs", 2)
    assert sorted(label for _, label in list_images(tmp_path / "classes")) == [0, 0, 1, 1]


def test_image_folder_source_loads_normalized_batches_on_the_device(tmp_path):
    write_images(tmp_path / "imgs", 6)
    trainer = devplug.Trainer(device="cpu", progress=False)
    loader = trainer.dataloader(devplug.ImageFolderSource(str(tmp_path / "imgs"), image_size=16), batch_size=4,
                                num_workers=0)
    images, _labels = next(iter(loader))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32
    assert images.min() >= -1 and images.max() <= 1
    assert images.device == trainer.torch_device
    assert "torch DataLoader" in loader.implementation


def test_empty_dataset_and_bare_path_are_clear_errors(tmp_path):
    trainer = devplug.Trainer(device="cpu", progress=False)
    with pytest.raises(DataError, match="empty"):
        trainer.dataloader(torch.utils.data.TensorDataset(torch.zeros(0, 2)), batch_size=2)
    with pytest.raises(DataError, match="ImageFolderSource"):
        trainer.dataloader(str(tmp_path), batch_size=2)


def test_bad_loader_options_are_config_errors():
    trainer = devplug.Trainer(device="cpu", progress=False)
    with pytest.raises(devplug.ConfigError, match="batch_size"):
        trainer.dataloader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=0)


def test_nested_batches_move_to_the_device():
    trainer = devplug.Trainer(device="cpu", progress=False)
    batch = {"x": torch.ones(2), "meta": ["a", "b"], "pair": (torch.zeros(1), 3)}
    moved = trainer.to_device(batch)
    assert moved["meta"] == ["a", "b"] and moved["pair"][1] == 3
    assert moved["x"].device == trainer.torch_device

"""Data sources: image folders, empty or missing folders, loader defaults."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

import devplug
from devplug.core.data.torch_loader import list_images
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


def break_images(root):
    """Two files with image names that no decoder accepts: random bytes and a PNG cut in half."""
    (root / "garbage.jpg").write_bytes(b"this is not a JPEG at all" * 10)
    whole = (root / "img1.png").read_bytes()
    (root / "truncated.png").write_bytes(whole[: len(whole) // 2])
    return {str(root / "garbage.jpg"), str(root / "truncated.png")}


def test_unreadable_images_are_skipped_with_a_warning_naming_each_file(tmp_path, caplog):
    write_images(tmp_path / "imgs", 6)
    broken = break_images(tmp_path / "imgs")
    source = devplug.ImageFolderSource(str(tmp_path / "imgs"), image_size=16)
    dataset = devplug.core.data.torch_loader.ImageFolderDataset(source)
    assert len(dataset) == 8
    with caplog.at_level("WARNING", logger="devplug.core.data.torch_loader"):
        samples = [dataset[i] for i in range(len(dataset))]
        samples += [dataset[i] for i in range(len(dataset))]  # a second epoch warns no more
    assert all(image.shape == (3, 16, 16) for image, _ in samples)
    assert set(dataset.unreadable) == broken
    warned = [r.getMessage() for r in caplog.records if "unreadable image" in r.getMessage()]
    assert len(warned) == 2 and all(any(path in m for m in warned) for path in broken)
    # a skipped index yields the next readable image, not a blank
    order = [p.name for p, _ in dataset.items]
    after = order.index("garbage.jpg") + 1
    torch.testing.assert_close(dataset[order.index("garbage.jpg")][0], dataset[after][0])


def test_unreadable_images_raise_when_skipping_is_off_or_nothing_is_readable(tmp_path):
    write_images(tmp_path / "imgs", 2)
    break_images(tmp_path / "imgs")
    strict = devplug.ImageFolderSource(str(tmp_path / "imgs"), image_size=16, skip_unreadable=False)
    trainer = devplug.Trainer(device="cpu", progress=False)
    loader = trainer.dataloader(strict, batch_size=4, num_workers=0)
    with pytest.raises(DataError, match=r"cannot decode image .*garbage\.jpg.*skip_unreadable"):
        list(loader)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.jpg").write_bytes(b"no")
    (tmp_path / "bad" / "b.png").write_bytes(b"no")
    source = devplug.ImageFolderSource(str(tmp_path / "bad"), image_size=8)
    dataset = devplug.core.data.torch_loader.ImageFolderDataset(source)
    with pytest.raises(DataError, match="none of the 2 images"):
        dataset[0]


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


def test_a_training_loader_with_no_whole_batch_is_one_clear_line_not_an_epoch_of_nothing():
    trainer = devplug.Trainer(device="cpu", progress=False)
    dataset = torch.utils.data.TensorDataset(torch.randn(5, 3))
    with pytest.raises(devplug.DataError, match=r"no batch: 5 samples, fewer than batch_size=8 with drop_last=True; "
                                                r"lower batch_size or set drop_last=False"):
        trainer.dataloader(dataset, 8, drop_last=True)
    assert len(trainer.dataloader(dataset, 8)) == 1  # a partial batch is a batch
    assert len(trainer.dataloader(dataset, 8, drop_last=True, train=False)) == 0  # evaluation: may be empty


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8.0).view(8, 1))


@pytest.mark.parametrize("option", [{"shuffle": True}, {"sampler": [0, 1, 2]}])
def test_an_iterable_dataset_with_shuffle_or_a_sampler_is_the_authors_error_in_one_line(option):
    """An IterableDataset yields in its own order: shuffle and a sampler cannot apply (torch refuses them); the
    error is the author's option, not a fault of the device plugin."""
    trainer = devplug.Trainer(device="cpu", progress=False)
    with pytest.raises(devplug.ConfigError) as info:
        trainer.dataloader(_Stream(), batch_size=2, **option)
    message = str(info.value)
    assert "IterableDataset" in message and next(iter(option)) in message and "\n" not in message
    assert "plugin" not in message


@pytest.mark.parametrize(("option", "value"), [("prefetch_factor", 0), ("prefetch_factor", 2.5),
                                               ("batch_size", 2.5), ("batch_size", True)])
def test_a_loader_option_that_is_not_a_positive_integer_is_one_config_error_line(option, value):
    trainer = devplug.Trainer(device="cpu", progress=False)
    data = torch.utils.data.TensorDataset(torch.randn(16, 3))
    options = {"batch_size": 4, "num_workers": 2, option: value}
    with pytest.raises(devplug.ConfigError, match=rf"^invalid data loader option: {option} must be a positive integer"):
        next(iter(trainer.dataloader(data, **options)))

"""The CUDA plugin's DALI image-folder loader, run for real in DALI's CPU-only mode (``device_id=None``).

The same pipeline decodes on the GPU ("mixed") when given a device id; here it decodes on the CPU, which
needs no GPU. Batches are compared with the torch loader's (`devplug.core.data.torch_loader.ImageFolderDataset`).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from devplug.core.contract.records import Device, ImageFolderSource, LoaderOptions
from devplug.core.data.torch_loader import ImageFolderDataset, list_images
from devplug.core.errors import DataError
from devplug.plugins.cuda import dali
from devplug.plugins.cuda import plugin as cuda_plugin
from devplug.toolkit import forget_logged

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install nvidia-dali-cuda120)")

#: (height, width) of the test images: landscape, portrait, square, odd margins, up- and down-scaling.
SIZES = [(48, 64), (300, 200), (20, 15), (97, 53), (33, 80), (31, 31), (45, 66)]
IMAGE_SIZE = 32


def _picture(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth colour ramps with a ripple: real image content, not a flat colour."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    ripple = 127 + 100 * np.sin(x / (5 + seed) + y / 9)
    return np.stack([255 * x / width, 255 * y / height, ripple], -1).clip(0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two classes of real JPEGs of various sizes."""
    root = tmp_path_factory.mktemp("images")
    for label, name in enumerate(("cats", "dogs")):
        (root / name).mkdir()
        for i, (height, width) in enumerate(SIZES):
            Image.fromarray(_picture(height, width, seed=i + label)).save(root / name / f"{i:02d}.jpg", quality=95)
    return root


def test_dali_applies_exif_orientation_like_the_torch_loader(tmp_path):
    picture = _picture(48, 64, seed=0)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise when displayed
    Image.fromarray(picture).save(tmp_path / "rotated.jpg", quality=95, exif=exif)
    source = ImageFolderSource(str(tmp_path), image_size=IMAGE_SIZE)
    images, _ = next(iter(dali.build_dali_loader(source, LoaderOptions(batch_size=1), device_id=None).loader))
    difference = (images[0] - ImageFolderDataset(source)[0][0]).abs()
    assert difference.mean() < 0.005, float(difference.mean())


@pytest.fixture(scope="module")
def source(image_root: Path) -> ImageFolderSource:
    return ImageFolderSource(str(image_root), image_size=IMAGE_SIZE)


def cuda_device(**options) -> Device:
    return Device(spec=cuda_plugin.devplug_register_devices(), index=None, plugin_name="cuda", options=options)


def epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def test_dali_cpu_pipeline_matches_the_torch_loader(source):
    choice = dali.build_dali_loader(source, LoaderOptions(batch_size=4), device_id=None)
    assert choice.implementation.startswith("DALI ") and "CPU-only" in choice.implementation
    assert choice.on_device is False  # CPU-only mode: batches are on the host
    reference = ImageFolderDataset(source)
    batches = epoch(choice.loader)
    assert len(batches) == len(choice.loader) == 4  # 14 images in batches of 4, the last one short
    assert [b[0].shape[0] for b in batches] == [4, 4, 4, 2]
    images = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    assert images.shape == (14, 3, IMAGE_SIZE, IMAGE_SIZE) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.shape == (14,)
    assert images.min() >= -1.0 and images.max() <= 1.0
    expected = torch.stack([reference[i][0] for i in range(len(reference))])
    expected_labels = torch.tensor([reference[i][1] for i in range(len(reference))])
    assert torch.equal(labels, expected_labels)
    difference = (images - expected).abs()
    # Same geometry as torchvision's Resize/CenterCrop; what is left is JPEG decoder rounding and the
    # antialiasing filters of DALI and PIL (largest on the 10x downscale).
    assert difference.mean() < 0.005, float(difference.mean())
    assert difference.max() < 0.1, float(difference.max())


def test_dali_normalizes_with_the_source_mean_and_std(image_root):
    custom = ImageFolderSource(str(image_root), image_size=16, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    images, _ = next(iter(dali.build_dali_loader(custom, LoaderOptions(batch_size=3), device_id=None).loader))
    expected = torch.stack([ImageFolderDataset(custom)[i][0] for i in range(3)])
    std = torch.tensor(custom.std).view(1, 3, 1, 1)
    difference = (images - expected).abs() * std  # on the 0..1 pixel scale, as in the test above
    assert difference.mean() < 0.0025 and difference.max() < 0.05
    assert images.min() < -1.5 and images.max() > 1.5  # ImageNet statistics reach outside [-1, 1]


def test_channels_last_batches_are_nchw_views_of_nhwc_memory(source):
    plain = epoch(dali.build_dali_loader(source, LoaderOptions(batch_size=7), device_id=None).loader)
    choice = dali.build_dali_loader(source, LoaderOptions(batch_size=7), device_id=None, channels_last=True)
    for (images, labels), (expected, expected_labels) in zip(epoch(choice.loader), plain, strict=True):
        assert images.shape == expected.shape
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(images, expected) and torch.equal(labels, expected_labels)


def test_drop_last_drops_the_short_batch_every_epoch(source):
    loader = dali.build_dali_loader(source, LoaderOptions(batch_size=4, drop_last=True), device_id=None).loader
    assert len(loader) == 3
    for _ in range(3):
        assert [b[0].shape[0] for b in epoch(loader)] == [4, 4, 4]


def test_epochs_without_shuffle_repeat_and_with_shuffle_reorder_every_image_once(source):
    fixed = dali.build_dali_loader(source, LoaderOptions(batch_size=5), device_id=None).loader
    first, second = (torch.cat([b[0] for b in epoch(fixed)]) for _ in range(2))
    assert torch.equal(first, second)

    shuffled = dali.build_dali_loader(source, LoaderOptions(batch_size=5, shuffle=True, seed=3), device_id=None).loader
    orders = [torch.cat([b[0] for b in epoch(shuffled)]) for _ in range(2)]
    for order in orders:  # a permutation of the same 14 images
        assert order.shape[0] == 14
        assert sorted(order.sum(dim=(1, 2, 3)).tolist()) == pytest.approx(sorted(first.sum(dim=(1, 2, 3)).tolist()))
    assert not torch.equal(orders[0], first) or not torch.equal(orders[1], first)
    assert not torch.equal(orders[0], orders[1])


def test_ranks_get_disjoint_equal_shards_like_distributed_sampler(source):
    items = list_images(source.root)
    for drop_last, per_rank in ((False, 5), (True, 4)):
        seen = []
        for rank in range(3):
            options = LoaderOptions(batch_size=2, rank=rank, world_size=3, drop_last=drop_last)
            shard = dali.shard_items(items, options)
            assert len(shard) == per_rank
            seen += shard
            loader = dali.build_dali_loader(source, options, device_id=None).loader
            assert len(loader) == (2 if drop_last else 3)  # the same number of steps on every rank
            assert sum(b[0].shape[0] for b in epoch(loader)) == (4 if drop_last else 5)
        if drop_last:
            assert len(set(seen)) == 12
        else:  # 14 images padded to 15 by repeating the first
            assert set(seen) == set(items) and len(seen) == 15


def _identities(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """One number per image (its pixel sum), to tell the 14 images apart."""
    return [round(float(image.sum()), 1) for images, _ in batches for image in images]


@pytest.mark.parametrize("shuffle", [True, False])
def test_two_ranks_are_dealt_new_samples_every_epoch_each_sample_once(source, shuffle):
    # As torch's DistributedSampler with set_epoch: each epoch deals the images afresh over the ranks, and
    # within an epoch the two ranks together read every image exactly once (14 images, 2 ranks: no padding).
    everything = sorted(_identities(epoch(dali.build_dali_loader(source, LoaderOptions(batch_size=2),
                                                                  device_id=None).loader)))
    loaders = [dali.build_dali_loader(source, LoaderOptions(batch_size=2, rank=r, world_size=2, shuffle=shuffle,
                                                            seed=5), device_id=None).loader for r in range(2)]
    rank0_sets = []
    for _ in range(3):
        per_rank = [_identities(epoch(loader)) for loader in loaders]
        assert [len(ids) for ids in per_rank] == [7, 7]
        assert sorted(per_rank[0] + per_rank[1]) == pytest.approx(everything)
        rank0_sets.append(frozenset(per_rank[0]))
    assert rank0_sets[0] != rank0_sets[1] and rank0_sets[1] != rank0_sets[2]


def test_an_evaluation_folder_is_read_unpadded_each_image_on_one_rank(source):
    counts = []
    for rank in range(3):
        options = LoaderOptions(batch_size=2, rank=rank, world_size=3, evaluation=True)
        loader = dali.build_dali_loader(source, options, device_id=None).loader
        counts.append(sum(b[0].shape[0] for b in epoch(loader)))
        assert len(loader) == (3 if rank < 2 else 2)  # 5, 5 and 4 of the 14 images: ranks may differ by a batch
    assert counts == [5, 5, 4]


def test_shuffled_shards_are_seeded_and_the_same_split_on_every_rank(source):
    items = list_images(source.root)
    split = [dali.shard_items(items, LoaderOptions(batch_size=2, rank=r, world_size=2, shuffle=True, seed=7))
             for r in range(2)]
    assert sorted(split[0] + split[1]) == sorted(items)
    again = dali.shard_items(items, LoaderOptions(batch_size=2, rank=0, world_size=2, shuffle=True, seed=7))
    assert again == split[0]
    with pytest.raises(DataError, match="cannot be split"):
        dali.shard_items(items[:2], LoaderOptions(batch_size=1, world_size=3, drop_last=True))


def test_a_loop_left_early_does_not_leak_into_the_next_epoch(source):
    loader = dali.build_dali_loader(source, LoaderOptions(batch_size=4), device_id=None).loader
    full = epoch(loader)
    for _ in loader:
        break  # max_steps reached mid-epoch
    again = epoch(loader)
    assert len(again) == len(full)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, full, strict=True))


def test_the_hook_uses_dali_for_image_folders(source):
    choice = cuda_plugin.devplug_dataloader(device=cuda_device(), source=source, options=LoaderOptions(batch_size=4))
    assert choice.implementation.startswith("DALI") and choice.reason == ""
    images, labels = next(iter(choice.loader))
    assert images.shape == (4, 3, IMAGE_SIZE, IMAGE_SIZE) and labels.shape == (4,)


@pytest.fixture
def without_dali(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import nvidia.dali`` fails, as on a machine without DALI."""
    for name in list(sys.modules):
        if name == "nvidia.dali" or name.startswith("nvidia.dali."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    forget_logged()
    yield
    forget_logged()


@pytest.mark.usefixtures("without_dali")
def test_without_dali_the_torch_loader_is_used_and_the_reason_logged_once(source, caplog):
    assert "not installed" in dali.dali_status()
    with caplog.at_level(logging.INFO, logger="devplug"):
        first = cuda_plugin.devplug_dataloader(device=cuda_device(), source=source,
                                               options=LoaderOptions(batch_size=4, num_workers=2))
        second = cuda_plugin.devplug_dataloader(device=cuda_device(), source=source,
                                                options=LoaderOptions(batch_size=4, num_workers=2))
    for choice in (first, second):
        assert choice.implementation.startswith("torch DataLoader") and "pin_memory=True" in choice.implementation
        assert "NVIDIA DALI is not installed" in choice.reason and "nvidia-dali-cuda120" in choice.reason
        assert isinstance(choice.loader.dataset, ImageFolderDataset)
    messages = [r.getMessage() for r in caplog.records if "not DALI" in r.getMessage()]
    assert len(messages) == 1 and "NVIDIA DALI is not installed" in messages[0]


def test_device_option_dali_false_uses_the_torch_loader(source):
    forget_logged()
    choice = cuda_plugin.devplug_dataloader(device=cuda_device(dali=False), source=source,
                                            options=LoaderOptions(batch_size=4))
    assert choice.implementation.startswith("torch DataLoader") and "dali=False" in choice.reason


def test_a_dali_pipeline_that_cannot_be_built_falls_back_with_the_reason(source, monkeypatch):
    forget_logged()

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA driver version is insufficient")

    monkeypatch.setattr(dali, "build_dali_loader", broken)
    choice = cuda_plugin.devplug_dataloader(device=cuda_device(), source=source, options=LoaderOptions(batch_size=4))
    assert choice.implementation.startswith("torch DataLoader")
    assert "could not be built" in choice.reason and "insufficient" in choice.reason


def test_a_missing_folder_is_a_data_error_not_a_fallback(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        cuda_plugin.devplug_dataloader(device=cuda_device(), source=ImageFolderSource(str(tmp_path / "nope"), 8),
                                       options=LoaderOptions(batch_size=4))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_gpu_dali_decodes_on_the_gpu_and_matches_the_cpu_pipeline(source):
    choice = dali.build_dali_loader(source, LoaderOptions(batch_size=7), device_id=0)
    assert choice.on_device and "mixed" in choice.implementation
    on_cpu = epoch(dali.build_dali_loader(source, LoaderOptions(batch_size=7), device_id=None).loader)
    for (images, labels), (expected, expected_labels) in zip(epoch(choice.loader), on_cpu, strict=True):
        assert images.is_cuda and labels.is_cuda
        assert torch.equal(labels.cpu(), expected_labels)
        assert (images.cpu() - expected).abs().mean() < 0.01  # nvJPEG and the CPU decoder round differently

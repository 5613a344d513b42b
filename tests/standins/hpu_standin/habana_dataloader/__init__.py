"""Stand-in for ``habana_dataloader``, Intel's Gaudi data loader for PyTorch (tests only).

Mirrors HabanaAI/gaudi-pytorch-bridge release 1.19, ``pytorch_helpers/dataloader/habana_dataloader/
habana_dataloader/habana_dataset.py`` (cited below as ``habana_dataset.py``), its ``aeon_transformers.py``,
``aeon_config.py`` and ``aeon_manifest.py``, and the media loader's ``media_dataloader_mediapipe.py``
(``HPUMediaPipe``, shipped with the Intel Gaudi media package, not in the bridge repository). Which
path runs, and how each treats the torch ``DataLoader`` arguments, follows that code:

- a torchvision ``ImageFolder`` goes to ``ResnetDataLoader``; anything else (no COCO here) fails to
  build and runs torch's ``DataLoader`` with the same arguments (habana_dataset.py lines 537-578);
- Gaudi 2 with the media loader installed (and ``PT_HPU_MEDIA_PIPE`` not false): the media pipeline
  (lines 329-339, 369-396), which *ignores* ``sampler``, ``num_workers`` and ``pin_memory``, reads
  ``shuffle`` (default False) and ``drop_last`` (default False: the last batch is rounded up), shards
  by ``torch.distributed`` rank itself (lines 375-376, 445-508) and seeds its shuffle from the clock
  (``HPUMediaPipe.definegraph``: ``seed_mediapipe = int(time.time_ns() % (2**31 - 1))``); it reads
  JPEG files only (``fn.ReadImageDatasetFromDir(format=["jpg", "JPG", "jpeg", "JPEG"])``);
- first-generation Gaudi, or Gaudi 2 without the media loader: aeon (lines 341-367), which insists on
  ``shuffle`` unset/False, ``num_workers`` 8, ``pin_memory=True`` given, ``prefetch_factor`` 2,
  ``persistent_workers`` False (lines 425-443), transforms it can parse with ``Normalize`` mean/std equal
  to ImageNet's *as lists* (aeon_transformers.py lines 83-93), JPEG files only (aeon_manifest.py lines
  24-40); it shards by rank itself and shuffles a training manifest with the fixed seed 5
  (aeon_config.py lines 76-101); the sampler is stored and not used;
- any other generation, or any of those conditions unmet: ``ValueError``/``ImportError``, caught, and
  torch's ``DataLoader(*args, **kwargs)`` runs instead, honouring the sampler (lines 400-403).

The stand-in decodes on the CPU with the dataset's own transform. How the media reader deals files to
slices is in Intel's C++ reader and not public: the stand-in slices the file list by rank (every
``num_instances``-th file) before shuffling, so slices never overlap, and rounds each slice up to whole
batches with repeats from its start. Every construction is recorded (``HabanaDataLoader``, with its
arguments) together with the path taken (``HabanaDataLoader.path``).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import hpu_standin_calls
import torch
import torch.distributed as dist
import torch.utils.data

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
JPEG = (".jpg", ".jpeg")


def _world() -> tuple[int, int]:
    """(world size, rank) from torch.distributed, 1 and 0 outside it (habana_dataset.py lines 38-53)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _enforce(kwargs: dict[str, Any], name: str, expected: Any, allow_default: bool = True) -> None:
    """``_enforce_value_for_arg`` (habana_dataset.py lines 510-515): a given value must be ``expected``."""
    if not allow_default and kwargs.get(name) is None:
        raise ValueError(f"'{name}' is supported only as {expected}")
    if kwargs.get(name) is not None and kwargs.get(name) != expected:
        raise ValueError(f"'{name}' is supported only as {expected}")


def _media_transforms(transform: Any) -> None:
    """The transform checks of ``HPUMediaPipe.__init__`` that devplug's transforms meet or miss.

    From the media package's ``media_dataloader_mediapipe.py``, whose repository is not public: one
    Resize (even sizes), one crop, Normalize with three values, and float output only with Normalize.
    """
    from torchvision import transforms

    if not isinstance(transform, transforms.Compose):
        raise ValueError("torch_transforms should be of type torchvision.transforms")
    normalized = False
    for t in transform.transforms:
        if isinstance(t, (transforms.Resize, transforms.RandomResizedCrop)):
            size = (t.size, t.size) if isinstance(t.size, int) else tuple(t.size) * (2 if len(t.size) == 1 else 1)
            if size[0] % 2 or size[1] % 2:
                raise ValueError(f"Unsupported w:h for transform: {type(t)}")
        elif isinstance(t, transforms.Normalize):
            if len(t.mean) != 3 or len(t.std) != 3:
                raise ValueError("Unsupported mean for Normalize transform")
            normalized = True
        elif not isinstance(t, (transforms.CenterCrop, transforms.ToTensor, transforms.RandomHorizontalFlip,
                                transforms.RandomVerticalFlip, transforms.ColorJitter)):
            raise ValueError(f"Unsupported transform: {type(t)}")
    if not normalized and any(isinstance(t, transforms.ToTensor) for t in transform.transforms):
        raise ValueError("Unsupported output data type float32")


def _aeon_transforms(transform: Any) -> bool:
    """``HabanaAeonTransforms.get_aeon_transforms`` (aeon_transformers.py lines 22-102): True for training."""
    from torchvision import transforms

    if not isinstance(transform, transforms.Compose):
        raise ValueError("torch_transforms should be of type torchvision.transforms")
    train = val = False
    for t in transform.transforms:
        if isinstance(t, transforms.RandomResizedCrop):
            train = True
        elif isinstance(t, (transforms.CenterCrop, transforms.Resize)):
            val = True
        elif isinstance(t, transforms.RandomHorizontalFlip):
            train = True
            if t.p != 0.5:
                raise ValueError("aeon RandomHorizontalFlip supports only probability of 0.5")
        elif isinstance(t, transforms.Normalize):
            if t.mean != IMAGENET_MEAN:  # a tuple never equals the list: aeon_transformers.py line 90
                raise ValueError("aeon Normalize supports only mean of [0.485, 0.456, 0.406]")
            if t.std != IMAGENET_STD:
                raise ValueError("aeon Normalize supports only std of [0.229, 0.224, 0.225]")
        elif not isinstance(t, transforms.ToTensor):
            raise ValueError("Unsupported transform: " + str(type(t)))
    if train == val:
        raise ValueError("Could not determine if running on train or validation mode")
    return train


class _ShardedImages:
    """What the media and aeon pipelines yield: this rank's files, dealt by the loader itself.

    Slicing before shuffling is the stand-in's assumption: Intel's C++ reader is not public (see above).
    """

    def __init__(self, dataset: Any, *, batch_size: int, shuffle: bool, drop_last: bool, seed: int,
                 reshuffle_each_epoch: bool) -> None:
        world, rank = _world()
        samples = [i for i, (path, _) in enumerate(dataset.samples) if path.lower().endswith(JPEG)]
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.indices = samples[rank::world]
        self.rng = random.Random(seed)
        self.shuffle = shuffle and reshuffle_each_epoch
        if shuffle and not reshuffle_each_epoch:  # aeon: the manifest is shuffled once, with a fixed seed
            self.rng.shuffle(self.indices)
        self.num_instances, self.instance_id = world, rank

    def __len__(self) -> int:
        full, rest = divmod(len(self.indices), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = list(self.indices)
        if self.shuffle:
            self.rng.shuffle(order)
        if self.drop_last:
            order = order[: len(order) - len(order) % self.batch_size]
        else:  # "round up of last batch": repeat samples from the start of the slice
            total = math.ceil(len(order) / self.batch_size) * self.batch_size
            order = (order * (total // max(len(order), 1) + 1))[:total]
        for start in range(0, len(order), self.batch_size):
            items = [self.dataset[i] for i in order[start:start + self.batch_size]]
            yield torch.stack([image for image, _ in items]), torch.tensor([label for _, label in items])


def _resnet_loader(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
    """``ResnetDataLoader.__init__`` (habana_dataset.py lines 316-403): the path and its iterable."""
    from habana_frameworks.torch.utils import experimental as htexp

    device = htexp._get_device_type()
    gaudi, gaudi2 = device == htexp.synDeviceType.synDeviceGaudi, device == htexp.synDeviceType.synDeviceGaudi2
    aeon = os.getenv("PT_HPU_MEDIA_PIPE", "true").lower() in ("false", "0", "f")
    if not aeon and gaudi2:
        try:
            import habana_frameworks.medialoaders.torch.media_dataloader_mediapipe  # noqa: F401
        except ImportError:
            aeon = True
    dataset = kwargs.get("dataset", args[0] if args else None)
    if not dataset:
        raise ValueError("'dataset' can not be None")
    if gaudi or aeon:
        _enforce(kwargs, "shuffle", False)
        _enforce(kwargs, "batch_sampler", None)
        _enforce(kwargs, "num_workers", 8)
        _enforce(kwargs, "collate_fn", None)
        _enforce(kwargs, "pin_memory", True, False)
        _enforce(kwargs, "timeout", 0)
        _enforce(kwargs, "worker_init_fn", None)
        _enforce(kwargs, "generator", None)
        _enforce(kwargs, "prefetch_factor", 2)
        _enforce(kwargs, "persistent_workers", False)
        train = _aeon_transforms(dataset.transform)
        for path, _ in dataset.imgs:
            if not path.lower().endswith(JPEG):
                raise ValueError(f"HabanaDataLoader supports only jpg/jpeg files, found unsupported file: {path}.")
        return "aeon", _ShardedImages(dataset, batch_size=kwargs.get("batch_size", 1), shuffle=train,
                                      drop_last=kwargs.get("drop_last", False), seed=5, reshuffle_each_epoch=False)
    if not gaudi2:
        raise ValueError("Unsupported device")
    shuffle = kwargs.get("shuffle", False)
    sampler = kwargs.get("sampler")
    if "shuffle" not in kwargs and (isinstance(sampler, torch.utils.data.RandomSampler) or (
            isinstance(sampler, torch.utils.data.DistributedSampler) and sampler.shuffle)):
        shuffle = True
    _enforce(kwargs, "batch_sampler", None)
    _enforce(kwargs, "collate_fn", None)
    _enforce(kwargs, "timeout", 0)
    _enforce(kwargs, "worker_init_fn", None)
    _enforce(kwargs, "generator", None)
    _enforce(kwargs, "persistent_workers", False)
    _media_transforms(dataset.transform)
    return "media", _ShardedImages(dataset, batch_size=kwargs.get("batch_size", 1), shuffle=shuffle,
                                   drop_last=kwargs.get("drop_last", False),
                                   seed=int(time.time_ns() % (2**31 - 1)), reshuffle_each_epoch=True)


class ResnetDataLoader(torch.utils.data.DataLoader):
    """The ImageFolder loader (habana_dataset.py lines 316-423): its Gaudi pipeline, else torch's own loader.

    ``fallback_activated`` says which (lines 324, 400-403), ``aeon_fallback_activated`` which pipeline.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.fallback_activated = False
        try:
            self.path, self.iterator = _resnet_loader(args, kwargs)
            self.aeon_fallback_activated = self.path == "aeon"
            self.error = ""
        except (ValueError, ImportError) as exc:
            self.path, self.error, self.fallback_activated = "torch", str(exc), True
            super().__init__(*args, **kwargs)

    def __iter__(self) -> Any:
        return super().__iter__() if self.fallback_activated else iter(self.iterator)

    def __len__(self) -> int:
        return super().__len__() if self.fallback_activated else len(self.iterator)


class HabanaDataLoader:
    """A data loader for Gaudi, used like ``torch.utils.data.DataLoader`` (habana_dataset.py lines 537-591)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import torchvision.datasets

        dataset = kwargs.get("dataset", args[0] if args else None)
        hpu_standin_calls.record(
            "HabanaDataLoader", dataset=type(dataset).__name__, **{k: v for k, v in kwargs.items() if k != "dataset"}
        )
        try:
            if not isinstance(dataset, torchvision.datasets.ImageFolder):
                raise TypeError("'NoneType' object is not callable")  # dataloader_type stays None (line 540)
            self.dataloader: Any = ResnetDataLoader(*args, **kwargs)
            path, error = self.dataloader.path, self.dataloader.error
        except Exception as exc:  # lines 570-578: torch's loader again, outside any try (DATALOADER_FALLBACK_EN)
            self.dataloader = torch.utils.data.DataLoader(*args, **kwargs)
            path, error = "torch", str(exc)
        hpu_standin_calls.record("HabanaDataLoader.path", path=path, error=error)

    def __iter__(self) -> HabanaDataLoader:
        self.iter = iter(self.dataloader)
        return self

    def __next__(self) -> Any:
        return next(self.iter)

    def __len__(self) -> int:
        return len(self.dataloader)

"""NVIDIA DALI loader for image folders: decode on the GPU, resize, crop, normalize, batches on the device.

The pipeline reads the same files with the same labels as `devplug.toolkit.ImageFolderDataset`
(both list them with `devplug.toolkit.list_images`) and applies the same transform (resize the
short side, center crop, normalize with the source's mean/std), so switching loaders does not change
what the model sees beyond decoder and resampling rounding.

With ``device_id=None`` the pipeline runs in DALI's CPU-only mode (decoding on the CPU, batches on the
CPU), which needs no GPU: that is how it is tested on machines without one.

``nvidia.dali`` is imported only inside these functions, never when the plugin is registered.
"""

from __future__ import annotations

import importlib
import math
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch

from devplug import DataError, ImageFolderSource, LoaderChoice, LoaderOptions
from devplug.toolkit import evaluation_shard, list_images

#: Name of the file reader inside the pipeline; the iterator asks it for the shard size.
READER_NAME = "devplug_reader"

T = TypeVar("T")

INSTALL_DALI = "pip install nvidia-dali-cuda120 (CUDA 12; nvidia-dali-cuda110 for CUDA 11, nvidia-dali-cuda130 for 13)"


def dali_status() -> str:
    """``""`` when NVIDIA DALI and its PyTorch plugin import; otherwise why not."""
    try:
        importlib.import_module("nvidia.dali")
        importlib.import_module("nvidia.dali.plugin.pytorch")
    except ModuleNotFoundError as exc:
        if exc.name in ("nvidia", "nvidia.dali"):
            return f"NVIDIA DALI is not installed ({INSTALL_DALI})"
        return f"NVIDIA DALI does not import: {exc}"
    except Exception as exc:  # a broken install (wrong CUDA flavour, missing library) must not crash
        return f"NVIDIA DALI does not import ({type(exc).__name__}: {exc})"
    return ""


def _threads(options: LoaderOptions) -> int:
    return max(1, min(options.num_workers or 2, os.cpu_count() or 1))


def shard_items(items: Sequence[T], options: LoaderOptions) -> list[T]:
    """This rank's share of ``items``, chosen as ``torch.utils.data.DistributedSampler`` chooses it.

    Every rank gets the same number of items (so every rank runs the same number of steps): the list
    is padded by repeating items from its start (``drop_last=False``) or cut (``drop_last=True``) to a
    multiple of the world size, then rank ``r`` takes items ``r, r + world_size, ...``. With
    ``shuffle`` the split is random (seeded by ``options.seed``, the same on every rank). A single
    process gets all items in order. An evaluation loader (``options.evaluation``) is not padded: each
    rank takes its contiguous block (`evaluation_shard`), every item
    on exactly one rank. Used for evaluation loaders and single processes: a training loader on several
    ranks is dealt afresh every epoch instead (`dealt_items`).
    """
    world, count = options.world_size, len(items)
    if world <= 1:
        return list(items)
    if options.evaluation:
        order = list(range(count))
        if options.shuffle:
            random.Random(options.seed).shuffle(order)
        return [items[order[i]] for i in evaluation_shard(count, options.rank, world)]
    return dealt_items(items, options)[options.rank :: world]


def dealt_items(items: Sequence[T], options: LoaderOptions) -> list[T]:
    """The list every rank's reader gets for a sharded training loader; DALI deals it to the ranks.

    Seeded the same on every rank (``options.seed``), cut (``drop_last``) or padded by repeating items
    from its start to a multiple of the world size, so every rank reads the same number of items. The
    reader takes shard ``rank`` of ``world_size`` and moves to the next shard each epoch
    (``stick_to_shard=False``); with ``shuffle`` it also reshuffles the whole list after each epoch
    (``shuffle_after_epoch``), the same way on every rank. So each epoch deals different items to each
    rank and every item goes to exactly one rank, as torch's ``DistributedSampler`` with ``set_epoch``.
    """
    world, count = options.world_size, len(items)
    order = list(range(count))
    if options.shuffle:
        random.Random(options.seed).shuffle(order)
    if options.drop_last:
        total = count - count % world
        if total == 0:
            raise DataError(f"{count} image(s) cannot be split over {world} ranks with drop_last=True")
        order = order[:total]
    else:
        total = math.ceil(count / world) * world
        order = (order * math.ceil(total / count))[:total]
    return [items[i] for i in order]


def _center_crop_position(extent: Any, crop: int, dmath: Any) -> Any:
    """Relative crop start that DALI rounds to torchvision's ``int(round((extent - crop) / 2))``.

    Python rounds halves to even, DALI away from zero: the start is computed here, halves to even, and
    handed to DALI as ``start / (extent - crop)``, which its rounding maps back to the same pixel.
    """
    margin = extent - crop
    half = dmath.floor(margin / 2)
    odd_margin = margin - 2 * half
    odd_half = half - 2 * dmath.floor(half / 2)
    start = half + odd_margin * odd_half
    return start / (margin + (margin < 1))


def build_dali_pipeline(
    source: ImageFolderSource,
    options: LoaderOptions,
    device_id: int | None = None,
    *,
    channels_last: bool = False,
) -> Any:
    """A built DALI pipeline yielding ``(images, labels)`` for ``source``, sharded by rank.

    ``fn.readers.file`` (a training loader on several ranks: the `dealt_items` list, sharded by DALI,
    dealt afresh every epoch; else this rank's `shard_items`; reshuffled every epoch when
    ``options.shuffle``) →
    ``fn.decoders.image`` (``"mixed"``: on the GPU ``device_id``; ``"cpu"`` when ``device_id`` is
    ``None``) → ``fn.resize`` (short side to ``image_size``, antialiased linear) →
    ``fn.crop_mirror_normalize`` (center crop, ``(x/255 - mean) / std``, float32, CHW; HWC when
    ``channels_last``). Output sizes and crop offsets are computed per image exactly as torchvision's
    ``Resize``/``CenterCrop`` compute them, so both loaders cut the same pixels.
    """
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali import math as dmath

    sharded = options.world_size > 1 and not options.evaluation
    items = (dealt_items if sharded else shard_items)(list_images(source.root), options)
    files = [str(path) for path, _ in items]
    labels = [label for _, label in items]
    size = source.image_size
    on_gpu = device_id is not None
    reader_kwargs: dict[str, Any] = {}
    if sharded:  # DALI deals the shards, a different one each epoch (stick_to_shard=False)
        reader_kwargs.update(shard_id=options.rank, num_shards=options.world_size, stick_to_shard=False)
    if options.shuffle and "shuffle_after_epoch_seed" in (fn.readers.file.__doc__ or ""):
        reader_kwargs["shuffle_after_epoch_seed"] = int(options.seed)

    @pipeline_def
    def image_folder_pipeline() -> tuple[Any, Any]:
        """The graph: read → peek shape → decode → resize → crop + normalize; labels alongside."""
        encoded, label = fn.readers.file(
            files=files,
            labels=labels,
            name=READER_NAME,
            shuffle_after_epoch=options.shuffle,
            pad_last_batch=True,  # each epoch ends on a batch boundary, so the next starts afresh
            **reader_kwargs,
        )
        # The torch loader's output size: short side = size, long side truncated; EXIF orientation is
        # applied, as the torch loader does (devplug.toolkit.load_rgb). The header gives the shape.
        shape = fn.peek_image_shape(encoded, adjust_orientation=True)  # H, W, C
        height, width = fn.cast(shape[0], dtype=types.FLOAT), fn.cast(shape[1], dtype=types.FLOAT)
        portrait = height >= width
        landscape = height < width
        out_h = portrait * dmath.floor(size * height / width) + landscape * size
        out_w = landscape * dmath.floor(size * width / height) + portrait * size
        images = fn.decoders.image(encoded, device="mixed" if on_gpu else "cpu", output_type=types.RGB,
                                   adjust_orientation=True)
        images = fn.resize(images, size=fn.stack(out_h, out_w), interp_type=types.INTERP_LINEAR,
                           antialias=True, subpixel_scale=False)
        images = fn.crop_mirror_normalize(
            images,
            crop=(size, size),
            crop_pos_x=_center_crop_position(out_w, size, dmath),
            crop_pos_y=_center_crop_position(out_h, size, dmath),
            mean=[m * 255.0 for m in source.mean],
            std=[s * 255.0 for s in source.std],
            dtype=types.FLOAT,
            output_layout="HWC" if channels_last else "CHW",
        )
        if on_gpu:
            label = label.gpu()
        return images, label

    pipeline = image_folder_pipeline(
        batch_size=options.batch_size,
        num_threads=_threads(options),
        device_id=device_id,
        seed=int(options.seed),
        prefetch_queue_depth=options.prefetch_factor or 2,
    )
    pipeline.build()
    return pipeline


class DaliLoader:
    """Iterates a ``DALIGenericIterator`` as ``(images, labels)`` batches, like a torch DataLoader.

    ``images`` is ``N×C×H×W`` float32 (a channels_last view when the pipeline emits HWC), ``labels``
    is ``N`` int64. Every ``for`` loop over the loader is one epoch. With ``drop_last`` an incomplete
    last batch is read and dropped here (DALI's own DROP policy leaves the padded batch in the
    pipeline, where it would start the next epoch). A loop left early (``break``, ``max_steps``) has
    the rest of its epoch drained before the next one starts, since DALI cannot reset mid-epoch.
    """

    def __init__(self, iterator: Any, *, batch_size: int, drop_last: bool = False,
                 channels_last: bool = False) -> None:
        self.iterator = iterator
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.channels_last = channels_last
        self._mid_epoch = False

    def __len__(self) -> int:
        samples = self.iterator.size
        return samples // self.batch_size if self.drop_last else math.ceil(samples / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._mid_epoch:
            for _ in self.iterator:
                pass
        self._mid_epoch = True
        for outputs in self.iterator:
            images, labels = outputs[0]["images"], outputs[0]["labels"]
            if self.drop_last and images.shape[0] < self.batch_size:
                continue
            if self.channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC memory seen as NCHW: channels_last strides
            yield images, labels.reshape(-1).long()
        self._mid_epoch = False


def build_dali_loader(
    source: ImageFolderSource,
    options: LoaderOptions,
    device_id: int | None = None,
    *,
    channels_last: bool = False,
) -> LoaderChoice:
    """A `LoaderChoice` wrapping a DALI pipeline over ``source`` (see `build_dali_pipeline`).

    ``options.drop_last`` drops an incomplete last batch, else it is returned short. Batches are on GPU
    ``device_id`` (``on_device=True``), or on the CPU in CPU-only mode (``device_id=None``).
    """
    import nvidia.dali
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    pipeline = build_dali_pipeline(source, options, device_id, channels_last=channels_last)
    iterator = DALIGenericIterator(
        [pipeline],
        ["images", "labels"],
        reader_name=READER_NAME,
        last_batch_policy=LastBatchPolicy.PARTIAL,
        auto_reset=True,
    )
    where = f"GPU {device_id} (decoders.image 'mixed')" if device_id is not None else "CPU (CPU-only mode)"
    implementation = f"DALI {nvidia.dali.__version__} on {where}, {_threads(options)} threads"
    return LoaderChoice(
        loader=DaliLoader(iterator, batch_size=options.batch_size, drop_last=options.drop_last,
                          channels_last=channels_last),
        implementation=implementation,
        on_device=device_id is not None,
    )

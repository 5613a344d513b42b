"""NVIDIA DALI loader for image folders: decode on the GPU, resize, crop, normalize, batches on the device.

The pipeline reads the same files with the same labels as :class:`devplug.core.data.ImageFolderDataset`
(both list them with :func:`devplug.core.data.list_images`) and applies the same transform (resize the
short side, center crop, normalize with the source's mean/std), so switching loaders does not change
what the model sees beyond decoder and resampling rounding.

With ``device_id=None`` the pipeline runs in DALI's CPU-only mode (decoding on the CPU, batches on the
CPU), which needs no GPU: that is how it is tested on machines without one.

``nvidia.dali`` is imported only inside these functions, never when the plugin is registered.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from devplug.core.data import list_images
from devplug.core.records import ImageFolderSource, LoaderChoice, LoaderOptions

#: Name of the file reader inside the pipeline; the iterator asks it for the shard size.
READER_NAME = "devplug_reader"

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


def build_dali_pipeline(
    source: ImageFolderSource,
    options: LoaderOptions,
    device_id: int | None = None,
    *,
    channels_last: bool = False,
) -> Any:
    """A built DALI pipeline yielding ``(images, labels)`` for ``source``, sharded by rank.

    ``fn.readers.file`` (this rank's shard, reshuffled every epoch when ``options.shuffle``) →
    ``fn.decoders.image`` (``"mixed"``: on the GPU ``device_id``; ``"cpu"`` when ``device_id`` is
    ``None``) → ``fn.resize`` (short side to ``image_size``, antialiased) → ``fn.crop_mirror_normalize``
    (center crop, ``(x/255 - mean) / std``, float32, CHW; HWC when ``channels_last``).
    """
    from nvidia.dali import fn, pipeline_def, types

    items = list_images(source.root)
    files = [str(path) for path, _ in items]
    labels = [label for _, label in items]
    size = source.image_size
    on_gpu = device_id is not None
    reader_kwargs: dict[str, Any] = {}
    if options.shuffle and "shuffle_after_epoch_seed" in (fn.readers.file.__doc__ or ""):
        reader_kwargs["shuffle_after_epoch_seed"] = int(options.seed)

    @pipeline_def
    def image_folder_pipeline() -> tuple[Any, Any]:
        encoded, label = fn.readers.file(
            files=files,
            labels=labels,
            name=READER_NAME,
            shard_id=options.rank,
            num_shards=options.world_size,
            shuffle_after_epoch=options.shuffle,
            **reader_kwargs,
        )
        images = fn.decoders.image(encoded, device="mixed" if on_gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_shorter=size, interp_type=types.INTERP_LINEAR, antialias=True)
        images = fn.crop_mirror_normalize(
            images,
            crop=(size, size),
            crop_pos_x=0.5,
            crop_pos_y=0.5,
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
    is ``N`` int64. Every ``for`` loop over the loader is one epoch; a loop left early (``break``,
    ``max_steps``) has the rest of its epoch drained before the next one starts.
    """

    def __init__(self, iterator: Any, *, channels_last: bool = False) -> None:
        self.iterator = iterator
        self.channels_last = channels_last
        self._mid_epoch = False

    def __len__(self) -> int:
        return len(self.iterator)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._mid_epoch:  # DALI iterators cannot be reset mid-epoch: finish the abandoned one
            for _ in self.iterator:
                pass
        self._mid_epoch = True
        for outputs in self.iterator:
            batch = outputs[0]
            images = batch["images"]
            if self.channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC memory seen as NCHW: channels_last strides
            yield images, batch["labels"].reshape(-1).long()
        self._mid_epoch = False


def build_dali_loader(
    source: ImageFolderSource,
    options: LoaderOptions,
    device_id: int | None = None,
    *,
    channels_last: bool = False,
) -> LoaderChoice:
    """A :class:`LoaderChoice` wrapping a DALI pipeline over ``source`` (see :func:`build_dali_pipeline`).

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
        last_batch_policy=LastBatchPolicy.DROP if options.drop_last else LastBatchPolicy.PARTIAL,
        auto_reset=True,
    )
    where = f"GPU {device_id} (decoders.image 'mixed')" if device_id is not None else "CPU (CPU-only mode)"
    implementation = f"DALI {nvidia.dali.__version__} on {where}, {_threads(options)} threads"
    return LoaderChoice(
        loader=DaliLoader(iterator, channels_last=channels_last),
        implementation=implementation,
        on_device=device_id is not None,
    )

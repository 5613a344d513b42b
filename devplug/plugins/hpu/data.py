"""Data loading on Gaudi: ``habana_dataloader.HabanaDataLoader`` where it keeps devplug's guarantees, else torch's.

``HabanaDataLoader`` takes ``torch.utils.data.DataLoader``'s arguments and, for a torchvision
``ImageFolder``, runs one of three things (Intel Gaudi PyTorch bridge 1.19, ``habana_dataset.py``):

- on Gaudi 2 with the media loader installed, the *media pipeline*: JPEG decoding on the card. It
  ignores the sampler, ``num_workers`` and ``pin_memory``, shards by ``torch.distributed`` rank itself,
  seeds its shuffle from the clock, and with ``drop_last=False`` rounds the last batch up with
  repeated samples;
- on first-generation Gaudi (or Gaudi 2 without the media loader), *aeon*, a host pipeline that
  runs only with exactly 8 workers, ``pin_memory=True``, no ``shuffle`` argument, ImageNet's
  mean/std given as lists and JPEG files, and runs a resize-and-crop transform (devplug's) in validation
  mode, which never shuffles; it too shards by rank itself and ignores the sampler;
- otherwise torch's own ``DataLoader`` with the same arguments.

devplug predicts which one will run and names it in the loader line. Where HabanaDataLoader would
only fall back to torch's loader, devplug builds the tuned torch loader itself and says why. An
evaluation loader always uses torch's loader, since each sample must be read exactly once and the
Gaudi pipelines pad and deal samples themselves. A training loader uses the Gaudi pipeline, which is
much faster at decoding, and says once, as a warning, what it gives up: a resumed run does not
replay the interrupted epoch's order, and the sampler, workers and pinning are not used. Device
option ``habana_dataloader=False`` keeps torch's loader for training too.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import attrs

from devplug import Device, ImageFolderSource, LoaderChoice, LoaderOptions, toolkit
from devplug.plugins.hpu import runtime

# toolkit's image pipeline is looked up when a loader is built, so importing this module stays cheap


def image_folder_dataset(source: ImageFolderSource) -> Any:
    """A torchvision ``ImageFolder`` with the resize, crop and normalization the source describes.

    Mean and std are given to ``Normalize`` as lists: aeon compares them with ImageNet's as lists.
    """
    from torchvision import datasets, transforms

    transform = toolkit.image_transform(source)
    steps = [transforms.Normalize(list(t.mean), list(t.std)) if isinstance(t, transforms.Normalize) else t
             for t in transform.transforms]
    return datasets.ImageFolder(source.root, transform=transforms.Compose(steps))


def habana_dataset(source: Any, options: LoaderOptions) -> tuple[Any, str]:
    """``(dataset, "")`` when HabanaDataLoader can accelerate ``source``, else ``(None, reason)``."""
    if options.collate_fn is not None:
        return None, "HabanaDataLoader does not take a custom collate_fn"
    if isinstance(source, ImageFolderSource):
        root = Path(source.root)
        extensions = toolkit.IMAGE_EXTENSIONS
        loose = root.is_dir() and any(p.suffix.lower() in extensions for p in root.iterdir() if p.is_file())
        classes = root.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in root.iterdir())
        if loose or not classes:
            return None, (f"HabanaDataLoader needs an ImageFolder layout (one sub-folder per class) and "
                          f"{str(root)!r} is not one")
        try:
            return image_folder_dataset(source), ""
        except ImportError as exc:
            return None, f"HabanaDataLoader needs torchvision ({exc})"
    folders = sys.modules.get("torchvision.datasets")
    if folders is not None and isinstance(source, folders.ImageFolder):
        return source, ""
    return None, f"HabanaDataLoader accelerates torchvision ImageFolder datasets, not {type(source).__name__}"


#: Normalization aeon accepts (aeon_transformers.py compares these lists).
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
#: The only worker count aeon runs with.
AEON_WORKERS = 8
JPEG = (".jpg", ".jpeg")
MEDIA_MODULE = "habana_frameworks.medialoaders.torch.media_dataloader_mediapipe"


@attrs.frozen
class HabanaPath:
    """What ``HabanaDataLoader`` will run: ``"media"``, ``"aeon"`` or ``"torch"`` (with why)."""

    kind: str
    why: str = ""


def _generation() -> str:
    """``"gaudi"``, ``"gaudi2"``, ``"gaudi3"`` ..., or ``""`` when the bridge does not say."""
    try:
        htexp = importlib.import_module("habana_frameworks.torch.utils.experimental")
        return str(htexp._get_device_type().name).removeprefix("synDevice").lower()
    except (ImportError, AttributeError, RuntimeError):
        return ""


def _media_installed() -> bool:
    try:
        importlib.import_module(MEDIA_MODULE)
    except ImportError:
        return False
    return True


def habana_path(dataset: Any, options: LoaderOptions, source: Any) -> HabanaPath:
    """Which pipeline ``HabanaDataLoader`` runs for ``dataset`` with these options on this machine."""
    generation = _generation()
    not_jpeg = next((path for path, _ in dataset.samples if not path.lower().endswith(JPEG)), None)
    if not_jpeg is not None:
        return HabanaPath("torch", f"HabanaDataLoader reads JPEG files only and {not_jpeg!r} is not one")
    aeon_forced = os.environ.get("PT_HPU_MEDIA_PIPE", "true").lower() in ("false", "0", "f")
    if generation == "gaudi2" and not aeon_forced and _media_installed():
        odd = getattr(source, "image_size", 0) % 2
        if odd:
            return HabanaPath("torch", "the Gaudi media pipeline resizes to even sizes only "
                                       f"(image_size={source.image_size})")
        return HabanaPath("media")
    if generation in ("gaudi", "gaudi2"):
        if source is not dataset:  # devplug's transform (an ImageFolder the author built is aeon's to judge)
            mean, std = source.mean, source.std
            if list(mean) != IMAGENET_MEAN or list(std) != IMAGENET_STD:
                return HabanaPath("torch", "HabanaDataLoader's aeon pipeline normalizes with ImageNet's mean/std "
                                           f"only, and this source uses mean={mean}, std={std}")
            if options.shuffle:
                return HabanaPath("torch", "HabanaDataLoader's aeon pipeline runs a resize-and-crop transform in "
                                           "validation mode, which never shuffles, and shuffle=True was asked for")
        if "num_workers" not in options.automatic and options.num_workers != AEON_WORKERS:
            return HabanaPath("torch", f"HabanaDataLoader's aeon pipeline runs with exactly {AEON_WORKERS} "
                                       f"workers, and num_workers={options.num_workers} was asked for")
        if options.pin_memory is False:
            return HabanaPath("torch", "HabanaDataLoader's aeon pipeline needs pin_memory=True")
        return HabanaPath("aeon")
    if not generation:
        return HabanaPath("torch", "the Gaudi bridge does not say which Gaudi this is "
                                   "(habana_frameworks.torch.utils.experimental)")
    return HabanaPath("torch", f"HabanaDataLoader accelerates Gaudi and Gaudi 2 only, and this is {generation}")


def _lost_guarantees(path: HabanaPath, options: LoaderOptions) -> str:
    pipeline = "Gaudi 2 media pipeline" if path.kind == "media" else "aeon pipeline"
    shuffle = "shuffles with a clock seed, " if path.kind == "media" and options.shuffle else ""
    pad = "" if options.drop_last else ", and repeats samples to fill the last batch"
    return (f"HabanaDataLoader's {pipeline} deals samples to ranks itself, {shuffle}ignores devplug's sampler, "
            f"workers and pin_memory{pad}")


def _fell_back(loader: Any) -> bool:
    """True when a built HabanaDataLoader runs torch's DataLoader after all (``fallback_activated``)."""
    import torch.utils.data

    inner = getattr(loader, "dataloader", None)
    return bool(getattr(inner, "fallback_activated", False)) or type(inner) is torch.utils.data.DataLoader


def build_loader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """HabanaDataLoader where it runs its Gaudi pipeline and may be used; else the tuned torch loader.

    The loader line names what runs. See the module docstring for when torch's loader is used.
    """
    chosen_here = options.pin_memory is None  # pinned only where torch's loader has workers (see torch_dataloader)
    if chosen_here:
        options = attrs.evolve(options, pin_memory=True)
    dataset, reason = habana_dataset(source, options)
    loader_class = None
    path = HabanaPath("torch", reason)
    if dataset is not None:
        try:
            loader_class = importlib.import_module("habana_dataloader").HabanaDataLoader
        except (ImportError, AttributeError) as exc:
            path = HabanaPath("torch", f"habana_dataloader is not available ({type(exc).__name__}: {exc}); it "
                                       "ships with the Intel Gaudi PyTorch containers and installer")
        else:
            path = habana_path(dataset, options, source)
    if path.kind != "torch" and (options.evaluation or options.sampler is not None):
        who = "an evaluation loader reads each sample exactly once" if options.evaluation else \
            "your sampler would not be used"
        path = HabanaPath("torch", f"{_lost_guarantees(path, options)}; {who}")
    elif path.kind != "torch" and device.options.get("habana_dataloader", True) is False:
        path = HabanaPath("torch", "device option habana_dataloader=False")
    if loader_class is None or path.kind == "torch":
        runtime.log_once(f"data loader: {path.why}; using torch DataLoader", logging.INFO)
        return toolkit.torch_dataloader(source, options, reason=path.why, compute_competes=False,
                                        pin_only_with_workers=chosen_here)
    kwargs: dict[str, Any] = {"batch_size": options.batch_size, "drop_last": options.drop_last}
    if path.kind == "aeon":
        kwargs.update(num_workers=AEON_WORKERS, pin_memory=True)
        shown = f"aeon pipeline on Gaudi, {AEON_WORKERS} decode threads"
    else:
        # The media pipeline ignores num_workers, but where it cannot start, HabanaDataLoader builds torch's
        # DataLoader from the same arguments, which refuses a prefetch_factor without workers.
        kwargs.update(shuffle=options.shuffle, num_workers=options.num_workers)
        if options.prefetch_factor is not None and options.num_workers > 0:
            kwargs["prefetch_factor"] = min(max(options.prefetch_factor, 1), 3)
        shown = "Gaudi 2 media pipeline"
    loader = loader_class(dataset, **kwargs)
    if _fell_back(loader):
        why = ("HabanaDataLoader could not start its Gaudi pipeline for these settings (it prints why) and "
               "would run torch's DataLoader")
        runtime.log_once(f"data loader: {why}; using torch DataLoader", logging.INFO)
        return toolkit.torch_dataloader(source, options, reason=why, compute_competes=False,
                                        pin_only_with_workers=chosen_here)
    lost = _lost_guarantees(path, options)
    runtime.log_once(f"data loader: {lost}: a resumed run does not replay the interrupted epoch's order. "
                     "Pass device option habana_dataloader=False for torch's DataLoader, which keeps it",
                     logging.WARNING)
    return LoaderChoice(
        loader=loader,
        implementation=f"HabanaDataLoader({shown}, shuffle={options.shuffle}, drop_last={options.drop_last}, "
                       "sharded by the loader)",
        sampler=None,
        reason=lost,
    )

"""Data loading on Gaudi: ``habana_dataloader.HabanaDataLoader`` for image folders, else torch's loader.

``HabanaDataLoader`` takes ``torch.utils.data.DataLoader``'s arguments and accelerates torchvision
``ImageFolder`` datasets (Gaudi 2 decodes JPEGs on the device's media engine; first-gen Gaudi uses a
faster host pipeline); for anything else it runs a plain torch DataLoader. The plugin therefore uses it
when the source is an `devplug.ImageFolderSource` laid out as class folders or a
torchvision ``ImageFolder``, and otherwise builds the torch loader itself, saying why once. Host memory
is pinned unless the author says otherwise (Habana's performance guide), so copies to the card are
asynchronous DMAs without an extra host copy.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import attrs

from devplug import Device, ImageFolderSource, LoaderChoice, LoaderOptions
from devplug.plugins.hpu import runtime
from devplug.toolkit import IMAGE_EXTENSIONS, image_transform, make_sampler, torch_dataloader


def image_folder_dataset(source: ImageFolderSource) -> Any:
    """A torchvision ``ImageFolder`` with the resize, crop and normalization the source describes."""
    from torchvision import datasets

    return datasets.ImageFolder(source.root, transform=image_transform(source))


def habana_dataset(source: Any, options: LoaderOptions) -> tuple[Any, str]:
    """``(dataset, "")`` when HabanaDataLoader can accelerate ``source``, else ``(None, reason)``."""
    if options.collate_fn is not None:
        return None, "HabanaDataLoader does not take a custom collate_fn"
    if isinstance(source, ImageFolderSource):
        root = Path(source.root)
        loose = root.is_dir() and any(p.suffix.lower() in IMAGE_EXTENSIONS for p in root.iterdir() if p.is_file())
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


def build_loader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """HabanaDataLoader when it is installed and applies to ``source``; else the tuned torch loader."""
    if options.pin_memory is None:
        options = attrs.evolve(options, pin_memory=True)
    dataset, reason = habana_dataset(source, options)
    loader_class = None
    if dataset is not None:
        try:
            loader_class = importlib.import_module("habana_dataloader").HabanaDataLoader
        except (ImportError, AttributeError) as exc:
            reason = (f"habana_dataloader is not available ({type(exc).__name__}: {exc}); it ships with the "
                      "Intel Gaudi PyTorch containers and installer")
    if loader_class is None:
        runtime.log_once(f"data loader: {reason}; using torch DataLoader", logging.INFO)
        return torch_dataloader(source, options, reason=reason, compute_competes=False)
    sampler = make_sampler(dataset, options)
    kwargs: dict[str, Any] = {
        "batch_size": options.batch_size,
        "num_workers": options.num_workers,
        "pin_memory": options.pin_memory,
        "drop_last": options.drop_last,
    }
    if sampler is None:
        kwargs["shuffle"] = options.shuffle
    else:
        kwargs["sampler"] = sampler
    if options.num_workers > 0 and options.prefetch_factor is not None:
        kwargs["prefetch_factor"] = options.prefetch_factor
    loader = loader_class(dataset, **kwargs)
    return LoaderChoice(
        loader=loader,
        implementation=f"HabanaDataLoader(workers={options.num_workers}, pin_memory={options.pin_memory})",
        sampler=sampler,
    )

"""Building blocks for plugin authors, stable for hook contract 1.x.

A device plugin usually differs from plain PyTorch in a few places; these let it reuse the rest:

- :func:`move_to`, :func:`map_tensors` — move modules, tensors and nested batches;
- :func:`autocast_plan` — a precision plan from ``torch.autocast`` and ``torch.amp.GradScaler``;
- :data:`TORCH_OPTIMIZERS`, :func:`torch_optimizer_class`, :func:`torch_optimizer_defaults` — standard
  optimizer names, their torch classes and defaults, to map an author's options faithfully onto a
  vendor optimizer;
- :func:`torch_dataloader`, :func:`make_sampler`, :func:`image_transform`, :class:`ImageFolderDataset`,
  :func:`list_images`, :data:`IMAGE_EXTENSIONS` — the tuned torch loader to fall back to when a faster
  loader does not apply, and the image pipeline every loader of an ``ImageFolderSource`` must match;
- :func:`process_memory_stats` — the host process's memory figure;
- :func:`log_once` — say something (a fallback and its reason) once per process (:func:`forget_logged`
  resets it in tests);
- :func:`builtin_plugin` — a built-in device plugin, to delegate to its hooks (build on ``cpu``
  rather than restate it).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from devplug.core.data import (
    IMAGE_EXTENSIONS,
    ImageFolderDataset,
    image_transform,
    list_images,
    make_sampler,
    torch_dataloader,
)
from devplug.core.manager import BUILTIN_PLUGINS
from devplug.core.recipes import (
    TORCH_OPTIMIZERS,
    autocast_plan,
    forget_logged,
    log_once,
    process_memory_stats,
    torch_optimizer_class,
    torch_optimizer_defaults,
)
from devplug.core.tree import map_tensors, move_to


def builtin_plugin(name: str) -> ModuleType:
    """The module of built-in device plugin ``name`` (``"cpu"``, ``"cuda"``, ``"hpu"``), to delegate to its hooks.

    Its public surface is its ``devplug_*`` hook functions, called with the same arguments the hook
    takes, e.g. ``toolkit.builtin_plugin("cpu").devplug_memory_stats(device=device)``.
    """
    modules = dict(BUILTIN_PLUGINS)
    if name not in modules:
        raise ValueError(f"no built-in device plugin {name!r}; built-ins: {', '.join(modules)}")
    return importlib.import_module(modules[name])


__all__ = [
    "IMAGE_EXTENSIONS",
    "TORCH_OPTIMIZERS",
    "ImageFolderDataset",
    "autocast_plan",
    "builtin_plugin",
    "forget_logged",
    "image_transform",
    "list_images",
    "log_once",
    "make_sampler",
    "map_tensors",
    "move_to",
    "process_memory_stats",
    "torch_dataloader",
    "torch_optimizer_class",
    "torch_optimizer_defaults",
]

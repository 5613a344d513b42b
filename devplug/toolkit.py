"""Building blocks for plugin authors, stable for hook contract 1.x.

A device plugin usually differs from plain PyTorch in a few places; these let it reuse the rest:

- :func:`move_to`, :func:`map_tensors` — move modules, tensors and nested batches;
- :func:`autocast_plan` — a precision plan from ``torch.autocast`` and ``torch.amp.GradScaler``;
- :func:`torch_optimizer_class`, :func:`torch_optimizer_defaults` — standard optimizer names and their
  torch defaults, to map an author's options faithfully onto a vendor optimizer;
- :func:`torch_dataloader`, :class:`ImageFolderDataset`, :func:`list_images` — the tuned torch loader to
  fall back to when a faster loader does not apply.
"""

from devplug.core.data import ImageFolderDataset, list_images, torch_dataloader
from devplug.core.fallback import autocast_plan, torch_optimizer_class, torch_optimizer_defaults
from devplug.core.tree import map_tensors, move_to

__all__ = [
    "ImageFolderDataset",
    "autocast_plan",
    "list_images",
    "map_tensors",
    "move_to",
    "torch_dataloader",
    "torch_optimizer_class",
    "torch_optimizer_defaults",
]

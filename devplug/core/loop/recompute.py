"""Activation checkpointing: blocks whose activations are recomputed in backward instead of kept.

Each instance of the named classes runs its forward under ``torch.utils.checkpoint.checkpoint``
(non-reentrant), set on the instance itself: parameter names, and so checkpoints, stay as they were,
and under FSDP the block's own unit gathers its parameters for the recomputation as for the forward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from devplug.core.errors import ConfigError


def _recomputed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(module: torch.nn.Module, classes: Sequence[type]) -> int:
    """Recompute the activations of every instance of ``classes`` inside ``module`` in backward; how many."""
    classes = tuple(classes)
    if not classes or not all(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
        raise ConfigError(f"activation_checkpointing= takes torch.nn.Module classes (e.g. [Block]), got {classes!r}")
    found = [m for m in module.modules() if isinstance(m, classes)]
    if not found:
        names = ", ".join(c.__name__ for c in classes)
        raise ConfigError(f"activation_checkpointing=[{names}]: {type(module).__name__} holds no instance of it")
    for block in found:
        if "forward" not in vars(block):  # set once, even when setup is called twice on a block
            block.forward = functools.partial(_recomputed, block.forward)
    return len(found)

"""State-dict names of compiled modules: saved without ``torch.compile``'s wrapper, loaded into either form.

``torch.compile(model)`` returns a wrapper whose state dict names every tensor ``_orig_mod.<name>`` (and a
compiled submodule adds ``_orig_mod.`` inside the name). Checkpoints store the plain names, so a
checkpoint of a compiled model loads into the uncompiled one and the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

#: The attribute under which a ``torch.compile`` wrapper holds the module it compiled.
WRAPPED = "_orig_mod"


def plain_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module a ``torch.compile`` wrapper compiled (``module`` itself when it is not one)."""
    inner = getattr(module, WRAPPED, None)
    return inner if isinstance(inner, torch.nn.Module) else module


def plain_key(name: str) -> str:
    """``name`` without the compile wrapper's parts: ``"_orig_mod.0.weight"`` → ``"0.weight"``."""
    return ".".join(part for part in name.split(".") if part != WRAPPED)


def plain_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A module's state dict under plain names (what a checkpoint stores)."""
    return {plain_key(name): value for name, value in state.items()}


def module_state(saved: Mapping[str, Any], own_names: Iterable[str]) -> dict[str, Any]:
    """A saved state dict renamed to the module's own names (compiled or not); unknown names stay plain."""
    own = {plain_key(name): name for name in own_names}
    return {own.get(plain_key(name), plain_key(name)): value for name, value in saved.items()}

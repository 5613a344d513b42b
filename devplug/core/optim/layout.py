"""Whether an optimizer that subclasses a torch.optim class keeps that class's state layout.

A subclass of ``torch.optim.Adam`` that changes only how a step runs (clipping inside ``step``, logging, a
vendor's name on torch's kernel) keeps Adam's per-parameter entries and shapes, so its state is already the
canonical form of ``"adam"`` and needs no converters. One that keeps entries of its own (or drops torch's)
does not, and `layout_problem` says how it differs. The entries torch keeps depend on a group's
options (``amsgrad``, ``momentum``, ``centered``), so the torch class is asked once per set of options, by a
step on a two-element parameter.

Treating such a subclass as canonical is safe on save: its state is compared with torch's entry by entry
before it is written as canonical, and one that differs is saved in its own layout (with the reason). On
load a fresh optimizer has no state to compare, so a subclass that reads entries of its own in ``step``
must give converters (``OptimizerChoice.to_canonical``/``from_canonical``); one that does not would have
been saved in its own layout by the same rule.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch

from devplug.core.optim.torch_optimizers import torch_optimizer_defaults

#: Per-parameter entries of torch.optim's algorithms that are scalars rather than per-element tensors.
SCALAR_STATE = ("step", "mu_product")
_PLAIN = (bool, int, float, str, type(None))


def layout_problem(optimizer: torch.optim.Optimizer, state: Mapping[str, Any],
                   cls: type[torch.optim.Optimizer], skip: tuple[str, ...] = ()) -> str:
    """How ``state`` (``optimizer.state_dict()``) differs from ``cls``'s layout; ``""`` when it does not.

    ``skip`` names group options that only pick one of torch's kernels (left out of the comparison).
    """
    ids = itertools.chain.from_iterable(g["params"] for g in state["param_groups"])
    params = dict(zip(ids, itertools.chain.from_iterable(g["params"] for g in optimizer.param_groups), strict=False))
    for group in state["param_groups"]:
        expected = torch_entries(cls, group, skip)
        for index in group["params"]:
            values = state["state"].get(index)
            if values is None:
                continue
            if expected is None:
                return f"torch.optim.{cls.__name__} does not take this parameter group's options"
            if set(values) != expected:
                return (f"parameter {index} has {sorted(values)}, torch.optim.{cls.__name__} has "
                        f"{sorted(expected)}")
            for key, value in values.items():
                shape = tuple(params[index].shape) if key not in SCALAR_STATE else ()
                if isinstance(value, torch.Tensor) and value.numel() != 1 and tuple(value.shape) != shape:
                    return f"parameter {index}'s {key} has shape {tuple(value.shape)}, torch.optim's {shape}"
    return ""


def torch_entries(cls: type[torch.optim.Optimizer], group: Mapping[str, Any],
                  skip: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The per-parameter entries ``cls`` keeps for a group with ``group``'s options (``None``: it refuses them)."""
    accepted = torch_optimizer_defaults(cls)
    options = tuple(sorted((k, v) for k, v in group.items() if k in accepted and k not in skip and _plain(v)))
    key = (cls, options)
    if key not in _PROBED:
        _PROBED[key] = _probe(cls, options)
    return _PROBED[key]


def _plain(value: Any) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value))


#: The entries each (class, options) keeps, probed once (a dict: mypy refuses a class as a cache key).
_PROBED: dict[tuple[type[torch.optim.Optimizer], tuple[tuple[str, Any], ...]], frozenset[str] | None] = {}


def _probe(cls: type[torch.optim.Optimizer], options: tuple[tuple[str, Any], ...]) -> frozenset[str] | None:
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.ones(2)
    try:
        optimizer = cls([param], **dict(options))
        optimizer.step()
    except (TypeError, ValueError, RuntimeError):
        return None
    return frozenset(optimizer.state[param])

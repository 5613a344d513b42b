"""Hyperparameters as every logger can store them: flat names, plain values."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

#: What a hyperparameter value becomes: TensorBoard, MLflow, W&B and JSON all take these.
HParam = bool | int | float | str


def flatten_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, HParam]:
    """``hparams`` with nested mappings flattened (``{"opt": {"lr": 1e-3}}`` → ``{"opt.lr": 0.001}``).

    ``bool``, ``int``, ``float`` and ``str`` are kept (a non-finite float as its string), a one-element
    tensor or numpy scalar becomes its number; ``None``, lists, tuples and other objects become their JSON
    text or ``str()``, so every logger stores the same value.
    """
    if not isinstance(hparams, Mapping):
        raise TypeError(f"hyperparameters must be a mapping of names to values, got {type(hparams).__name__}")
    flat: dict[str, HParam] = {}
    for key, value in hparams.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_hparams(value, prefix=f"{name}."))
        elif isinstance(value, (bool, int, str)):
            flat[name] = value
        elif isinstance(value, float):
            flat[name] = value if math.isfinite(value) else str(value)
        elif callable(getattr(value, "item", None)) and getattr(value, "size", None) in (1, ()):  # numpy scalar
            flat.update(flatten_hparams({key: value.item()}, prefix))
        elif callable(getattr(value, "numel", None)) and value.numel() == 1:  # a one-element tensor
            flat.update(flatten_hparams({key: value.item()}, prefix))
        else:
            flat[name] = _text(value)
    return flat


def _text(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def run_tags(**facts: str) -> dict[str, str]:
    """Facts about the run for trackers' tags: ``facts`` and the ``devplug_version``."""
    from devplug._version import __version__

    return {**facts, "devplug_version": __version__}

"""The precisions devplug knows, by name: the one place the names live.

``devplug.records.PRECISIONS``, the Trainer's and the plugins' error messages, the examples' ``--precision``
help and the docs all derive from here. A new precision is one module in this package plus one
registration line below; a plugin adds its own with ``devplug.toolkit.register_precision``.
"""

from __future__ import annotations

import torch

from devplug.core.errors import PrecisionError
from devplug.core.precision import bf16_mixed, fp8_mixed, fp16_mixed, full_32
from devplug.core.precision.base import REGISTERED as _REGISTERED
from devplug.core.precision.base import Precision

#: The setting a device plugin resolves to its best precision; not a precision itself.
AUTO = "auto"


def register(precision: Precision) -> Precision:
    """Make ``precision`` known by its name; a name already taken (or ``"auto"``) is a ``ValueError``."""
    if not isinstance(precision, Precision):
        raise ValueError(f"register a devplug Precision, not {precision!r}")
    name = precision.name
    if not isinstance(name, str) or not name.strip() or name == AUTO:
        raise ValueError(f"a precision needs a name other than {AUTO!r}, got {name!r}")
    if name in _REGISTERED:
        raise ValueError(f"precision {name!r} is already registered ({_REGISTERED[name]!r})")
    _REGISTERED[name] = precision
    return precision


def unregister(name: str) -> None:
    """Forget the precision ``name`` (a plugin being unloaded, a test's toy); unknown names are ignored."""
    _REGISTERED.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered precision names, in registration order (the built-ins first)."""
    return tuple(_REGISTERED)


def choices() -> tuple[str, ...]:
    """What ``Trainer(precision=...)`` accepts from devplug itself: ``"auto"`` and every registered name."""
    return (AUTO, *_REGISTERED)


def is_known(name: str) -> bool:
    """True when ``name`` is a registered precision (``"auto"`` is not one)."""
    return name in _REGISTERED


def find(name: str) -> Precision | None:
    """The precision registered as ``name``, or ``None`` (a plugin's own setting such as Gaudi's ``"hmp"``)."""
    return _REGISTERED.get(name) if isinstance(name, str) else None


def gather_dtype(name: str) -> torch.dtype | None:
    """The dtype FSDP gathers parameters in at precision ``name`` (``None``: fp32, also for unregistered names)."""
    precision = find(name)
    return precision.gather_dtype if precision is not None else None


def get(name: str) -> Precision:
    """The precision registered as ``name``; a one-line ``PrecisionError`` listing the known ones otherwise."""
    try:
        return _REGISTERED[name]
    except (KeyError, TypeError):
        raise PrecisionError(f"precision {name!r} is not one of {', '.join((*_REGISTERED, AUTO))}") from None


# The built-in precisions: one registration line each.
register(full_32.PRECISION)
register(fp16_mixed.PRECISION)
register(bf16_mixed.PRECISION)
register(fp8_mixed.PRECISION)

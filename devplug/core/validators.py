"""attrs validators shared by the configuration records; each error names the field and the value."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import attrs

from devplug.core.errors import ConfigError


def positive_int(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """An ``int`` (not a ``bool``) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


def non_negative_int(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """An ``int`` (not a ``bool``) of at least 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{attribute.name} must be an integer >= 0, got {value!r}")


def seconds_from_environment(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """The positive number of seconds in the variable ``name`` (``environ``, else ``os.environ``), else
    ``default``; any other value is one `ConfigError` line naming the variable (never silently the default)."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name}={raw!r} is not a positive number of seconds (e.g. {default:g} or 2.5)")
    return value

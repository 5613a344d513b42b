"""attrs validators shared by the configuration records; each error names the field and the value."""

from __future__ import annotations

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

"""The call log shared by the stand-in modules (tests read it; it is not part of any Intel API)."""

from __future__ import annotations

from typing import Any

#: Every recorded call, in order: (name, details).
CALLS: list[tuple[str, dict[str, Any]]] = []


def record(name: str, **details: Any) -> None:
    """Append one call to the log."""
    CALLS.append((name, details))


def reset() -> None:
    """Forget every recorded call."""
    CALLS.clear()


def names() -> list[str]:
    """The names of the recorded calls, in order."""
    return [name for name, _ in CALLS]


def count(name: str) -> int:
    """How many times ``name`` was recorded."""
    return sum(1 for recorded, _ in CALLS if recorded == name)


def details(name: str) -> list[dict[str, Any]]:
    """The details of every call named ``name``."""
    return [info for recorded, info in CALLS if recorded == name]

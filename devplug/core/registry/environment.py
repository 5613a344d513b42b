"""Environment variables a plugin changed while it was loading, recorded for the whole process.

``os.environ`` belongs to the user, and a plugin that sets ``CUDA_VISIBLE_DEVICES`` at import silently
changes the whole process. The manager snapshots the environment around each plugin's loading
(`snapshot`, `changes_between`) and records what changed (`record`); every change is
reported as a warning naming the plugin, and `environment_changes` lets another plugin tell the
user which plugin set a variable instead of blaming the user for it.
"""

from __future__ import annotations

import os

import attrs


@attrs.frozen
class EnvironmentChange:
    """One variable a plugin changed while loading: its value before and after (``None``: unset)."""

    variable: str
    before: str | None
    after: str | None
    plugin: str
    distribution: str

    def describe(self) -> str:
        """``CUDA_VISIBLE_DEVICES='' (was unset)``: the change in words, without who made it."""
        was = "unset" if self.before is None else repr(self.before)
        if self.after is None:
            return f"unset {self.variable} (was {was})"
        return f"{self.variable}={self.after!r} (was {was})"

    def __str__(self) -> str:
        return f"{self.describe()}, set by plugin {self.plugin!r} ({self.distribution}) while it was loading"


_recorded: dict[str, EnvironmentChange] = {}


def snapshot() -> dict[str, str]:
    """A copy of the environment now."""
    return dict(os.environ)


def changes_between(before: dict[str, str], after: dict[str, str], plugin: str,
                    distribution: str) -> list[EnvironmentChange]:
    """The variables set, changed or removed from ``before`` to ``after``, sorted by name."""
    names = sorted(set(before) | set(after))
    return [EnvironmentChange(name, before.get(name), after.get(name), plugin, distribution)
            for name in names if before.get(name) != after.get(name)]


def record(changes: list[EnvironmentChange]) -> None:
    """Remember ``changes`` for the rest of the process (a later change of a variable replaces an earlier one)."""
    _recorded.update((change.variable, change) for change in changes)


def environment_changes() -> dict[str, EnvironmentChange]:
    """Variables a plugin changed while loading that still hold the value it left, by name.

    A variable changed again since (by the user's code, say) is no longer the plugin's doing and is
    left out.
    """
    return {name: change for name, change in _recorded.items() if os.environ.get(name) == change.after}


def forget_environment_changes() -> None:
    """Forget the recorded changes (tests)."""
    _recorded.clear()

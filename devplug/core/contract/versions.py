"""Hook contract versions: what a plugin declares it needs, checked against what this devplug speaks.

A plugin declares ``DEVPLUG_CONTRACT`` at module level:

- ``"1.1"``: written for contract 1.1; works with 1.1 and every later 1.x (minors only add);
- a range in pip's specifier syntax, e.g. ``">=1.0,<3"``: works with every contract in it.

The contract version is not the devplug package version: docs/plugins.md "Contract versions" says which
devplug releases speak which contract and when each part changes.
"""

from __future__ import annotations

import re
from typing import Any

from devplug._version import __version__
from devplug.core.contract.records import CONTRACT_VERSION

_LOWER_BOUND_OPERATORS = (">=", ">", "==", "~=", "===")
_PLAIN = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6}){0,3}")


def contract_problem(declared: Any, speaks: str = CONTRACT_VERSION) -> str | None:
    """Why a plugin declaring ``declared`` cannot be loaded by a devplug speaking ``speaks`` (``None``: it can)."""
    if declared is None:
        return None
    text = str(declared).strip()
    plain, current_plain = _plain_version(text), _plain_version(speaks)
    if plain is not None and current_plain is not None:  # "1.4": compared without packaging (every built-in)
        if plain[0] == current_plain[0] and plain <= current_plain:
            return None
        if plain > current_plain:
            return (f"it needs hook contract {text!r} but devplug {__version__} speaks {speaks}: upgrade devplug "
                    "(pip install -U devplug)")
        return _too_old(text, speaks)
    from packaging.specifiers import InvalidSpecifier, SpecifierSet  # ranges only
    from packaging.version import InvalidVersion, Version

    current = Version(speaks)
    upgrade = (f"it needs hook contract {text!r} but devplug {__version__} speaks {speaks}: upgrade devplug "
               "(pip install -U devplug)")
    try:
        if any(op in text for op in "<>=!~,"):
            specifier = SpecifierSet(text)
            if current in specifier:
                return None
            needs_newer = any(
                s.operator in _LOWER_BOUND_OPERATORS and Version(s.version.rstrip(".*")) > current for s in specifier
            )
            return upgrade if needs_newer else _too_old(text, speaks)
        wanted = Version(text)
    except (InvalidSpecifier, InvalidVersion):
        return (f"it declares DEVPLUG_CONTRACT = {declared!r}, which is not a version; declare 'MAJOR.MINOR' "
                "(e.g. '1.1') or a range (e.g. '>=1.0,<3')")
    if wanted.major == current.major and wanted <= current:
        return None
    return upgrade if wanted > current else _too_old(text, speaks)


def _plain_version(text: str) -> tuple[int, ...] | None:
    """``"1.4"`` as ``(1, 4)`` (trailing zeros dropped, as packaging compares); ``None`` for anything else."""
    if not _PLAIN.fullmatch(text):
        return None
    parts = [int(part) for part in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _too_old(declared: str, speaks: str) -> str:
    return (f"it declares hook contract {declared!r}, which devplug {__version__} (contract {speaks}) no longer "
            "speaks: install a release of the plugin built for this devplug's contract")

"""Peak FLOP/s measured once per machine and kept on disk, so no run measures on its critical path.

A measured peak follows the machine's load: measured on every run, a busy host lowers it and MFU jumps.
Measured once, on first need, and cached per machine (keyed by the device's model, the threads torch
uses, the number format and the torch version) every later run reports against the same figure. The
cache is one JSON file in ``$DEVPLUG_CACHE_DIR``, else ``$XDG_CACHE_HOME/devplug``, else
``~/.cache/devplug``; it is written atomically (a temporary file, then ``os.replace``), and a damaged
file is ignored and rewritten.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("devplug")

#: The variable that relocates devplug's cache folder.
CACHE_ENV = "DEVPLUG_CACHE_DIR"
#: The file of cached peaks inside the cache folder.
PEAKS_FILE = "peaks.json"


def cache_dir() -> Path:
    """devplug's cache folder: ``$DEVPLUG_CACHE_DIR``, ``$XDG_CACHE_HOME/devplug`` or ``~/.cache/devplug``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "devplug"


def _usable(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when the file is missing, damaged or holds something else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_object(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` as JSON, atomically (a reader sees the old file or the new one, never half);
    no temporary file is left behind on an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def read_peaks(path: Path) -> dict[str, float]:
    """The cached peaks in ``path``; empty when it is missing or damaged (unusable entries are dropped)."""
    return {str(k): float(v) for k, v in read_json_object(path).items() if _usable(v)}


def write_peaks(path: Path, peaks: dict[str, float]) -> None:
    """Write ``peaks`` to ``path`` atomically (a reader sees the old file or the new one, never half)."""
    write_json_object(path, peaks)


def cached_peak(key: str, measure: Callable[[], float], *, folder: Path | None = None) -> float:
    """The peak cached under ``key``; measured with ``measure()`` and cached when absent (once per machine).

    A cache that cannot be written (read-only home) costs a warning; the measured figure is still returned.
    """
    path = (folder or cache_dir()) / PEAKS_FILE
    peaks = read_peaks(path)
    if key in peaks:
        return peaks[key]
    value = float(measure())
    if not _usable(value):
        return value
    peaks[key] = value
    try:
        write_peaks(path, peaks)
    except OSError as exc:
        log.warning("the measured peak was not cached in %s (%s): the next run measures again", path, exc)
    return value

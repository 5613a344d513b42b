"""The summary of a run: a read-only mapping that prints as a short table and converts to JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

import attrs


class RunSummary(Mapping[str, Any]):
    """What ``Trainer.summary()`` returns: ``summary["steps"]`` reads a value, ``print(summary)`` shows a table.

    A read-only mapping of the run's figures (device, precision, optimizers, loaders, steps, throughput,
    efficiency, memory, stop reason, last checkpoint). ``to_dict()`` gives plain JSON-serialisable values
    (records such as the memory statistics become dicts); ``to_json()`` the JSON text. ``shown=False`` (on
    ranks other than 0, unless asked for every rank) prints as an empty string, so that
    ``print(trainer.summary())`` in a script every rank runs shows one table, not one per rank.
    """

    def __init__(self, values: Mapping[str, Any], *, shown: bool = True) -> None:
        self._values = dict(values)
        self.shown = shown

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"RunSummary({self._values!r})"

    def __str__(self) -> str:
        return format_table(self._values) if self.shown else ""

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain values: dicts, lists, strings, numbers, ``None`` (``json.dumps`` takes it)."""
        return {key: plain(value) for key, value in self._values.items()}

    def to_json(self, **kwargs: Any) -> str:
        """``to_dict()`` as JSON text (``kwargs`` go to ``json.dumps``, e.g. ``indent=2``)."""
        return json.dumps(self.to_dict(), **kwargs)


def plain(value: Any) -> Any:
    """``value`` as JSON-serialisable data: records and mappings to dicts, sequences to lists, NaN/inf to text."""
    if attrs.has(type(value)):
        return plain(attrs.asdict(value, recurse=False))
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def format_table(values: Mapping[str, Any]) -> str:
    """One aligned ``name  value`` line per figure; nested mappings one line per entry, ``None`` left out."""
    rows: list[tuple[str, str]] = []
    for key, value in values.items():
        if value is None or value == {} or value == []:
            continue
        if attrs.has(type(value)):
            value = {k: v for k, v in attrs.asdict(value, recurse=False).items() if v is not None}
        if isinstance(value, Mapping):
            rows.extend((f"{key}.{name}", _cell(key, item)) for name, item in value.items())
        else:
            rows.append((key, _cell(key, value)))
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"{name:<{width}}  {text}" for name, text in rows)


def format_flops(value: float) -> str:
    """``value`` FLOP/s with a unit people read: ``"166.2 GFLOP/s"``, ``"989.4 TFLOP/s"``."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}FLOP/s"
    return f"{value:.4g} FLOP/s"


def _cell(key: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key in ("mfu", "data_wait", "gemm_fraction"):
        return f"{value * 100:.3g}%"
    if key.endswith("_flops") and key != "flops_per_sample":  # rates: peak, achieved, a plain GEMM's
        return format_flops(value)
    if key == "memory" or "bytes" in key:
        return f"{value / 2**20:,.1f} MiB"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"

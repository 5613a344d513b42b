"""Stand-in for ``habana_frameworks.torch.hpex.hmp``, Habana Mixed Precision (deprecated by Intel).

``convert`` is the real signature; the real one patches torch functions process-wide so listed ops cast
their inputs to bf16 or fp32. HMP was removed before release 1.19, so no bridge source of that release
has it; the op lists apply at ``O1`` only, as Lightning's HPU precision plugin documents for the
arguments it passes to ``hmp.convert`` (Lightning-AI/pytorch-lightning commit b2b6c810,
``src/lightning/pytorch/plugins/precision/hpu.py`` lines 33-35: "Path to bf16 ops list in hmp O1
mode"). The stand-in records the call with the op lists it used (read from the files at ``O1``, none
at ``O2``) and patches nothing. ``disable_casts`` records entering and leaving.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import hpu_standin_calls


def _ops(path: str) -> list[str] | None:
    """An op list file, one name a line, as ``hmp.convert`` reads it at O1 (Lightning hpu.py lines 33-35)."""
    return Path(path).read_text().splitlines() if path else None


def convert(opt_level: str = "O1", bf16_file_path: str = "", fp32_file_path: str = "", isVerbose: bool = False) -> None:
    """Insert bf16/fp32 casts in front of torch ops (signature as Lightning-AI/pytorch-lightning b2b6c810,
    src/lightning/pytorch/plugins/precision/hpu.py, calls it; lists read at O1 only, lines 33-35)."""
    assert opt_level in ("O1", "O2"), "Optlevel should be either O1 or O2"
    hpu_standin_calls.record(
        "hmp.convert", opt_level=opt_level, bf16_ops=_ops(bf16_file_path) if opt_level == "O1" else None,
        fp32_ops=_ops(fp32_file_path) if opt_level == "O1" else None,
        isVerbose=isVerbose,
    )


@contextlib.contextmanager
def disable_casts() -> Iterator[None]:
    """A context in which HMP inserts no casts, used as ``with hmp.disable_casts(): optimizer.step()`` in
    Habana's model references. HMP's own source (releases before 1.13) is not public in the bridge repository."""
    hpu_standin_calls.record("hmp.disable_casts.enter")
    try:
        yield
    finally:
        hpu_standin_calls.record("hmp.disable_casts.exit")

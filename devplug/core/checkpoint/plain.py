"""The plain checkpoint format: one ``.pt`` file the main process writes atomically, with a digest.

It loads into any run: as it is into one process or DDP, and into sharded (FSDP) modules and optimizers
through torch's distributed state-dict API, each rank taking its shards of the full tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devplug.core.checkpoint.format import CheckpointFormat, TrainingRun


def holds_distributed_tensors(run: TrainingRun) -> bool:
    """True when any set-up module's parameters are distributed tensors (sharded or otherwise placed)."""
    return any(hasattr(p, "placements") for m in run.modules.values() for p in m.parameters())


class PlainFile(CheckpointFormat):
    """One file per checkpoint (``torch.save`` of the canonical state), written by the main process."""

    name = "plain"

    def save(self, run: TrainingRun, path: Path, extra: Mapping[str, Any], *, main: bool,
             async_save: bool = False) -> str | None:
        """Write the file on the main process (always at once); the path, ``None`` on the other ranks."""
        return run.save(path, extra) if main else None

    def load(self, run: TrainingRun, path: Path) -> dict[str, Any]:
        """Check the file against ``run``, then restore it (all or nothing); its ``extra``."""
        if holds_distributed_tensors(run):
            from devplug.core.checkpoint.sharded_state import load_plain_into_sharded

            return load_plain_into_sharded(run, path)
        return run.load(path)

    def recognises(self, path: Path) -> bool:
        """True for a file."""
        return path.is_file()

    def check(self, path: Path) -> None:
        """Read the file and check its digest."""
        from devplug.core.checkpoint.file import read_checkpoint

        read_checkpoint(path)

"""The sharded checkpoint format: a folder every rank writes its shards into with torch's DCP.

A manifest of digests, a metadata reader that runs nothing, the loop state in a small file, and a rename
into place once every rank has written (`devplug.core.checkpoint.sharded`). It loads on any world size
and strategy, sharded or not (`devplug.core.checkpoint.sharded_state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devplug.core.checkpoint.format import CheckpointFormat, TrainingRun
from devplug.core.checkpoint.sharded import ShardedWriter, is_sharded_checkpoint, read_state


class ShardedFolder(CheckpointFormat):
    """A DCP folder per checkpoint; saving and loading are collectives (every rank calls them)."""

    name = "sharded"
    collective = True

    def __init__(self) -> None:
        self.writer = ShardedWriter()

    def save(self, run: TrainingRun, path: Path, extra: Mapping[str, Any], *, main: bool,
             async_save: bool = False) -> str | None:
        """Write this rank's shards (in the background with ``async_save``); the path, on every rank."""
        from devplug.core.checkpoint.sharded_state import save_sharded

        return save_sharded(run, self.writer, path, extra, async_save=async_save)

    def load(self, run: TrainingRun, path: Path) -> dict[str, Any]:
        """Check the folder's fit with ``run``, then read this rank's part of every tensor; its ``extra``."""
        from devplug.core.checkpoint.sharded_state import load_sharded

        return load_sharded(run, path)

    def recognises(self, path: Path) -> bool:
        """True for a complete sharded folder (DCP metadata and the state file)."""
        return is_sharded_checkpoint(path)

    def check(self, path: Path) -> None:
        """Check the folder against its manifest and read its state file."""
        read_state(path)

    def wait(self) -> None:
        """Wait for a background save to finish (its failure is raised here)."""
        self.writer.wait()

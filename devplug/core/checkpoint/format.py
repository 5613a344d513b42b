"""A checkpoint format: how one checkpoint is written, read back, recognised, checked and removed.

A run holds one format, chosen once (by its strategy, or ``Trainer(checkpoint_format=...)``): the plain
file (`devplug.core.checkpoint.plain`, rank 0 writes one ``.pt``) or the sharded folder
(`devplug.core.checkpoint.sharded_folder`, every rank writes its shards with torch's DCP). Loading asks
the checkpoint itself: the registered format that recognises the path reads it, so a run loads any
format it can hold, whatever it saves.

A new format (safetensors weights, a remote store) is one module with a `CheckpointFormat` subclass
plus one line: an entry in ``BUILT_IN`` for a built-in, or ``register_format(MyFormat)`` for one of
your own. Its name must not be a registered one.
"""

from __future__ import annotations

import abc
import importlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from devplug.core.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    import torch


class TrainingRun(Protocol):
    """What a format reads and writes: the Trainer's modules, optimizers, scaler and loop position.

    The Trainer's state (``TrainerState``) is one; a format uses these and writes nothing else of the run.
    Its ``load`` restores the objects ``registered`` for checkpointing with the rest, all or nothing, and sets
    ``registered_restored``; after a format's load that did not, the Trainer restores them itself.
    """

    registered_restored: bool

    @property
    def modules(self) -> Mapping[str, torch.nn.Module]: ...
    @property
    def optimizers(self) -> Mapping[str, Any]: ...
    @property
    def scaler(self) -> Any: ...
    @property
    def device(self) -> Any: ...
    @property
    def registered(self) -> Mapping[str, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...
    def loop_state(self) -> dict[str, Any]: ...
    def named_tensors(self) -> list[tuple[str, torch.Tensor]]: ...
    def device_rng(self) -> Any: ...
    def save(self, path: str | os.PathLike[str], extra: Mapping[str, Any]) -> str: ...
    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]: ...
    def resume_points(self, state: Mapping[str, Any], path: Any = None) -> dict[int, Any]: ...
    def continue_from(self, state: Mapping[str, Any], points: dict[int, Any]) -> dict[str, Any]: ...


class CheckpointFormat(abc.ABC):
    """One way of storing a checkpoint. Subclasses set ``name`` and implement save, load and recognises.

    ``collective``: every rank takes part in a save and a load (each writes and reads its own part);
    otherwise the main process writes alone and a load reads the whole checkpoint on each rank.
    """

    name: ClassVar[str]
    collective: ClassVar[bool] = False

    @abc.abstractmethod
    def save(self, run: TrainingRun, path: Path, extra: Mapping[str, Any], *, main: bool,
             async_save: bool = False) -> str | None:
        """Write ``run`` and the author's ``extra`` to ``path`` atomically; the path, or ``None`` where this
        rank writes nothing. Raises `NonFiniteLossError`, writing nothing, when the state holds NaN or inf."""

    @abc.abstractmethod
    def load(self, run: TrainingRun, path: Path) -> dict[str, Any]:
        """Check the checkpoint at ``path`` against ``run``, then restore it; the author's ``extra``."""

    @abc.abstractmethod
    def recognises(self, path: Path) -> bool:
        """True when ``path`` is one complete checkpoint of this format (cheap: no tensor is read)."""

    def check(self, path: Path) -> None:
        """Raise a one-line `CheckpointError` unless ``path`` reads intact (without loading it into a run).

        By default only that it is there: a format that can check more (a digest, a manifest) does.
        """
        if not self.recognises(path):
            raise CheckpointError(f"{str(path)!r} is not a complete {self.name} checkpoint")

    def remove(self, path: Path) -> None:
        """Delete the checkpoint at ``path`` (a file or a folder)."""
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def wait(self) -> None:
        """Block until a save still being written in the background is complete (none by default)."""
        return None


#: The built-in formats: name → ``"module:Class"``, imported when first used.
BUILT_IN: dict[str, str] = {
    "plain": "devplug.core.checkpoint.plain:PlainFile",
    "sharded": "devplug.core.checkpoint.sharded_folder:ShardedFolder",
}
_registered: dict[str, type[CheckpointFormat]] = {}


def register_format(cls: type[CheckpointFormat]) -> type[CheckpointFormat]:
    """Make ``cls`` available by its ``name`` (usable as a class decorator); a taken name is a `ConfigError`."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"checkpoint format {cls.__name__} has no name: set name = '...' on the class")
    if name in BUILT_IN or (name in _registered and _registered[name] is not cls):
        raise ConfigError(f"a checkpoint format named {name!r} is already registered; choose another name")
    _registered[name] = cls
    return cls


def unregister_format(name: str) -> None:
    """Forget the format registered as ``name`` (built-ins stay)."""
    _registered.pop(name, None)


def format_names() -> tuple[str, ...]:
    """The names of every available format, built-ins first."""
    return (*BUILT_IN, *_registered)


def _class(name: str) -> type[CheckpointFormat]:
    if name in _registered:
        return _registered[name]
    if name not in BUILT_IN:
        raise ConfigError(f"unknown checkpoint format {name!r}; available: {', '.join(format_names())}")
    module, attr = BUILT_IN[name].split(":")
    cls: type[CheckpointFormat] = getattr(importlib.import_module(module), attr)
    return cls


def format_named(name: str) -> CheckpointFormat:
    """A new instance of the format registered as ``name``; an unknown name is a `ConfigError`."""
    return _class(name)()


def format_of(path: str | os.PathLike[str], held: CheckpointFormat | None = None) -> CheckpointFormat:
    """The format that reads the checkpoint at ``path``: ``held`` (the run's own) when it recognises it,
    else the last registered one that does; a path none recognises goes to the sharded folder if it is a
    folder (whose load says what it lacks), else to the plain file (whose load says what is wrong)."""
    target = Path(path)
    if held is not None and held.recognises(target):
        return held
    for name in reversed(format_names()):
        candidate = held if held is not None and held.name == name else format_named(name)
        if candidate.recognises(target):
            return candidate
    fallback = "sharded" if target.is_dir() else "plain"
    return held if held is not None and held.name == fallback else format_named(fallback)


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True when some registered format recognises ``path`` as one complete checkpoint."""
    target = Path(path)
    return any(format_named(name).recognises(target) for name in format_names())

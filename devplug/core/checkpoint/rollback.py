"""Restoring a checkpoint all or nothing: each part's state is kept just before it is restored, and put back
when a later part fails.

What is kept, per part: an optimizer restored through torch's ``Optimizer.load_state_dict`` only its
``state`` and ``param_groups`` containers (that method builds new ones and never changes the old, so no
tensor is copied); a module or a tensor a copy of its tensors in host memory (restoring copies into them in
place); any other object registered for checkpointing (an LR scheduler, the author's own) a deep copy of its
``state_dict()``, small for the objects people register. Tensors are copied to host memory, not beside
themselves on the device, so a load never needs twice a model's device memory.

A sharded load (models too large for one device) copies no tensor: everything is checked, and the parts
that are cheap to keep are restored, before the checkpoint's tensors are read into the run's own; only a
read that fails half-way (an I/O error) can leave them part-loaded, and its error says so.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from devplug.core.errors import CheckpointError


def _host_copies(tensors: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}


def _copy_into(tensors: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    with torch.no_grad():
        for key, tensor in tensors.items():
            tensor.copy_(saved[key])


def _copy_back(module: torch.nn.Module, saved: Mapping[str, Any]) -> None:
    """Put ``saved`` back into the tensors ``module`` holds now (in place, bypassing its load hooks)."""
    _copy_into(module.state_dict(), saved)


def _on_host(value: Any) -> Any:
    """A deep copy of ``value`` (dicts, lists, tuples and leaves) with every tensor copied to host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_on_host(v) for v in value)
    return copy.deepcopy(value)


def _plain_optimizer(obj: Any) -> bool:
    """True for an optimizer whose ``load_state_dict`` is torch's (it replaces its containers, changing none)."""
    return isinstance(obj, torch.optim.Optimizer) and type(obj).load_state_dict is torch.optim.Optimizer.load_state_dict


class Rollback:
    """The parts of a run restored so far, and how to put each back as it was (newest first)."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []
        #: what is being written that cannot be put back (``None`` until then): a failure names it
        self.exposed: str | None = None

    def keep_optimizer(self, optimizer: torch.optim.Optimizer, what: str = "an optimizer") -> None:
        """Keep ``optimizer``'s state and parameter groups before torch's ``load_state_dict`` replaces them."""
        before = {"state": optimizer.state, "param_groups": optimizer.param_groups}
        self._undo.append((what, functools.partial(optimizer.__setstate__, before)))

    def keep_optimizer_entries(self, optimizer: torch.optim.Optimizer, what: str = "an optimizer") -> None:
        """Keep ``optimizer``'s containers and what they hold (torch's state-dict helpers add state to them in
        place, and a sharded load updates group settings in place); its state tensors are not copied."""
        state, groups = optimizer.state, optimizer.param_groups
        entries, settings = {param: dict(values) for param, values in state.items()}, [dict(g) for g in groups]

        def put_back() -> None:
            optimizer.__setstate__({"state": state, "param_groups": groups})
            state.clear()
            state.update(entries)
            for group, saved in zip(groups, settings, strict=True):
                group.clear()
                group.update(saved)

        self._undo.append((what, put_back))

    def keep_module(self, module: torch.nn.Module, what: str = "a module") -> None:
        """Keep host copies of ``module``'s tensors (its load copies into them in place)."""
        saved = _host_copies(module.state_dict())
        self._undo.append((what, functools.partial(_copy_back, module, saved)))

    def keep_tensor(self, tensor: torch.Tensor, what: str = "a tensor") -> None:
        """Keep a host copy of ``tensor`` (restored in place)."""
        saved = tensor.detach().to("cpu", copy=True)
        self._undo.append((what, functools.partial(_copy_into, {"": tensor}, {"": saved})))

    def keep_stateful(self, obj: Any, what: str) -> None:
        """Keep a deep copy of ``obj.state_dict()``, to hand back to its ``load_state_dict``.

        An optimizer's tensors are copied to host memory (its ``load_state_dict`` moves them to its parameters'
        device); another object's stay where they are, as it may keep what it is given.
        """
        state = obj.state_dict()
        try:
            state = _on_host(state) if isinstance(obj, torch.optim.Optimizer) else copy.deepcopy(state)
        except Exception:  # a state that cannot be copied is kept as the object gave it
            pass
        self._undo.append((what, functools.partial(obj.load_state_dict, state)))

    def keep(self, obj: Any, what: str) -> None:
        """Keep ``obj`` (a tensor, a module, an optimizer or any object with ``state_dict``) the cheapest safe way."""
        if isinstance(obj, torch.Tensor):
            self.keep_tensor(obj, what)
        elif _plain_optimizer(obj):
            self.keep_optimizer(obj, what)
        elif isinstance(obj, torch.nn.Module) and all(isinstance(v, torch.Tensor) for v in obj.state_dict().values()):
            self.keep_module(obj, what)
        else:
            self.keep_stateful(obj, what)

    def on_undo(self, what: str, action: Callable[[], None]) -> None:
        """Call ``action`` to put ``what`` back if the restore fails."""
        self._undo.append((what, action))

    def undo(self) -> list[str]:
        """Put every kept part back, newest first; what could not be put back (``[]`` when all was)."""
        failed = []
        for what, action in reversed(self._undo):
            try:
                action()
            except Exception as exc:  # the others are still put back, and the error names it
                failed.append(f"{what} ({' '.join(str(exc).split())[:100] or type(exc).__name__})")
        self._undo.clear()
        return failed


def restore_registered(registered: Mapping[str, Any], extra: Mapping[str, Any], rollback: Rollback) -> None:
    """Restore each object registered for checkpointing whose state ``extra`` holds (a tensor in place, any other
    through its ``load_state_dict``), keeping it in ``rollback`` first; a failure names the object."""
    for name, obj in registered.items():
        if name not in extra:
            continue
        rollback.keep(obj, f"registered object {name!r}")
        try:
            if isinstance(obj, torch.Tensor):
                with torch.no_grad():
                    obj.copy_(extra[name])
            else:
                obj.load_state_dict(extra[name])
        except Exception as exc:
            raise _Named(f"registered object {name!r}: {' '.join(str(exc).split()) or type(exc).__name__}") from exc


def restore_scaler_and_rng(scaler: Any, state: Mapping[str, Any], device_module: Any, rollback: Rollback) -> None:
    """Restore the grad scaler (where the run and ``state`` both have one) and the RNG states from ``state``,
    keeping each in ``rollback`` first."""
    from devplug.core.checkpoint import rng

    if scaler is not None and state["scaler"]:
        rollback.keep_stateful(scaler, "the grad scaler")
        scaler.load_state_dict(state["scaler"])
    before = rng.rng_state(device_module)
    rollback.on_undo("the RNG states", lambda: rng.restore_rng_state(before, device_module))
    rng.restore_rng_state(state["rng"], device_module)


class _Named(Exception):
    """A restore step's failure, already worded with the part that failed."""


@contextlib.contextmanager
def all_or_nothing(path: Any) -> Iterator[Rollback]:
    """Restore a checkpoint inside: on any failure the kept parts are put back and one `CheckpointError` line says
    what failed (a `CheckpointError` raised inside keeps its class, so a mismatch stays a mismatch)."""
    rollback = Rollback()
    try:
        yield rollback
    except Exception as exc:
        failed = rollback.undo()
        cause = exc.__cause__ if isinstance(exc, _Named) and exc.__cause__ is not None else exc
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        if isinstance(exc, CheckpointError) and not failed and rollback.exposed is None:
            raise  # already one line about this checkpoint, and everything was put back
        kind = type(exc) if isinstance(exc, CheckpointError) else CheckpointError
        if rollback.exposed is not None:
            failed.insert(0, rollback.exposed)
        if failed:
            raise kind(f"checkpoint {str(path)!r} could not be restored ({reason}), and {', '.join(failed)} could not "
                       "be put back: load a checkpoint that fits before training on, or restart the run") from cause
        raise kind(f"checkpoint {str(path)!r} could not be restored, and nothing was changed: {reason}") from cause

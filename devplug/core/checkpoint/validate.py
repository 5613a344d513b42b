"""Checking a checkpoint against the training setup before anything is restored.

Every module key and tensor shape, every optimizer's algorithm, layout, parameter groups and state tensor
shapes, the counters (non-negative integers), the loader positions, the RNG states and the grad scaler:
all problems are collected and raised as one `CheckpointError` line, and nothing has changed. Then
each optimizer's state, as the checkpoint holds it and as its implementation's converter turns it, is
checked for what its algorithm can never hold (`devplug.core.optim.invariants`), naming the
implementation that produced it; a save checks the same before writing anything.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

from devplug.core.checkpoint.finite import nonfinite
from devplug.core.contract.records import OptimizerChoice
from devplug.core.errors import CheckpointError, CheckpointMismatchError
from devplug.core.optim.canonical import CANONICAL, state_problems
from devplug.core.optim.invariants import invariant_problems

_LOADER_KEYS = {"seed", "drawn", "samples", "world_size", "sharded"}


def _count(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def counter_problems(state: Mapping[str, Any]) -> list[str]:
    """Counters, loader positions, RNG states, scaler and extra state that are not what a save writes."""
    problems = [f"{key} is {state[key]!r}, not a non-negative integer"
                for key in ("global_step", "epoch", "batches_in_epoch") if not _count(state[key])]
    if not _count(state["world_size"], 1):
        problems.append(f"world_size is {state['world_size']!r}, not a positive integer")
    loaders = state["loaders"]
    if not isinstance(loaders, list) or not all(isinstance(e, Mapping) and set(e) == _LOADER_KEYS for e in loaders):
        problems.append("its loader positions are not what Trainer.save() writes")
    else:
        for n, entry in enumerate(loaders):
            samples_ok = entry["samples"] is None or _count(entry["samples"])
            seed_ok = isinstance(entry["seed"], int) and not isinstance(entry["seed"], bool)
            if not (seed_ok and _count(entry["drawn"]) and _count(entry["world_size"], 1)
                    and samples_ok and isinstance(entry["sharded"], bool)):
                problems.append(f"training loader {n} has position {dict(entry)!r}")
    problems += rng_problems(state["rng"])
    if state["scaler"] is not None and not isinstance(state["scaler"], Mapping):
        problems.append("its grad scaler state is not a dict")
    if not isinstance(state["extra"], Mapping):
        problems.append("its extra state is not a dict")
    return problems


def rng_problems(saved: Any) -> list[str]:
    """Why ``saved`` is not an RNG state `devplug.core.checkpoint.rng.rng_state` wrote ([] when it is)."""
    if not isinstance(saved, Mapping) or "python" not in saved or "torch" not in saved:
        return ["its RNG state is incomplete"]
    python = saved["python"]
    try:
        version, internal, gauss = python
        random.Random().setstate((version, tuple(internal), gauss))
    except (TypeError, ValueError, OverflowError):
        return ["its Python RNG state is not one Python wrote"]
    cpu, now = saved["torch"], torch.get_rng_state()
    if not isinstance(cpu, torch.Tensor) or cpu.dtype != now.dtype or cpu.shape != now.shape:
        return ["its torch RNG state is not one torch wrote"]
    device = saved.get("device")
    if device is not None and not (isinstance(device, list) and all(isinstance(t, torch.Tensor) for t in device)):
        return ["its device RNG state is not a list of tensors"]
    return []


def module_problems(saved_modules: Any, modules: Mapping[str, torch.nn.Module]) -> list[str]:
    """Module names, tensor names and shapes that differ between the checkpoint and the set-up modules."""
    if not isinstance(saved_modules, Mapping):
        return ["its modules are not a dict"]
    problems = []
    not_set_up, not_saved = sorted(set(saved_modules) - set(modules)), sorted(set(modules) - set(saved_modules))
    if not_set_up:
        problems.append(f"module(s) {not_set_up} of the checkpoint would not be restored: no module of that name "
                        f"was passed to trainer.setup() (set up: {sorted(modules) or 'none'}); set each up with "
                        "trainer.setup(model, name=...) before load()")
    if not_saved:
        problems.append(f"set-up module(s) {not_saved} are not in the checkpoint")
    for key, module in modules.items():
        saved = saved_modules.get(key)
        if saved is None:
            continue
        if not isinstance(saved, Mapping):
            problems.append(f"module {key!r} is not a state dict")
            continue
        current = module.state_dict()
        missing, unexpected = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
        if missing or unexpected:
            problems.append(f"module {key!r}: missing {missing[:3]}, unexpected {unexpected[:3]}")
            continue
        for pname, tensor in current.items():
            value = saved[pname]
            if not isinstance(value, torch.Tensor):
                problems.append(f"{key}.{pname} is a {type(value).__name__}, not a tensor")
                break
            if tuple(value.shape) != tuple(tensor.shape):
                problems.append(f"{key}.{pname} has shape {tuple(value.shape)}, model has {tuple(tensor.shape)}")
                break
    return problems


def registered_problems(extra: Any, registered: Mapping[str, Any]) -> list[str]:
    """Tensors registered for checkpointing whose saved value is not a tensor of their shape ([] when none).

    A tensor is restored in place, which would broadcast a smaller saved one into it, or fail after the
    modules were restored: either is refused before anything is restored.
    """
    if not isinstance(extra, Mapping):
        return []
    problems = []
    for name, tensor in registered.items():
        if not isinstance(tensor, torch.Tensor) or name not in extra:
            continue
        saved = extra[name]
        if not isinstance(saved, torch.Tensor):
            problems.append(f"registered tensor {name!r} is a {type(saved).__name__} there")
        elif tuple(saved.shape) != tuple(tensor.shape):
            problems.append(f"registered tensor {name!r} has shape {tuple(saved.shape)} there, "
                            f"{tuple(tensor.shape)} here")
    return problems


def check_matches(state: Mapping[str, Any], modules: Mapping[str, torch.nn.Module],
                  optimizers: Mapping[str, OptimizerChoice], path: Any,
                  registered: Mapping[str, Any] | None = None) -> None:
    """Raise one CheckpointError line listing every difference between ``state`` and the setup; change nothing.

    ``registered``: the objects registered for checkpointing (their tensors' shapes are compared too).
    """
    problems = counter_problems(state) + module_problems(state["modules"], modules)
    problems += registered_problems(state["extra"], registered or {})
    saved_optimizers = state["optimizers"]
    if not isinstance(saved_optimizers, Mapping):
        problems.append("its optimizers are not a dict")
    else:
        if sorted(saved_optimizers) != sorted(optimizers):
            missing = sorted(set(saved_optimizers) - set(optimizers))
            advice = (f" (build {', '.join(map(repr, missing))} with trainer.optimizer(...) before load(); for "
                      "inference alone, read the weights: torch.load(path, weights_only=True)['modules'][name])"
                      ) if missing else ""
            problems.append(f"optimizers {sorted(saved_optimizers)} vs built {sorted(optimizers)}{advice}")
        for key, choice in optimizers.items():
            if key in saved_optimizers:
                problems += state_problems(choice, saved_optimizers[key], key)
    if problems:
        text = "; ".join(" ".join(p.split()) for p in problems)
        raise CheckpointMismatchError(f"checkpoint {str(path)!r} does not match this training setup: {text}")


def impossible_state(key: str, algorithm: str, state: Mapping[str, Any], producer: str) -> str:
    """One line saying why ``state`` cannot be ``algorithm``'s and who produced it (``""`` when it can be)."""
    problems = invariant_problems(algorithm, state, nonfinite)
    if not problems:
        return ""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"optimizer {key!r}: the {algorithm} state {producer} is impossible: {problems[0]}{more}"


def _built_by(choice: OptimizerChoice) -> str:
    return f" of {choice.built_by}" if choice.built_by else ""


def check_saved_optimizers(entries: Mapping[str, Mapping[str, Any]], optimizers: Mapping[str, OptimizerChoice],
                           path: Any) -> None:
    """Raise `CheckpointError` when a canonical state about to be written breaks its algorithm."""
    problems = []
    for key, choice in optimizers.items():
        entry = entries[key]
        if entry["layout"] == CANONICAL:
            via = "'s to_canonical" if choice.to_canonical is not None else ""
            problems.append(impossible_state(key, choice.algorithm, entry["state"],
                                             f"from {choice.implementation}{via}{_built_by(choice)}"))
    text = "; ".join(p for p in problems if p)
    if text:
        raise CheckpointError(f"not saving checkpoint {str(path)!r}, the earlier checkpoints are kept: {text}; "
                              "report this to the maintainers of the plugin named")


def check_loaded_optimizers(saved: Mapping[str, Mapping[str, Any]], natives: Mapping[str, Mapping[str, Any]],
                            optimizers: Mapping[str, OptimizerChoice], path: Any) -> None:
    """Raise `CheckpointError` when a saved state, or what a ``from_canonical`` made of it, breaks its algorithm.

    Called after `check_matches` and the conversions, before anything is restored.
    """
    problems = []
    for key, choice in optimizers.items():
        entry = saved[key]
        if entry["layout"] != CANONICAL:  # an implementation's own layout: its entries mean what it says
            continue
        problem = impossible_state(key, choice.algorithm, entry["state"], f"written by {entry['implementation']}")
        if not problem and choice.from_canonical is not None:
            problem = impossible_state(key, choice.algorithm, natives[key],
                                       f"that {choice.implementation}'s from_canonical{_built_by(choice)} made "
                                       f"of a valid one")
        problems.append(problem)
    text = "; ".join(p for p in problems if p)
    if text:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be restored, and nothing was changed: {text}")

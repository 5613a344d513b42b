"""Optimizer state in checkpoints: the canonical, implementation-neutral form and the moves in and out of it.

The canonical form of an optimizer's state is torch.optim's ``state_dict()`` layout for its algorithm:
per-parameter state (``step`` as a float32 scalar tensor, ``exp_avg``, ``exp_avg_sq``,
``momentum_buffer`` ...) and, in each parameter group, torch's hyperparameters (``lr``, ``betas``,
``weight_decay``, ``decoupled_weight_decay`` ...) without the keys that only pick one of torch's kernels
(``foreach``, ``fused``, ``capturable``, ``differentiable``). The plugin that built an optimizer converts
its own layout to and from it (``OptimizerChoice.to_canonical`` / ``from_canonical``); torch.optim
optimizers are canonical already, and so are subclasses of a torch.optim class that keep its entries and
shapes (`.layout`).

A checkpoint's entry for one optimizer (`export_state`) is
``{"algorithm", "implementation", "layout": "canonical" | "native", "state", "reason"}``: ``native`` when
the state has no canonical form (an algorithm torch lacks, such as LAMB, or a state the plugin could
not convert), and then only the same implementation loads it (`import_state`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import torch

from devplug.core.contract.records import OptimizerChoice
from devplug.core.errors import CheckpointError
from devplug.core.optim.layout import SCALAR_STATE, layout_problem
from devplug.core.optim.torch_optimizers import TORCH_OPTIMIZERS, torch_optimizer_defaults

#: Parameter-group keys that choose among torch's kernels rather than describe the algorithm.
IMPLEMENTATION_KEYS = ("foreach", "fused", "capturable", "differentiable")
CANONICAL, NATIVE = "canonical", "native"


def canonical_class(algorithm: str) -> type[torch.optim.Optimizer] | None:
    """The torch.optim class whose layout is the canonical form of ``algorithm``; ``None`` when torch has none."""
    name = TORCH_OPTIMIZERS.get(algorithm, "")
    return getattr(torch.optim, name) if name else None


def hyperparameters(cls: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """The parameter-group keys of a torch.optim class that describe its algorithm, with their defaults."""
    return {k: v for k, v in torch_optimizer_defaults(cls).items() if k not in IMPLEMENTATION_KEYS}


def _scalar_step(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(torch.float32)
    return torch.tensor(float(value), dtype=torch.float32)


def normalize(state: Mapping[str, Any], cls: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """``state`` in torch's layout exactly: every hyperparameter of ``cls`` in every group, steps as tensors."""
    defaults = hyperparameters(cls)
    groups = []
    for group in state["param_groups"]:
        merged = {**defaults, **{k: v for k, v in group.items() if k not in IMPLEMENTATION_KEYS}}
        groups.append(merged)
    per_param = {}
    for index, entry in state["state"].items():
        entry = dict(entry)
        if "step" in entry:
            entry["step"] = _scalar_step(entry["step"])
        per_param[index] = entry
    return {"state": per_param, "param_groups": groups}


def export_state(choice: OptimizerChoice) -> dict[str, Any]:
    """The checkpoint entry of an optimizer: its state in the canonical form where it has one, else its own."""
    native = choice.optimizer.state_dict()
    entry: dict[str, Any] = {"algorithm": choice.algorithm, "implementation": choice.implementation}
    cls = canonical_class(choice.algorithm)
    canonical, reason = None, ""
    if cls is None:
        reason = f"{choice.algorithm} has no torch.optim counterpart"
    elif choice.to_canonical is not None:
        try:
            canonical = choice.to_canonical(choice.optimizer, native)
        except ValueError as exc:
            reason = f"{choice.implementation} could not convert its state ({exc})"
    elif type(choice.optimizer) is cls:
        canonical = native
    elif isinstance(choice.optimizer, cls):  # a subclass: canonical when it keeps torch's entries and shapes
        difference = layout_problem(choice.optimizer, native, cls, IMPLEMENTATION_KEYS)
        if difference:
            reason = (f"{choice.implementation} gives no converter to torch.optim's layout, and its state differs "
                      f"from torch.optim.{cls.__name__}'s: {difference}")
        else:
            canonical = native
    else:
        reason = f"{choice.implementation} gives no converter to torch.optim's layout"
    if canonical is None:
        entry.update(layout=NATIVE, state=native, reason=reason)
    else:
        # cls is not None wherever canonical is (mypy cannot tell)
        entry.update(layout=CANONICAL, state=normalize(canonical, cls), reason="")  # type: ignore[arg-type]
    return entry


def import_state(choice: OptimizerChoice, entry: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A checked checkpoint ``entry`` as a dict ``choice.optimizer.load_state_dict`` accepts (nothing changes here).

    Raises `CheckpointError` (one line: which optimizer, which implementations, what to do) when the
    state cannot go into this implementation.
    """
    saved_impl, impl = entry["implementation"], choice.implementation
    if entry["layout"] == NATIVE:
        if saved_impl == impl:
            return dict(entry["state"])
        why = entry.get("reason") or "no canonical form"
        raise CheckpointError(
            f"optimizer {key!r}: the checkpoint holds {saved_impl}'s own state ({why}), and this run built {impl}; "
            f"resume where {saved_impl} is used (the same device and device options)")
    cls = canonical_class(choice.algorithm)
    assert cls is not None  # checked: the algorithms match and a canonical state has a torch class
    canonical = normalize(entry["state"], cls)
    if choice.from_canonical is not None:
        try:
            converted = choice.from_canonical(choice.optimizer, canonical)
        except ValueError as exc:
            raise CheckpointError(
                f"optimizer {key!r}: the {choice.algorithm} state written by {saved_impl} cannot go into {impl}: "
                f"{_one_line(exc)}; resume with {saved_impl} or an implementation that can hold it "
                "(e.g. a torch.optim one)") from exc
        problems = shape_problems(choice, converted)
        if problems:
            who = f" of {choice.built_by}" if choice.built_by else ""
            raise CheckpointError(
                f"optimizer {key!r}: the {choice.algorithm} state that {impl}'s from_canonical{who} made of a valid "
                f"one does not fit the parameters: {'; '.join(problems[:3])}; report this to the maintainers of the "
                "plugin named")
        return dict(converted)
    if isinstance(choice.optimizer, cls):  # torch's class, or a subclass that keeps its layout (see .layout)
        current = choice.optimizer.param_groups
        own = type(choice.optimizer) is not cls  # a subclass's own group options keep their values
        groups = [{**({k: v for k, v in now.items() if k != "params"} if own else {}), **g,
                   **{k: now[k] for k in IMPLEMENTATION_KEYS if k in now}}
                  for g, now in zip(canonical["param_groups"], current, strict=True)]
        return {"state": canonical["state"], "param_groups": groups}
    raise CheckpointError(
        f"optimizer {key!r}: {impl} gives no converter from torch.optim's layout, so the {choice.algorithm} "
        f"state written by {saved_impl} cannot go into it; resume with {saved_impl}, or give the plugin's "
        "OptimizerChoice from_canonical/to_canonical")


def shape_problems(choice: OptimizerChoice, converted: Any) -> list[str]:
    """What in a plugin's ``from_canonical`` answer does not fit the optimizer's parameters (its shapes).

    Checked on every load, before anything is restored (the algorithm's invariants are checked next, by the
    checkpoint's validation): a converter that mixes up parameters would otherwise fail in the optimizer's
    kernel, or broadcast silently, steps after the resume.
    """
    if not isinstance(converted, Mapping) or not isinstance(converted.get("state"), Mapping) or not isinstance(
            converted.get("param_groups"), list):
        return [f"it returned {type(converted).__name__}, not a state_dict with 'state' and 'param_groups'"]
    problems: list[str] = []
    params = [p for group in choice.optimizer.param_groups for p in group["params"]]
    indices = [i for group in converted["param_groups"] if isinstance(group, Mapping)
               for i in group.get("params", [])]
    shapes = {index: tuple(param.shape) for index, param in zip(indices, params, strict=False)}
    for index, values in converted["state"].items():
        if not isinstance(values, Mapping) or index not in shapes:
            continue
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and name not in SCALAR_STATE and (
                    tuple(value.shape) != shapes[index]):
                problems.append(f"parameter {index}: {name} has shape {tuple(value.shape)}, the parameter "
                                f"{shapes[index]}")
                break
    return problems


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ---- checks ---------------------------------------------------------------------------------------------
def _negative(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return True
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return not math.isfinite(value) or value < 0


def state_problems(choice: OptimizerChoice, entry: Any, key: str) -> list[str]:
    """What in a checkpoint entry does not fit ``choice``: layout, algorithm, group sizes, tensor shapes, steps.

    Checked before anything is restored, so a state whose tensors do not fit the parameters never reaches
    an optimizer kernel.
    """
    name = f"optimizer {key!r}"
    if not isinstance(entry, Mapping) or not {"algorithm", "implementation", "layout", "state"} <= set(entry):
        return [f"{name}: the entry is not a devplug optimizer entry"]
    if entry["algorithm"] != choice.algorithm:
        return [f"{name} is {entry['algorithm']} in the checkpoint, {choice.algorithm} here"]
    state = entry["state"]
    if entry["layout"] not in (CANONICAL, NATIVE) or not isinstance(state, Mapping) \
            or not isinstance(state.get("state"), Mapping) or not isinstance(state.get("param_groups"), list):
        return [f"{name}: its state is not an optimizer state_dict"]
    saved_groups = state["param_groups"]
    if not all(isinstance(g, Mapping) and isinstance(g.get("params"), list) for g in saved_groups):
        return [f"{name}: a parameter group without a list of params"]
    groups = choice.optimizer.param_groups
    sizes, saved_sizes = [len(g["params"]) for g in groups], [len(g["params"]) for g in saved_groups]
    if sizes != saved_sizes:
        return [f"{name} has parameter groups of sizes {saved_sizes} in the checkpoint, {sizes} here"]
    ids = list(itertools.chain.from_iterable(g["params"] for g in saved_groups))
    params = dict(zip(ids, itertools.chain.from_iterable(g["params"] for g in groups), strict=True))
    if len(params) != len(ids):
        return [f"{name}: a parameter appears twice in its groups"]
    problems = [f"{name}: group {n} has step {g['step']!r}" for n, g in enumerate(saved_groups)
                if "step" in g and _negative(g["step"])]
    misfits = []
    for index, values in state["state"].items():
        param = params.get(index)
        if param is None or not isinstance(values, Mapping):
            misfits.append(f"state for parameter {index!r}, which its groups do not hold")
            continue
        problem = _param_problem(values, param, entry["layout"] == CANONICAL)
        if problem:
            misfits.append(f"parameter {index} of shape {tuple(param.shape)}: {problem}")
    if misfits:
        more = f" (and {len(misfits) - 1} more parameters)" if len(misfits) > 1 else ""
        problems.append(f"{name}, {misfits[0]}{more}")
    return problems


def _param_problem(values: Mapping[str, Any], param: torch.Tensor, canonical: bool) -> str:
    for state_key, value in values.items():
        if state_key == "step":
            if _negative(value):
                return f"step {value!r} is not a non-negative count"
            continue
        if not isinstance(value, torch.Tensor):
            continue
        shape = tuple(value.shape)
        if canonical:
            fits = shape == tuple(param.shape) or (state_key in SCALAR_STATE and value.numel() == 1)
        else:  # an implementation's own layout: per-element state, or factors that broadcast (Adafactor)
            try:
                fits = torch.broadcast_shapes(value.shape, param.shape) == param.shape
            except RuntimeError:
                fits = False
        if not fits:
            return f"{state_key} has shape {shape}"
    return ""

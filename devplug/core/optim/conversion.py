"""Helpers for a plugin's optimizer-state converters (public through ``devplug.toolkit``).

A device plugin whose optimizer does not keep torch.optim's ``state_dict()`` layout gives its
`OptimizerChoice` a ``to_canonical`` and a ``from_canonical`` converter. The
usual differences are the step count, which fused optimizers keep once per parameter group
(``group["step"]``, NVIDIA apex, Intel Gaudi) where torch keeps one per parameter (``state[i]["step"]``),
and the hyperparameters each side has; these functions handle both, on ``state_dict()``-shaped dicts,
without changing their input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from devplug.core.optim.torch_optimizers import torch_optimizer_class, torch_optimizer_defaults


def steps_to_params(state: Mapping[str, Any], *, drop: Iterable[str] = ()) -> dict[str, Any]:
    """``state`` with each group's ``step`` moved into the state of each of its parameters that has state.

    For an optimizer that counts steps per parameter group: the result keeps torch's layout, a float32
    scalar ``step`` tensor per parameter. ``drop`` names per-parameter entries to leave out (e.g. a
    per-parameter ``step`` placeholder of the implementation's own).
    """
    dropped = set(drop)
    per_param: dict[Any, dict[str, Any]] = {}
    groups = []
    for group in state["param_groups"]:
        group = dict(group)
        step = group.pop("step", 0)
        step = float(step.item() if isinstance(step, torch.Tensor) else step)
        for index in group["params"]:
            if index in state["state"]:
                entry = {k: v for k, v in state["state"][index].items() if k not in dropped}
                entry["step"] = torch.tensor(step, dtype=torch.float32)
                per_param[index] = entry
        groups.append(group)
    return {"state": per_param, "param_groups": groups}


def steps_to_groups(state: Mapping[str, Any], *, param_step: Any = None) -> dict[str, Any]:
    """``state`` (torch's layout) with its per-parameter steps made one ``step`` per group (an ``int``).

    Raises ``ValueError`` when parameters of one group are at different step counts: an implementation
    that keeps one count per group cannot hold that state. ``param_step``, when given, is put in each
    parameter's state in place of torch's step (an implementation's own placeholder).
    """
    per_param: dict[Any, dict[str, Any]] = {}
    groups = []
    for number, group in enumerate(state["param_groups"]):
        group = dict(group)
        steps = set()
        for index in group["params"]:
            entry = state["state"].get(index)
            if entry is None:
                continue
            entry = dict(entry)
            if "step" in entry:
                value = entry.pop("step")
                steps.add(float(value.item() if isinstance(value, torch.Tensor) else value))
            if param_step is not None:
                entry["step"] = param_step
            per_param[index] = entry
        if len(steps) > 1:
            shown = ", ".join(f"{s:g}" for s in sorted(steps))
            raise ValueError(f"the parameters of group {number} are at different step counts ({shown}), and this "
                             "implementation keeps one count per group")
        if steps:
            group["step"] = int(steps.pop())
        groups.append(group)
    return {"state": per_param, "param_groups": groups}


def native_groups(optimizer: torch.optim.Optimizer, groups: list[Mapping[str, Any]], algorithm: str, *,
                  implementation: str, refuse: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Parameter groups for ``optimizer`` (``implementation``, not a torch.optim class) from canonical ``groups``.

    Hyperparameters torch's ``algorithm`` has and the implementation lacks are left out; a group with one of
    the flags in ``refuse`` set (``maximize``, ``amsgrad``: what the kernel cannot do) is a ValueError; the
    implementation's own keys the canonical group lacks (``bias_correction``) keep their current value;
    everything else (``lr``, a scheduler's ``initial_lr``) comes from the canonical group.
    """
    skip = set(torch_optimizer_defaults(torch_optimizer_class(algorithm))) - set(optimizer.defaults)
    result = []
    for group, current in zip(groups, optimizer.param_groups, strict=True):
        for flag in refuse:
            if group.get(flag):
                raise ValueError(f"{implementation} has no {flag}=True")
        merged = {k: v for k, v in group.items() if k not in skip}
        for key, value in current.items():
            if key not in ("params", "step"):  # the step count comes from the canonical state
                merged.setdefault(key, value)
        result.append(merged)
    return result


def bias_corrected_to_canonical(state: Mapping[str, Any], *, decoupled: bool) -> dict[str, Any]:
    """A fused Adam's state (per-group step, ``bias_correction`` groups) in torch.optim.Adam/AdamW's layout."""
    canonical = steps_to_params(state)
    for group in canonical["param_groups"]:
        if not group.pop("bias_correction", True):
            raise ValueError("bias_correction=False has no torch.optim counterpart")
        group["decoupled_weight_decay"] = decoupled
    return canonical


def momentum_to_canonical(state: Mapping[str, Any]) -> dict[str, Any]:
    """A fused SGD's state in torch.optim.SGD's layout: momentum buffers only where a group has momentum."""
    kept = {index for group in state["param_groups"] if group.get("momentum") for index in group["params"]}
    per_param = {index: dict(entry) for index, entry in state["state"].items() if index in kept}
    return {"state": per_param, "param_groups": [dict(group) for group in state["param_groups"]]}


def momentum_from_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], *,
                            implementation: str) -> dict[str, Any]:
    """torch.optim.SGD state for a fused SGD: its momentum buffers as they are, the implementation's group keys."""
    groups = native_groups(optimizer, state["param_groups"], "sgd", implementation=implementation,
                           refuse=("maximize",))
    return {"state": {index: dict(entry) for index, entry in state["state"].items()}, "param_groups": groups}

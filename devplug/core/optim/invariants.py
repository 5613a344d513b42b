"""What an algorithm's optimizer state can never hold, checked before a state is written or restored.

A converter that swaps Adam's moments, or a state edited by hand, can have every key and shape right and
still be impossible: a negative second moment makes Adam's next step take the square root of a negative
number, and the weights are NaN two steps later. These checks read torch.optim's layout (the canonical
form, and the states converters produce for optimizers that keep torch's names):

- every floating-point tensor is finite (SGD's momentum buffers, Adam's moments, ...);
- the accumulators each algorithm keeps non-negative are: ``exp_avg_sq`` (Adam, AdamW, NAdam, RAdam) and
  ``max_exp_avg_sq`` (with ``amsgrad``), ``exp_inf`` (Adamax), ``sum`` (Adagrad), ``square_avg`` (RMSprop);
- every ``step`` is a whole, non-negative count;
- the parameters of one group that have state hold the same entries, since one group runs one
  configuration of the algorithm (``amsgrad``, ``momentum``, ``centered`` are per group).

The step counts of one group's parameters may differ: torch advances a parameter's count only in steps
where it has a gradient, so unequal counts are a state torch itself writes, not a broken one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

#: Per-parameter state entries that each algorithm keeps non-negative (sums and averages of squares, maxima).
NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "adam": ("exp_avg_sq", "max_exp_avg_sq"),
    "adamw": ("exp_avg_sq", "max_exp_avg_sq"),
    "nadam": ("exp_avg_sq",),
    "radam": ("exp_avg_sq",),
    "adamax": ("exp_inf",),
    "adagrad": ("sum",),
    "rmsprop": ("square_avg",),
    "sgd": (),
}


def invariant_problems(algorithm: str, state: Mapping[str, Any],
                       nonfinite: Callable[[Iterable[tuple[str, torch.Tensor]]], list[str]]) -> list[str]:
    """What in ``state`` (an optimizer ``state_dict``) no run of ``algorithm`` can produce; ``[]`` when nothing.

    One line per parameter at most (the first problem found), and one per group whose parameters disagree.
    ``nonfinite`` names the tensors among ``(name, tensor)`` pairs that hold NaN or infinity, all at once (the
    checkpoint layer's fused check).
    """
    per_param = state.get("state")
    if not isinstance(per_param, Mapping):
        return []
    non_negative = NON_NEGATIVE.get(algorithm, ())
    entries = {index: values for index, values in per_param.items() if isinstance(values, Mapping)}
    # one fused reduction over every tensor (not one check and host read per tensor): checkpoints of large
    # models hold thousands of state tensors
    unfinished = set(nonfinite((f"{number}/{key}", value) for number, values in enumerate(entries.values())
                               for key, value in values.items()
                               if key != "step" and isinstance(value, torch.Tensor) and value.is_floating_point()))
    problems = []
    for number, (index, values) in enumerate(entries.items()):
        problem = _entry_problem(values, non_negative, {key for key in values if f"{number}/{key}" in unfinished})
        if problem:
            problems.append(f"parameter {index}: {problem}")
    return problems + _group_problems(state)


def _entry_problem(values: Mapping[str, Any], non_negative: tuple[str, ...], nonfinite_keys: set[Any]) -> str:
    for key, value in values.items():
        if key == "step":
            problem = _step_problem(value)
            if problem:
                return problem
            continue
        if not isinstance(value, torch.Tensor) or not (value.is_floating_point() and value.numel()):
            continue
        if key in nonfinite_keys:
            return f"{key} holds NaN or infinity"
        if key in non_negative:
            lowest = float(value.min())
            if lowest < 0:
                return f"{key} has negative values (as low as {lowest:.3g}), and it is never negative in this algorithm"
    return ""


def _step_problem(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return f"step has shape {tuple(value.shape)}, not one count"
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"step is {value!r}, not a count"
    if not math.isfinite(value) or value < 0 or value != int(value):
        return f"step is {value!r}, not a whole non-negative count"
    return ""


def _group_problems(state: Mapping[str, Any]) -> list[str]:
    groups, per_param = state.get("param_groups"), state["state"]
    if not isinstance(groups, list):
        return []
    problems = []
    for number, group in enumerate(groups):
        params = group.get("params", []) if isinstance(group, Mapping) else []
        kinds = {tuple(sorted(per_param[i])) for i in params if isinstance(per_param.get(i), Mapping)}
        if len(kinds) > 1:
            shown = " and ".join(str(list(kind)) for kind in sorted(kinds))
            problems.append(f"the parameters of group {number} hold different entries ({shown})")
    return problems

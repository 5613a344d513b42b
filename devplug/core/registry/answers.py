"""Checks on the values of hook answers, applied by the guard where the core receives each answer.

The guard (`devplug.core.registry.guard`) checks an answer's type for every hook; the hooks below have
rules on the value as well. Each check gets the hook's label, the hook's arguments by name and the answer
(never ``None``), and returns the answer the core takes, or raises a `PluginError` naming the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import torch

from devplug.core.contract.records import LoaderChoice, MemoryStats, OptimizerChoice, PrecisionPlan
from devplug.core.contract.value_rules import memory_figure_problem, peak_flops_problem
from devplug.core.errors import PluginError
from devplug.core.precision import registry as precisions


class HookLabel(Protocol):
    """Who answered (`devplug.core.registry.guard.HookLabel`): its text prefixes every message."""

    hook: str
    plugin_name: str
    distribution: str


AnswerCheck = Callable[[HookLabel, Mapping[str, Any], Any], Any]


def moved_module(label: HookLabel, arguments: Mapping[str, Any], answer: Any) -> Any:
    """``devplug_to_device`` returns the very module it was given (moved in place), as ``Module.to`` does.

    The Trainer keeps that object: the optimizers hold its parameters and checkpoints read its state, so a
    copy, a wrapper or an unrelated object would leave them behind.
    """
    module = arguments.get("obj")
    if isinstance(module, torch.nn.Module) and answer is not module:
        what = "another object" if not isinstance(answer, torch.nn.Module) else (
            f"another module ({type(answer).__qualname__})")
        raise PluginError(
            f"{label} returned {what} for the {type(module).__qualname__} it was asked to move; a module must be "
            f"moved in place and returned itself (as module.to(device) does), so the optimizers and checkpoints "
            f"that hold it stay valid; report this to the maintainers of {label.distribution}")
    return answer


def peak_flops(label: HookLabel, arguments: Mapping[str, Any], answer: Any) -> Any:
    """A peak FLOP/s is a positive, finite number (or ``None``, unknown): anything else is refused, naming the plugin.

    The Trainer asks for it only to report MFU: it turns this error into one warning and reports no MFU,
    and training goes on.
    """
    problem = peak_flops_problem(answer)
    if problem:
        raise PluginError(f"{label} returned an unusable peak: {problem}; a peak is a positive, finite FLOP/s figure, "
                          f"or None when unknown; report this to the maintainers of {label.distribution}")
    return answer


def optimizer_builder(label: HookLabel, arguments: Mapping[str, Any], answer: Any) -> Any:
    """The choice with ``built_by`` set to the plugin that answered, for errors about its optimizer state."""
    if isinstance(answer, OptimizerChoice) and not answer.built_by:
        return attrs.evolve(answer, built_by=f"plugin {label.plugin_name!r} ({label.distribution})")
    return answer


def _autocast_dtype(plan: PrecisionPlan, device_type: str | None) -> torch.dtype | None:
    """The dtype the plan's autocast casts to on ``device_type`` (``None``: it casts nothing, or cannot be told)."""
    if device_type is None:
        return None
    try:
        with plan.autocast():
            if not torch.is_autocast_enabled(device_type):
                return None
            return torch.get_autocast_dtype(device_type)
    except Exception:  # an autocast that cannot be entered fails where it is used, with its own error
        return None


def precision_plan(label: HookLabel, arguments: Mapping[str, Any], answer: Any) -> Any:
    """A plan is the precision asked for (any of the settings for ``"auto"``), and its autocast casts to that
    precision's dtype: a plan named ``bf16-mixed`` that runs float16 (without the scaler float16 needs), or one
    named ``32-true`` that casts at all, is refused, naming the plugin."""
    if not isinstance(answer, PrecisionPlan):
        return answer
    requested = arguments.get("precision")
    settings = precisions.names()  # the registered precisions, each with the dtype its autocast casts to
    if requested in settings and answer.name != requested:
        raise PluginError(f"{label} answered precision {requested!r} with a plan named {answer.name!r}; a plan must "
                          f"run the precision asked for, or raise devplug.PrecisionError when the device cannot; "
                          f"report this to the maintainers of {label.distribution}")
    if answer.name not in settings:
        raise PluginError(f"{label} returned a plan named {answer.name!r}, not one of {', '.join(settings)}; "
                          f"report this to the maintainers of {label.distribution}")
    device = arguments.get("device")
    kind = getattr(getattr(device, "torch_device", None), "type", None)
    runs = _autocast_dtype(answer, kind)
    expected = precisions.get(answer.name).autocast_dtype
    if runs is not None and runs != expected:
        what = "casts nothing" if expected is None else f"casts to {str(expected).replace('torch.', '')}"
        raise PluginError(f"{label} returned a {answer.name!r} plan whose autocast casts to "
                          f"{str(runs).replace('torch.', '')} on {kind!r}; a {answer.name!r} plan {what}; "
                          f"report this to the maintainers of {label.distribution}")
    return answer


def iterable_loader(label: HookLabel, arguments: Mapping[str, Any], answer: Any) -> Any:
    """A `LoaderChoice`'s loader is iterable over batches: anything else is refused here, naming the plugin,
    rather than failing with a ``TypeError`` at the first epoch."""
    if isinstance(answer, LoaderChoice) and not hasattr(type(answer.loader), "__iter__"):
        raise PluginError(f"{label} returned a LoaderChoice whose loader is {answer.loader!r} (a "
                          f"{type(answer.loader).__qualname__}), which cannot be iterated over batches; report this "
                          f"to the maintainers of {label.distribution}")
    return answer


def byte_counts(label: HookLabel, arguments: Mapping[str, Any], answer: Any) -> Any:
    """Each figure of `MemoryStats` is a whole, non-negative number of bytes, or ``None``: a report never shows a
    negative or fractional memory figure as if measured."""
    problem = memory_figure_problem(answer) if isinstance(answer, MemoryStats) else None
    if problem is not None:
        name, value = problem
        raise PluginError(f"{label} returned MemoryStats.{name} = {value!r}; MemoryStats.{name} must be a number of "
                          f"bytes (a whole, non-negative int), or None where the device does not report it; report "
                          f"this to the maintainers of {label.distribution}")
    return answer


#: The hooks whose answers have rules on their value, and the check of each.
ANSWER_CHECKS: dict[str, AnswerCheck] = {
    "devplug_to_device": moved_module,
    "devplug_peak_flops": peak_flops,
    "devplug_optimizer": optimizer_builder,
    "devplug_precision": precision_plan,
    "devplug_dataloader": iterable_loader,
    "devplug_memory_stats": byte_counts,
}

#: Checks with a rule about one kind of argument only (a module given to ``devplug_to_device``): the
#: argument's name and class. The guard runs such a check only when the argument is one, so the batches
#: moved at every step pay an ``isinstance`` and no more.
CHECKED_ARGUMENT: dict[str, tuple[str, type]] = {
    "devplug_to_device": ("obj", torch.nn.Module),
}

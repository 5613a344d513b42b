"""Which optimizer the author asked for, under which name it is checkpointed, and what a checkpoint would miss.

Optimizers are keyed by a name (``Trainer.optimizer(..., name=...)``; by default the name of the set-up
module whose parameters it holds, e.g. ``"generator"``), so building them in another order after a
refactor still restores each one's state into its own parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import torch

from devplug.core.contract.records import OptimizerChoice
from devplug.core.errors import ConfigError, OptimizerError
from devplug.core.optim.torch_optimizers import TORCH_OPTIMIZERS

_TORCH_NAMES = {cls_name: name for name, cls_name in TORCH_OPTIMIZERS.items() if cls_name}


def algorithm_name(algorithm: Any) -> tuple[str, type[torch.optim.Optimizer] | None]:
    """``("adamw", None)`` for ``"AdamW"`` or ``torch.optim.AdamW``; ``(qualified name, cls)`` for another class.

    A standard torch class becomes its name, so the device plugin builds its fastest implementation of
    that algorithm; any other ``torch.optim.Optimizer`` subclass is built as it is.
    """
    if isinstance(algorithm, str):
        return algorithm.lower(), None
    if inspect.isclass(algorithm) and issubclass(algorithm, torch.optim.Optimizer):
        if algorithm.__module__.startswith("torch.optim") and algorithm.__name__ in _TORCH_NAMES:
            return _TORCH_NAMES[algorithm.__name__], None
        return f"{algorithm.__module__}.{algorithm.__qualname__}", algorithm
    raise OptimizerError(f"optimizer must be a name such as 'adamw' or a torch.optim.Optimizer class, got "
                         f"{algorithm!r}")


def build_choice(algorithm: str, own_class: type[torch.optim.Optimizer] | None, params: list[Any],
                 options: dict[str, Any], ask_plugins: Callable[[], OptimizerChoice | None],
                 device: str) -> OptimizerChoice:
    """The optimizer to use: the author's own class as it is, else what the device's plugins build.

    The choice records ``algorithm``, what its checkpoint state is checked against.
    """
    if not params:
        raise OptimizerError(f"optimizer {algorithm!r} got no parameters to optimize")
    choice = own_choice(own_class, params, options) if own_class else ask_plugins()
    if choice is None:
        raise OptimizerError(f"no plugin can build optimizer {algorithm!r} on {device}")
    return attrs.evolve(choice, algorithm=algorithm)


def own_choice(cls: type[torch.optim.Optimizer], params: list[Any], options: dict[str, Any]) -> OptimizerChoice:
    """An author's own optimizer class, built as it is; options it refuses are a one-line `OptimizerError`."""
    try:
        optimizer = cls(params, **options)
    except (TypeError, ValueError, RuntimeError) as exc:  # an unknown option, a value out of range, a conflict
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise OptimizerError(f"cannot build {cls.__qualname__} with {sorted(options)}: {text}") from exc
    return OptimizerChoice(optimizer, f"{cls.__module__}.{cls.__qualname__}", reason="the author's class")


def listed_params(params: Iterable[Any]) -> list[Any]:
    """``params`` as a list, each parameter group's ``params`` made a list in place (as torch's optimizers do).

    Groups are often given with generators (``{"params": layer.parameters(), "lr": 0.1}``): read once to
    find the module that owns them, or by an implementation a plugin tried first, they would leave the
    optimizer built next with empty groups.
    """
    listed = list(params)
    for number, item in enumerate(listed):
        if isinstance(item, Mapping) and "params" not in item:
            raise OptimizerError(f"parameter group {number} has no 'params': give each group as "
                                 "{'params': [...], 'lr': ...}")
        if isinstance(item, dict) and not isinstance(item["params"], (torch.Tensor, list, set)):
            item["params"] = list(item["params"])
    return listed


def _param_ids(params: Iterable[Any]) -> set[int]:
    """The ids of the tensors among ``params``: tensors, ``(name, tensor)`` pairs (``named_parameters()``), groups."""
    ids: set[int] = set()
    for item in params:
        if isinstance(item, Mapping):
            group = item["params"]
            ids.update(_param_ids([group] if isinstance(group, torch.Tensor) else group))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            ids.add(id(item[1]))
        else:
            ids.add(id(item))
    return ids


def optimizer_key(params: list[Any], modules: Mapping[str, torch.nn.Module], taken: Iterable[str],
                  algorithm: str, name: str | None) -> str:
    """The checkpoint name of a new optimizer: ``name``, else the one set-up module owning its parameters.

    Falls back to the algorithm name when the parameters span several modules or none; a name that is
    already taken is a `ConfigError` asking for ``name=``.
    """
    taken = set(taken)
    if name is None:
        ids = _param_ids(params)
        owners = [key for key, module in modules.items() if ids & {id(p) for p in module.parameters()}]
        name = owners[0] if len(owners) == 1 else algorithm
    if name in taken:
        raise ConfigError(f"an optimizer named {name!r} already exists; pass trainer.optimizer(..., name='...') "
                          "with a name of its own (it keys the optimizer's state in checkpoints)")
    return name


def parameters_outside(optimizers: Mapping[str, OptimizerChoice],
                       modules: Mapping[str, torch.nn.Module]) -> dict[str, int]:
    """For each optimizer, how many of its parameters belong to no set-up module (their weights are not saved)."""
    saved = {id(p) for module in modules.values() for p in module.parameters()}
    outside = {}
    for key, choice in optimizers.items():
        missing = sum(1 for g in choice.optimizer.param_groups for p in g["params"] if id(p) not in saved)
        if missing:
            outside[key] = missing
    return outside


def class_name(optimizer: torch.optim.Optimizer) -> str:
    """How an error names an optimizer's class: ``"torch.optim.Adam"``, or its module and qualified name."""
    cls = type(optimizer)
    module = "torch.optim" if cls.__module__.startswith("torch.optim") else cls.__module__
    return f"{module}.{cls.__qualname__}"


def optimizers_not_saved(stepped: Iterable[torch.optim.Optimizer], optimizers: Mapping[str, OptimizerChoice],
                         kept: Iterable[Any], modules: Mapping[str, torch.nn.Module]) -> list[str]:
    """The optimizers in ``stepped`` whose state no checkpoint holds, each named with the set-up modules it trains.

    Those are the ones built by the author (not through ``Trainer.optimizer``) and not among ``kept`` (the
    objects registered for checkpointing).
    """
    known = {id(choice.optimizer) for choice in optimizers.values()} | {id(obj) for obj in kept}
    found = []
    for optimizer in stepped:
        if id(optimizer) in known:
            continue
        ids = _param_ids(optimizer.param_groups)
        owners = [key for key, module in modules.items() if ids & {id(p) for p in module.parameters()}]
        found.append(f"{class_name(optimizer)} over the parameters of "
                     + (", ".join(repr(o) for o in owners) if owners else "no set-up module"))
    return found

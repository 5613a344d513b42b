"""A training strategy: how a run's modules are spread over its processes, and what that changes.

A strategy object, chosen once from ``Trainer(strategy=...)``, owns what differs between training on
one process, DDP replicas and FSDP shards: wrapping a set-up module (before and after compiling), the
optimizer built over its parameters, gradient clipping, switching gradient synchronisation off between
accumulation boundaries, and the checkpoint format it saves. The Trainer asks its strategy and tests no
strategy name.

A new strategy (as tensor parallel and FSDP with tensor parallel on a device mesh were, in
``tensor_parallel.py``) is one module with a `Strategy` subclass plus one line: an entry in ``BUILT_IN``
for a built-in, or ``register_strategy(...)``
for one of your own.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs
import torch

from devplug.core.contract.records import CollectiveSetup, Device, LaunchInfo, ShardingPlan
from devplug.core.errors import ConfigError


@attrs.frozen(kw_only=True)
class StrategyContext:
    """What a strategy is built with: the device plugin's hooks (``hooks(spec, **kwargs)``), the device, the
    launch, the joined process group's setup (``None`` in one process), the author's DDP options, the
    precision's name, and the tensor-parallel size asked for (``None``: the strategy's default)."""

    hooks: Callable[..., Any]
    device: Device
    launch: LaunchInfo
    collective: CollectiveSetup | None = None
    ddp_overrides: Mapping[str, Any] = attrs.field(factory=dict)
    precision: str = "32-true"
    tp: int | None = None


def local_tensor(value: Any) -> Any:
    """A DTensor's full value as a plain tensor (a replicated norm), anything else unchanged."""
    full = getattr(value, "full_tensor", None)
    return full() if callable(full) else value


class Strategy:
    """One process, nothing wrapped: the base every strategy refines.

    ``name`` is what ``Trainer(strategy=...)`` takes; ``checkpoint_format`` the format its checkpoints are
    written in (`devplug.core.checkpoint.format`); ``sharding`` the device plugin's sharding plan when
    the strategy shards, else ``None``; ``reason`` a line for the run summary (``None``: nothing to say).
    """

    name: ClassVar[str] = "none"
    checkpoint_format: ClassVar[str] = "plain"
    #: whether the strategy reads ``StrategyContext.tp`` (a ``tp`` given to one that does not is refused)
    takes_tp: ClassVar[bool] = False
    sharding: ShardingPlan | None = None

    def __init__(self, context: StrategyContext) -> None:
        self.context = context

    @property
    def reason(self) -> str | None:
        """Why the run trains this way, for the summary's reasons; ``None`` when there is nothing to say."""
        return None

    def prepare(self, module: torch.nn.Module, shard: Any = None, tp_plan: Any = None) -> torch.nn.Module:
        """Before compiling: change ``module`` in place where the strategy needs it (``shard`` and ``tp_plan``
        as given to ``setup``); the module to go on with. This one takes neither."""
        if shard is not None:
            raise ConfigError(f"setup(shard=...) needs Trainer(strategy='fsdp'); this trainer's is {self.name!r}")
        if tp_plan is not None:
            raise ConfigError(f"setup(tp_plan=...) needs strategy='tp' or 'fsdp+tp'; this trainer's is {self.name!r}")
        return module

    def data_parallel(self) -> tuple[int, int] | None:
        """This rank's place among the groups that see different batches, and their number; ``None``: every
        rank is its own group (the launch's rank and world size)."""
        return None

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """After compiling: the module the author's loop calls (a wrapper, or ``module`` itself)."""
        return module

    def optimizer_request(self, algorithm: str, params: list[Any], options: Mapping[str, Any],
                          ask_plugin: Callable[[], Any]) -> Callable[[], Any]:
        """How to build ``algorithm`` over ``params``: ``ask_plugin`` (the device plugin's choice) by default."""
        return ask_plugin

    def clip_grad_norm(self, clip: Callable[[], Any]) -> Any:
        """Run the device's clip-norm kernel (``clip``); the total norm as a plain tensor on the device."""
        return local_tensor(clip())

    def no_sync(self, module: Any) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``module``'s gradients are not synchronised across ranks (its own ``no_sync``
        when it has one, a DDP module for instance; else nothing to switch off)."""
        sync_off = getattr(module, "no_sync", None)
        return sync_off() if callable(sync_off) else contextlib.nullcontext()


#: The built-in strategies: name → ``"module:Class"``, imported when first used ("none" is `Strategy`).
BUILT_IN: dict[str, str] = {
    "none": "devplug.core.distributed.strategy:Strategy",
    "ddp": "devplug.core.distributed.ddp:DDPStrategy",
    "fsdp": "devplug.core.distributed.fsdp:FSDPStrategy",
    "tp": "devplug.core.distributed.tensor_parallel:TPStrategy",
    "fsdp+tp": "devplug.core.distributed.tensor_parallel:FSDPTPStrategy",
}
_registered: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Make ``cls`` available as ``Trainer(strategy=cls.name)`` (usable as a class decorator)."""
    name = cls.name
    if not name or name == "auto" or name in BUILT_IN or (name in _registered and _registered[name] is not cls):
        raise ConfigError(f"a strategy named {name!r} is already registered; choose another name")
    _registered[name] = cls
    return cls


def unregister_strategy(name: str) -> None:
    """Forget the strategy registered as ``name`` (built-ins stay)."""
    _registered.pop(name, None)


def strategy_names() -> tuple[str, ...]:
    """What ``Trainer(strategy=...)`` takes: ``"auto"``, the built-ins, then the registered ones."""
    return ("auto", *(name for name in BUILT_IN if name != "none"), *_registered)


def resolve(name: str, launch: LaunchInfo) -> str:
    """The strategy ``name`` stands for: ``"auto"`` and ``"ddp"`` are DDP when launched with more than one
    process and ``"none"`` otherwise; any other name is itself."""
    if name in ("auto", "ddp"):
        return "ddp" if launch.distributed else "none"
    return name


def build_strategy(name: str, context: StrategyContext) -> Strategy:
    """The strategy ``name`` resolves to, built for ``context``; an unknown name, or a ``tp`` for a strategy
    that does not split layers, is a `ConfigError`."""
    resolved = resolve(name, context.launch)
    if resolved not in _registered and resolved not in BUILT_IN:
        raise ConfigError(f"unknown strategy {name!r}; available: {', '.join(strategy_names())}")
    cls = _strategy_class(resolved)
    if context.tp is not None and not cls.takes_tp:
        takers = ", ".join(repr(n) for n in (*BUILT_IN, *_registered) if _strategy_class(n).takes_tp)
        given = f"strategy {resolved!r}" if name == resolved else f"strategy {name!r} (here {resolved!r})"
        raise ConfigError(f"tp={context.tp} is the number of processes that split each layer, which {given} does "
                          f"not do; choose strategy {takers}, or leave tp unset")
    return cls(context)


def _strategy_class(name: str) -> type[Strategy]:
    """The class of the registered or built-in strategy ``name`` (a built-in's module is imported now)."""
    cls = _registered.get(name)
    if cls is None:
        module, attr = BUILT_IN[name].split(":")
        cls = getattr(importlib.import_module(module), attr)
    return cls

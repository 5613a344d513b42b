"""Sharding a model with PyTorch's FSDP (``fully_shard``) as the device plugin's ShardingPlan says.

`FSDPStrategy` is the ``strategy="fsdp"`` of a Trainer: it asks the device plugin for its plan, shards each
set-up module, builds torch.optim optimizers over the sharded parameters, and saves sharded folders.

Which modules become FSDP units (the classes the author names, else a size-based default), the mesh of
all ranks, the mixed-precision and offload policies from the plan, a process group of one for a single
process, and switching FSDP's reduce-scatter off between accumulation boundaries.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from devplug.core.contract import hookspecs as spec
from devplug.core.contract.records import CollectiveSetup, Device, ShardingPlan
from devplug.core.distributed.strategy import Strategy, StrategyContext
from devplug.core.errors import ConfigError

log = logging.getLogger("devplug")

#: Without ``shard=``, every submodule holding at least this many parameters not yet in a smaller unit
#: becomes an FSDP unit (then the root): torch's size-based wrapping policy, sized for transformer blocks.
DEFAULT_MIN_PARAMS = 1_000_000


def require_plan(plan: ShardingPlan | None, device: Device) -> ShardingPlan:
    """The plan, or a `ConfigError` with the plugin's one-line reason when the device cannot shard."""
    if plan is None or not plan.supported:
        reason = plan.reason if plan is not None else f"{device}: its plugin gave no sharding plan; use strategy='ddp'"
        raise ConfigError(f"strategy='fsdp' is not available: {reason}")
    return plan


def join_single_process(setup: CollectiveSetup | None, device: Device) -> None:
    """A process group of one (rank 0 of 1, an in-memory store), so FSDP runs the same code on one process.

    Kept when the process already belongs to a group (the author's, or an earlier Trainer's).
    """
    if dist.is_initialized():
        return
    backend = setup.backend if isinstance(setup, CollectiveSetup) else "gloo"
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    log.info("one process with strategy='fsdp': joined a process group of one (%s) on %s", backend, device)


def mesh(device: Device) -> Any:
    """A one-dimensional device mesh over every rank of the default process group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.torch_device.type, (dist.get_world_size(),))


def shard_targets(module: torch.nn.Module, shard: Sequence[type] | int | None) -> list[torch.nn.Module]:
    """The submodules to make FSDP units, innermost first (the root excluded: it is always one).

    ``shard`` is a list of module classes (every instance becomes a unit), or a parameter count: every
    submodule whose parameters not already in a smaller unit reach it; ``None`` uses ``DEFAULT_MIN_PARAMS``.
    """
    if shard is None or isinstance(shard, int):
        threshold = DEFAULT_MIN_PARAMS if shard is None else shard
        if isinstance(threshold, bool) or threshold < 1:
            raise ConfigError(f"shard= takes module classes or a positive parameter count, got {shard!r}")
        return _by_size(module, threshold)
    classes = tuple(shard)
    if not classes or not all(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
        raise ConfigError(f"shard= takes torch.nn.Module classes (e.g. [Block]), got {shard!r}")
    found = [m for m in module.modules() if m is not module and isinstance(m, classes)]
    if not found:
        names = ", ".join(c.__name__ for c in classes)
        raise ConfigError(f"shard=[{names}]: {type(module).__name__} holds no instance of it")
    return list(reversed(found))  # post-order enough: fully_shard accepts inner units first


def _by_size(module: torch.nn.Module, threshold: int) -> list[torch.nn.Module]:
    chosen: list[torch.nn.Module] = []

    def visit(m: torch.nn.Module) -> int:  # parameters of m not yet in a chosen unit
        free = sum(visit(child) for child in m.children()) + sum(p.numel() for p in m.parameters(recurse=False))
        if m is not module and free >= threshold:
            chosen.append(m)
            return 0
        return free

    visit(module)
    return chosen


def shard_module(module: torch.nn.Module, plan: ShardingPlan, device: Device,
                 shard: Sequence[type] | int | None = None) -> torch.nn.Module:
    """Apply ``fully_shard`` to the chosen submodules, then to ``module``; the same object, now sharded."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not any(p.requires_grad for p in module.parameters()):
        log.info("%s has no trainable parameters: not sharded", type(module).__name__)
        return module
    offload = bool(device.options.get("cpu_offload", False))
    if offload and not plan.cpu_offload:
        raise ConfigError(f"device_options cpu_offload=True: {device} does not support FSDP's CPU offload")
    kwargs = {
        "mesh": mesh(device),
        "reshard_after_forward": plan.reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=plan.reduce_dtype),
        "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy(),
    }
    targets = shard_targets(module, shard)
    for target in targets:
        fully_shard(target, **kwargs)
    fully_shard(module, **kwargs)
    log.info("sharded %s over %d rank(s) in %d unit(s): %s", type(module).__name__, dist.get_world_size(),
             len(targets) + 1, plan.reason)
    return module


def is_sharded(module: Any) -> bool:
    """True for a module ``fully_shard`` was applied to."""
    return callable(getattr(module, "set_requires_gradient_sync", None))


@contextlib.contextmanager
def gradient_sync_off(module: Any) -> Iterator[None]:
    """No reduce-scatter of gradients inside (they accumulate unsharded until the step's last micro-batch)."""
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


class FSDPStrategy(Strategy):
    """Parameters, gradients and optimizer state sharded across ranks with ``fully_shard``, as the device
    plugin's sharding plan says (one process too: a process group of one); checkpoints are sharded folders."""

    name = "fsdp"
    checkpoint_format = "sharded"

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        self.sharding = require_plan(context.hooks(spec.devplug_sharding, precision=context.precision),
                                     context.device)
        if not context.launch.distributed:
            join_single_process(context.hooks(spec.devplug_collective_setup, launch=context.launch), context.device)

    @property
    def reason(self) -> str | None:
        """The plan's reason (which mixed-precision policy and optimizer implementation), if it gives one."""
        return self.sharding.reason if self.sharding is not None and self.sharding.reason else None

    def prepare(self, module: torch.nn.Module, shard: Any = None) -> torch.nn.Module:
        """Shard ``module`` in place before compiling, as torch's FSDP expects."""
        assert self.sharding is not None
        return shard_module(module, self.sharding, self.context.device, shard)

    def optimizer_request(self, algorithm: str, params: list[Any], options: Mapping[str, Any],
                          ask_plugin: Callable[[], Any]) -> Callable[[], Any]:
        """A torch.optim optimizer over the sharded parameters, with the plan's kernel (foreach, fused)."""
        from devplug.core.optim.torch_optimizers import sharded_torch_optimizer

        plan = self.sharding
        assert plan is not None
        return lambda: sharded_torch_optimizer(algorithm, params, dict(options), plan.optimizer_kernel,
                                               plan.optimizer_reason)

    def no_sync(self, module: Any) -> contextlib.AbstractContextManager[Any]:
        """FSDP's reduce-scatter switched off for a sharded module (its gradients accumulate unsharded)."""
        if is_sharded(module) and not callable(getattr(module, "no_sync", None)):
            return gradient_sync_off(module)
        return super().no_sync(module)

"""Tensor parallelism, alone or under FSDP, on a device mesh: ``strategy="tp"`` and ``strategy="fsdp+tp"``.

The ranks form a two-dimensional `torch.distributed.device_mesh.DeviceMesh` of the device plugin's device
type: ``dp`` (data parallel, FSDP's shard dimension) × ``tp`` (tensor parallel, ``Trainer(tp=N)`` ranks
that see the same batch). Each block's linear layers are split across the ``tp`` ranks with torch's
``parallelize_module`` and the plan the author gives (``setup(module, tp_plan={...})``: a module path,
wildcards allowed, to ``"colwise"``, ``"rowwise"``, ``"sequence"`` or a torch ``ParallelStyle``), else
`default_plan`. Every other parameter is replicated across the ``tp`` ranks as a DTensor, so that all
parameters live on one mesh: torch's gradient clipping then computes the total norm over DTensors, and
DCP checkpoints key every tensor by name (they resume on one process, under FSDP or DDP, and back).
Under ``"fsdp+tp"`` ``fully_shard`` then shards every parameter over the ``dp`` ranks.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from devplug.core.contract import hookspecs as spec
from devplug.core.distributed.fsdp import (
    FSDPStrategy,
    gradient_sync_off,
    is_sharded,
    join_single_process,
    require_plan,
    shard_targets,
)
from devplug.core.distributed.strategy import Strategy, StrategyContext
from devplug.core.errors import ConfigError

log = logging.getLogger("devplug")

#: The plan's words for torch's parallel styles.
STYLES = ("colwise", "rowwise", "sequence")


def default_plan(module: torch.nn.Module) -> dict[str, str]:
    """The plan for the common transformer block: each MLP's first linear layer colwise, its last rowwise.

    An MLP is an ``nn.Sequential`` named ``mlp`` (or ``feed_forward``/``ffn``) whose first and last layers
    are ``nn.Linear``. Attention stays replicated: a fused query-key-value projection split into contiguous
    column blocks would hand a rank parts of the queries and of the keys rather than whole heads; give
    your own plan for attention with separate query, key and value projections.
    """
    plan: dict[str, str] = {}
    for name, sub in module.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if (leaf in ("mlp", "feed_forward", "ffn") and isinstance(sub, torch.nn.Sequential) and len(sub) >= 2
                and isinstance(sub[0], torch.nn.Linear) and isinstance(sub[-1], torch.nn.Linear)):
            plan[f"{name}.0"] = "colwise"
            plan[f"{name}.{len(sub) - 1}"] = "rowwise"
    return plan


def sequence_parallel() -> Any:
    """The plan's ``"sequence"``: torch's ``SequenceParallel`` for a norm that receives the whole sequence.

    Between the layers of a plan a plain tensor is the whole value, the same on every ``tp`` rank (what a
    replicated layer and a rowwise layer give); torch's ``SequenceParallel`` takes a plain input for this
    rank's share of the sequence instead, which would make the sequence ``tp`` times as long. This style
    first marks a plain input as replicated, so ``SequenceParallel`` keeps this rank's share of it (a local
    slice, no communication); a DTensor input goes straight to ``SequenceParallel``. The output is a DTensor
    split along the sequence (dimension 1), for a neighbour that expects that layout (``ColwiseParallel(
    input_layouts=Shard(1))``, ``PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())``).
    Pass torch's ``SequenceParallel()`` itself where the input is already each rank's share.
    """
    from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

    class SequenceParallelFromWhole(ParallelStyle):
        def _apply(self, module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
            module.register_forward_pre_hook(_inputs_to_dtensor(device_mesh), with_kwargs=True)
            return SequenceParallel()._apply(module, device_mesh)

        def __repr__(self) -> str:
            return "SequenceParallelFromWhole()"

    return SequenceParallelFromWhole()


def _style(name: str, value: Any) -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    if isinstance(value, ParallelStyle):
        return value
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel, "sequence": sequence_parallel}
    if value not in styles:
        raise ConfigError(f"tp_plan[{name!r}] = {value!r}: use one of {', '.join(STYLES)} or a torch ParallelStyle")
    return styles[value]()


def check_plan(module: torch.nn.Module, plan: Mapping[str, Any]) -> dict[str, Any]:
    """``plan`` with torch's styles in place of their names; a `ConfigError` for a path that matches nothing."""
    if not isinstance(plan, Mapping):
        raise ConfigError(f"tp_plan= takes a dict of module paths to styles, got {type(plan).__name__}")
    names = [name for name, _ in module.named_modules() if name]
    for path in plan:
        if not any(fnmatch.fnmatchcase(name, path) for name in names):
            raise ConfigError(f"tp_plan: {type(module).__name__} has no submodule {path!r}")
    return {path: _style(path, value) for path, value in plan.items()}


def replicate_rest(module: torch.nn.Module, tp_mesh: Any) -> int:
    """Make every parameter the plan left plain a DTensor replicated over ``tp_mesh``; how many.

    Modules holding such parameters take plain tensors in and give plain tensors out, as before.
    """
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    made: dict[int, torch.nn.Parameter] = {}  # a tied parameter (embedding and head) stays one parameter
    for sub in module.modules():
        plain = [(n, p) for n, p in sub.named_parameters(recurse=False) if not isinstance(p, DTensor)]
        if not plain:
            continue
        for name, param in plain:
            if id(param) not in made:
                dt = distribute_tensor(param.detach(), tp_mesh, [Replicate()], src_data_rank=None)
                made[id(param)] = torch.nn.Parameter(dt, requires_grad=param.requires_grad)
            sub.register_parameter(name, made[id(param)])
        sub.register_forward_pre_hook(_inputs_to_dtensor(tp_mesh), with_kwargs=True)
        sub.register_forward_hook(_output_to_local)
    return len(made)


def _inputs_to_dtensor(tp_mesh: Any) -> Any:
    from torch.distributed.tensor import DTensor, Replicate

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            return DTensor.from_local(value, tp_mesh, [Replicate()], run_check=False)
        return value

    def hook(_module: torch.nn.Module, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}
    return hook


def _output_to_local(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
    # an isinstance test, not getattr(output, "to_local"): torch.compile traces this one (the other leaves a
    # DTensor in the graph, which then meets operators DTensor has no rule for)
    from torch.distributed.tensor import DTensor

    return output.to_local() if isinstance(output, DTensor) else output


class TPStrategy(Strategy):
    """Every rank one tensor-parallel slice of each planned layer (``tp`` = all ranks unless ``Trainer(tp=N)``
    leaves data-parallel replicas); checkpoints are sharded folders."""

    name = "tp"
    checkpoint_format = "sharded"
    takes_tp = True

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        if not context.launch.distributed:
            join_single_process(context.hooks(spec.devplug_collective_setup, launch=context.launch), context.device)
        world = dist.get_world_size()
        tp = context.tp or world
        if tp < 1 or world % tp:
            raise ConfigError(f"tp={tp} does not divide the {world} process(es); launch a multiple of tp processes")
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(context.device.torch_device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
        if self.name == "tp" and world // tp > 1:
            raise ConfigError(f"strategy='tp' with tp={tp} on {world} processes leaves {world // tp} data-parallel "
                              "groups: use strategy='fsdp+tp', or tp equal to the number of processes")
        # parameters become DTensors: the device plugin's sharding plan says which optimizer kernel runs over them
        self.sharding = require_plan(context.hooks(spec.devplug_sharding, precision=context.precision),
                                     context.device, self.name)

    @property
    def reason(self) -> str | None:
        """The mesh's shape (under FSDP, then the sharding plan's reason)."""
        shape = dict(zip(self.mesh.mesh_dim_names or (), self.mesh.mesh.shape, strict=False))
        mesh = f"device mesh dp={shape.get('dp', 1)} x tp={shape.get('tp', 1)}"
        plan = self.sharding
        return f"{mesh}; {plan.reason}" if "fsdp" in self.name and plan is not None and plan.reason else mesh

    def data_parallel(self) -> tuple[int, int]:
        """This rank's place among the data-parallel groups and their number (ranks of one ``tp`` group
        see the same batches)."""
        return self.mesh["dp"].get_local_rank(), self.mesh["dp"].size()

    def prepare(self, module: torch.nn.Module, shard: Any = None, tp_plan: Any = None) -> torch.nn.Module:
        """Split the planned layers over the ``tp`` ranks and replicate the rest there, in place."""
        if shard is not None and self.name == "tp":
            raise ConfigError("setup(shard=...) needs strategy='fsdp' or 'fsdp+tp'; this trainer's is 'tp'")
        return self._parallelize(module, tp_plan)

    def optimizer_request(self, algorithm: str, params: list[Any], options: Mapping[str, Any],
                          ask_plugin: Callable[[], Any]) -> Callable[[], Any]:
        """A torch.optim optimizer over the DTensor parameters, with the plan's kernel (as under FSDP)."""
        return FSDPStrategy.optimizer_request(self, algorithm, params, options, ask_plugin)  # type: ignore[arg-type]

    def _parallelize(self, module: torch.nn.Module, tp_plan: Any) -> torch.nn.Module:
        from torch.distributed.tensor.parallel import parallelize_module

        plan = check_plan(module, default_plan(module) if tp_plan is None else tp_plan)
        if not plan:
            log.warning("%s: the tensor-parallel plan is empty (no MLP found): every weight is replicated; "
                        "pass setup(tp_plan={...})", type(module).__name__)
        tp_mesh = self.mesh["tp"]
        parallelize_module(module, tp_mesh, plan)
        replicated = replicate_rest(module, tp_mesh)
        log.info("tensor parallel over %d rank(s): %d planned layer pattern(s), %d parameter(s) replicated",
                 tp_mesh.size(), len(plan), replicated)
        return module


class FSDPTPStrategy(TPStrategy):
    """Tensor parallel inside each ``tp`` group, FSDP (``fully_shard``) across the ``dp`` groups."""

    name = "fsdp+tp"

    def prepare(self, module: torch.nn.Module, shard: Any = None, tp_plan: Any = None) -> torch.nn.Module:
        """Tensor parallel first, then ``fully_shard`` over the ``dp`` mesh (units as ``shard`` says)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        module = self._parallelize(module, tp_plan)
        plan = self.sharding
        assert plan is not None
        policy = MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=plan.reduce_dtype)
        for target in [*shard_targets(module, shard), module]:
            fully_shard(target, mesh=self.mesh["dp"], reshard_after_forward=plan.reshard_after_forward,
                        mp_policy=policy)
        return module

    def no_sync(self, module: Any) -> contextlib.AbstractContextManager[Any]:
        """FSDP's reduce-scatter switched off (gradients accumulate unsharded until the step's last micro-batch)."""
        return gradient_sync_off(module) if is_sharded(module) else contextlib.nullcontext()

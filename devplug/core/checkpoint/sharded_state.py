"""A Trainer's checkpoints under FSDP, and sharded checkpoints in any run.

Module and optimizer tensors go through ``torch.distributed.checkpoint.state_dict`` (parameter names as
keys, so the same checkpoint fits a sharded model, a DDP replica or one process) into a DCP folder
(`devplug.core.checkpoint.sharded`); the loop position, RNG, scaler and the author's extra state
ride along in the folder's small state file. A plain checkpoint file loads into a sharded run too.

A sharded run's optimizers are torch.optim ones, so a sharded checkpoint holds torch's layout. A run that
loads it with another implementation (one process or DDP on a device whose plugin builds its own optimizer,
such as Gaudi's FusedAdamW) reads the state into a torch.optim optimizer of the same algorithm over the
same parameters, then hands it to that implementation the way a plain checkpoint's is: through the
plugin's ``from_canonical``, checked first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from devplug.core.checkpoint import file as ckpt
from devplug.core.checkpoint.finite import nonfinite
from devplug.core.checkpoint.format import TrainingRun
from devplug.core.checkpoint.rollback import Rollback, all_or_nothing, restore_registered, restore_scaler_and_rng
from devplug.core.checkpoint.sharded import ShardedWriter, load_tensors, read_state
from devplug.core.checkpoint.validate import check_loaded_optimizers, module_problems, registered_problems
from devplug.core.contract.records import OptimizerChoice
from devplug.core.errors import CheckpointError, CheckpointMismatchError, NonFiniteLossError
from devplug.core.optim.canonical import CANONICAL, canonical_class, import_state, state_problems


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def optimizer_owners(ts: TrainingRun) -> dict[str, str]:
    """For each optimizer, the set-up module holding all its parameters (a sharded state is keyed by name)."""
    owners = {}
    for key, choice in ts.optimizers.items():
        ids = {id(p) for group in choice.optimizer.param_groups for p in group["params"]}
        owner = next((name for name, m in ts.modules.items() if ids <= {id(p) for p in m.parameters()}), None)
        if owner is None:
            raise CheckpointError(f"optimizer {key!r} holds parameters of several modules or of one not set up: a "
                                  "sharded checkpoint needs each optimizer over one set-up module's parameters")
        owners[key] = owner
    return owners


def _tensors(ts: TrainingRun, owners: Mapping[str, str],
             readers: Mapping[str, torch.optim.Optimizer] | None = None) -> dict[str, Any]:
    """The DCP state of every module and optimizer (``readers`` stand in for optimizers of another layout)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    readers = readers or {}
    return {"modules": {k: get_model_state_dict(m) for k, m in ts.modules.items()},
            "optimizers": {k: get_optimizer_state_dict(ts.modules[owners[k]], readers.get(k, c.optimizer))
                           for k, c in ts.optimizers.items()}}


def torch_reader(choice: OptimizerChoice) -> torch.optim.Optimizer | None:
    """A torch.optim optimizer of ``choice``'s algorithm over its parameter groups, when ``choice`` is another
    implementation (its state layout is not the one a sharded checkpoint holds); ``None`` when it is torch's."""
    cls = canonical_class(choice.algorithm)
    if cls is None or type(choice.optimizer) is cls:
        return None
    build: Callable[..., torch.optim.Optimizer] = cls  # its own defaults: the checkpoint's values are loaded into it
    return build([{"params": group["params"]} for group in choice.optimizer.param_groups])


def _converted(ts: TrainingRun, readers: Mapping[str, torch.optim.Optimizer], owners: Mapping[str, str],
               loaded: Mapping[str, Any], path: Any) -> dict[str, dict[str, Any]]:
    """The loaded torch-layout states of ``readers`` converted for the run's own optimizers (checked, not applied)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    entries, natives = {}, {}
    for key, reader in readers.items():
        set_optimizer_state_dict(ts.modules[owners[key]], reader, loaded[key])
        choice = ts.optimizers[key]
        entry = {"algorithm": choice.algorithm, "implementation": f"torch.optim.{type(reader).__name__}",
                 "layout": CANONICAL, "state": reader.state_dict()}
        problems = state_problems(choice, entry, key)
        if problems:
            raise CheckpointMismatchError(f"checkpoint {str(path)!r} does not match this run: {'; '.join(problems)}")
        entries[key], natives[key] = entry, import_state(choice, entry, key)
    check_loaded_optimizers(entries, natives, {k: ts.optimizers[k] for k in readers}, path)
    return natives


@contextlib.contextmanager
def _gradients_aside(ts: TrainingRun) -> Iterator[None]:
    """The optimizers' parameters without gradients inside, as they were after.

    torch's state-dict helpers create the state of an optimizer that has not stepped yet (which a load
    fills) with a zero-gradient step, and only when no parameter has a gradient: with one, the state
    would load empty or not at all.
    """
    params = [p for c in ts.optimizers.values() for group in c.optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params]
    for param in params:
        param.grad = None
    try:
        yield
    finally:
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad


def _local(value: Any) -> torch.Tensor:
    to_local = getattr(value, "to_local", None)
    return to_local() if callable(to_local) else value


def refuse_nonfinite(ts: TrainingRun, path: Any) -> None:
    """Raise `NonFiniteLossError` on every rank when any rank's shards hold NaN or infinity."""
    bad = nonfinite((name, _local(t)) for name, t in ts.named_tensors())
    flag = torch.tensor([1 if bad else 0])
    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = flag.to(ts.device.torch_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if int(flag.item()):
        where = ", ".join(bad[:5]) if bad else "another rank's shards"
        raise NonFiniteLossError(f"not saving checkpoint {str(path)!r}: non-finite values (NaN or inf) in {where}; "
                                 "the earlier checkpoints are kept. Resume from the last one, with a lower learning "
                                 "rate or gradient clipping")


def save_sharded(ts: TrainingRun, writer: ShardedWriter, path: str | os.PathLike[str], extra: Mapping[str, Any],
                 *, async_save: bool = False) -> str:
    """Write a sharded checkpoint folder (a collective: every rank calls it); the path written."""
    refuse_nonfinite(ts, path)
    owners = optimizer_owners(ts)
    state = {**ts.loop_state(), "modules": {}, "optimizers": {}, "extra": dict(extra),
             "sharded_modules": sorted(ts.modules), "sharded_optimizers": owners,
             "optimizer_algorithms": {k: c.algorithm for k, c in ts.optimizers.items()},
             "optimizer_groups": {k: group_settings(c.optimizer) for k, c in ts.optimizers.items()}}
    return str(writer.save(path, _tensors(ts, owners), state, async_save=async_save))


def _restore_small(ts: TrainingRun, state: Mapping[str, Any], rollback: Rollback, path: Any) -> None:
    """Restore the registered objects, the grad scaler and the RNG states (kept in ``rollback``), and keep the
    optimizers' containers: the parts put back cheaply, restored before any of the run's tensors is written.

    The tensor reads that follow are collectives: a rank that failed here tells the others, and every rank
    raises (none is left waiting).
    """
    failure: Exception | None = None
    try:
        restore_registered(ts.registered, state["extra"], rollback)
        restore_scaler_and_rng(ts.scaler, state, ts.device_rng(), rollback)
        for key, choice in ts.optimizers.items():
            rollback.keep_optimizer_entries(choice.optimizer, f"optimizer {key!r}")
    except Exception as exc:
        failure = exc
    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([dist.get_rank() + 1 if failure is not None else 0]).to(ts.device.torch_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        failed_rank = int(flag.item()) - 1
        if failure is None and failed_rank >= 0:
            raise CheckpointError(f"checkpoint {str(path)!r} could not be restored on rank {failed_rank} (its error "
                                  "says why), and nothing was changed")
    if failure is not None:
        raise failure


def load_sharded(ts: TrainingRun, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Restore a sharded checkpoint folder into this run, whatever its world size and strategy; ``extra``.

    All or nothing as far as a sharded run allows without copying its tensors (`devplug.core.checkpoint.rollback`).
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = read_state(path)
    owners = optimizer_owners(ts)
    problems = []
    if sorted(state["sharded_modules"]) != sorted(ts.modules):
        problems.append(f"it holds modules {sorted(state['sharded_modules'])}, this run set up {sorted(ts.modules)}")
    if sorted(state["sharded_optimizers"]) != sorted(owners):
        problems.append(f"it holds optimizers {sorted(state['sharded_optimizers'])}, this run built {sorted(owners)}")
    for key, algorithm in state.get("optimizer_algorithms", {}).items():
        if key in ts.optimizers and ts.optimizers[key].algorithm != algorithm:
            problems.append(f"optimizer {key!r} is {algorithm} there and {ts.optimizers[key].algorithm} here")
    problems += registered_problems(state["extra"], ts.registered)
    if problems:
        raise CheckpointMismatchError(f"checkpoint {str(path)!r} does not match this run: {'; '.join(problems)}")
    points = ts.resume_points(state, path)
    readers = {key: reader for key, choice in ts.optimizers.items() if (reader := torch_reader(choice)) is not None}
    with all_or_nothing(path) as rollback, _gradients_aside(ts):
        _restore_small(ts, state, rollback, path)
        tensors = _tensors(ts, owners, readers)
        natives: dict[str, dict[str, Any]] = {}
        if readers:  # read into the readers' own new state and checked: nothing of the run's is written yet
            load_tensors(path, {"optimizers": {key: tensors["optimizers"][key] for key in readers}})
            natives = _converted(ts, readers, owners, tensors["optimizers"], path)
        load_tensors(path, {"modules": tensors["modules"], "optimizers": {
            key: value for key, value in tensors["optimizers"].items() if key not in readers}}, live=True)
        rollback.exposed = "the weights and optimizer states"  # read into in place
        for key, module in ts.modules.items():
            set_model_state_dict(module, tensors["modules"][key])
        for key, choice in ts.optimizers.items():
            if key in natives:
                choice.optimizer.load_state_dict(natives[key])
            else:
                set_optimizer_state_dict(ts.modules[owners[key]], choice.optimizer, tensors["optimizers"][key])
            restore_group_settings(choice.optimizer, state.get("optimizer_groups", {}).get(key))
    ts.registered_restored = True
    return ts.continue_from(state, points)


def load_plain_into_sharded(ts: TrainingRun, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Restore a plain checkpoint file (one process or DDP) into sharded modules and optimizers; ``extra``.

    Everything is checked and converted before the first weight is written, and the optimizers, registered
    objects, scaler and RNG states are put back if a later part fails; the modules are written last.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = ckpt.read_checkpoint(path)
    if sorted(state["modules"]) != sorted(ts.modules) or sorted(state["optimizers"]) != sorted(ts.optimizers):
        raise CheckpointMismatchError(f"checkpoint {str(path)!r} does not match this run: it holds modules "
                                      f"{sorted(state['modules'])} and optimizers {sorted(state['optimizers'])}, "
                                      f"this run set up {sorted(ts.modules)} and {sorted(ts.optimizers)}")
    problems = registered_problems(state["extra"], ts.registered) + module_problems(state["modules"], ts.modules)
    if problems:
        raise CheckpointMismatchError(f"checkpoint {str(path)!r} does not match this run: {'; '.join(problems)}")
    owners = optimizer_owners(ts)
    points = ts.resume_points(state, path)
    natives = {key: import_state(choice, state["optimizers"][key], key) for key, choice in ts.optimizers.items()}
    full = _options(full_state_dict=True)
    with all_or_nothing(path) as rollback, _gradients_aside(ts):
        _restore_small(ts, state, rollback, path)
        for key, choice in ts.optimizers.items():
            module = ts.modules[owners[key]]
            set_optimizer_state_dict(module, choice.optimizer, by_name(module, choice.optimizer, natives[key]),
                                     options=full)
            restore_group_settings(choice.optimizer, natives[key]["param_groups"])
        rollback.exposed = "the weights"  # copied into the sharded modules in place: the last part written
        for key, module in ts.modules.items():
            set_model_state_dict(module, state["modules"][key], options=full)
    ts.registered_restored = True
    return ts.continue_from(state, points)


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings (``lr``, ``initial_lr``, ``betas``, ...), without its parameters."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def restore_group_settings(optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """Put the saved settings back into ``optimizer``'s groups, as ``Optimizer.load_state_dict`` does for a plain file.

    Loading the sharded tensors fills only the keys the fresh optimizer's groups already have, so a key set
    after the optimizer was built (a schedule's ``initial_lr``) would otherwise be lost.
    """
    if isinstance(saved, list) and len(saved) == len(optimizer.param_groups):
        for group, settings in zip(optimizer.param_groups, saved, strict=True):
            group.update({k: v for k, v in settings.items() if k != "params"})


def by_name(module: torch.nn.Module, optimizer: torch.optim.Optimizer, native: Mapping[str, Any]) -> dict[str, Any]:
    """A torch.optim state dict keyed by parameter index turned into one keyed by parameter name."""
    names = {id(p): name for name, p in module.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    state = {order[int(i)]: value for i, value in native["state"].items()}
    # torch's helper maps only the settings the optimizer's groups already have (a schedule's ``initial_lr``,
    # set after it was built, is not one of them): the rest are put back by `restore_group_settings`
    known = [set(group) for group in optimizer.param_groups]
    groups = [{**{k: v for k, v in g.items() if index >= len(known) or k in known[index]},
               "params": [order[int(i)] for i in g["params"]]} for index, g in enumerate(native["param_groups"])]
    return {"state": state, "param_groups": groups}

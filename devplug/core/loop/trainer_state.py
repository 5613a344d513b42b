"""A Trainer's checkpoint state: what is saved, how it is checked against the training setup, how it is restored.

A save refuses non-finite weights or optimizer state (`NonFiniteLossError`, nothing written), and
an optimizer state its algorithm can never hold (`CheckpointError`), and stores each optimizer's
state in the canonical form (`devplug.core.optim.canonical`). A load checks everything before anything
is restored (`devplug.core.checkpoint.validate`): a checkpoint that does not fit the set-up modules and built
optimizers raises one `CheckpointError` listing every difference, and the restore itself is all
or nothing.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import torch

from devplug.core.checkpoint.compiled import module_state, plain_key, plain_state
from devplug.core.checkpoint.finite import nonfinite
from devplug.core.data.position import ResumePoint
from devplug.core.errors import CheckpointPositionError, NonFiniteLossError

if TYPE_CHECKING:  # the checkpoint file, RNG and optimizer-state modules load with the first save or load
    from devplug.core.contract.records import Device, OptimizerChoice, PrecisionPlan
    from devplug.core.data.position import LoopPosition


class TrainerState:
    """The parts of a Trainer a checkpoint holds, and how they are saved and restored.

    Holds the Trainer's own containers (modules, optimizers, loaders, loop position), so what the
    Trainer sets up is what gets saved.
    """

    def __init__(self, *, device: Device, precision: PrecisionPlan, modules: dict[str, torch.nn.Module],
                 optimizers: dict[str, OptimizerChoice], loaders: list[Any], position: LoopPosition,
                 world_size: int = 1) -> None:
        self.device, self.precision, self.scaler = device, precision, precision.scaler
        self.modules, self.optimizers, self.loaders, self.position = modules, optimizers, loaders, position
        self.world_size = world_size
        #: the objects registered for checkpointing, by name (kept in ``extra``, restored with the rest by `load`)
        self.registered: dict[str, Any] = {}
        #: set by a load that restored ``registered`` with the rest (a format's own load may not)
        self.registered_restored = False

    def training_loaders(self) -> list[Any]:
        """The training loaders, primary first (evaluation loaders hold no position)."""
        return [loader for loader in self.loaders if loader.train]

    def device_rng(self) -> Any:
        from devplug.core.checkpoint import rng

        return rng.device_module(self.device.torch_device.type)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: modules, optimizers, scaler, counters, data positions, RNG states.

        Saved inside an unfinished accumulation window, the position is that of the window's start: the
        partial gradients are not saved, so a resume recomputes the whole step.
        """
        from devplug.core.optim.canonical import export_state

        return {**self.loop_state(),
                "modules": {k: plain_state(m.state_dict()) for k, m in self.modules.items()},
                "optimizers": {k: export_state(c) for k, c in self.optimizers.items()}}

    def loop_state(self) -> dict[str, Any]:
        """What a checkpoint holds besides module and optimizer tensors: counters, positions, scaler, RNG."""
        from devplug.core.checkpoint import file as ckpt
        from devplug.core.checkpoint import rng

        position, scaler = self.position, self.scaler
        open_window = 0 if position.window_closed() else position.in_window
        points = [(loader.seed, loader.resume_point(self.world_size)) for loader in self.training_loaders()]
        return {
            "format": ckpt.FORMAT_VERSION,
            "device": str(self.device),
            "precision": self.precision.name,
            "global_step": position.global_step - (1 if open_window else 0),
            "epoch": position.epoch,
            "batches_in_epoch": position.batches_in_epoch - open_window,
            "world_size": self.world_size,
            "loaders": [{"seed": seed, **attrs.asdict(point)} for seed, point in points],
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng.rng_state(self.device_rng()),
        }

    def save(self, path: str | os.PathLike[str], extra: Mapping[str, Any]) -> str:
        """Write a checkpoint with the author's ``extra`` state atomically; the path written.

        Warns, naming the optimizer, when a Trainer-built optimizer holds parameters of a module that was
        not set up: their weights are not in the checkpoint. Raises `NonFiniteLossError`, writing
        nothing, when a weight or an optimizer state tensor holds NaN or infinity, and `CheckpointError`
        when an optimizer's canonical state breaks its algorithm (a negative second moment from a converter).
        """
        from devplug.core.checkpoint import file as ckpt
        from devplug.core.checkpoint.validate import check_saved_optimizers
        from devplug.core.optim.build import parameters_outside

        for key, count in parameters_outside(self.optimizers, self.modules).items():
            warnings.warn(f"optimizer {key!r} holds {count} parameter(s) of a module that was not passed to "
                          "trainer.setup(); the checkpoint has that optimizer's state but not those weights. "
                          "Set the module up with trainer.setup(module, name=...)", RuntimeWarning, stacklevel=3)
        self.refuse_nonfinite(path)
        state = self.state_dict()
        check_saved_optimizers(state["optimizers"], self.optimizers, path)
        state["extra"] = dict(extra)
        return str(ckpt.atomic_save(ckpt.with_digest(ckpt.to_cpu(state)), path))

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Every module tensor and optimizer state tensor, named as an error message shows them."""
        named = [(f"{key}.{plain_key(name)}", t) for key, m in self.modules.items()
                 for name, t in m.state_dict().items()]
        owners = {id(p): f"{key}.{plain_key(name)}" for key, m in self.modules.items()
                  for name, p in m.named_parameters()}
        for key, choice in self.optimizers.items():
            for param, values in choice.optimizer.state.items():
                owner = owners.get(id(param), f"a parameter of shape {tuple(param.shape)}")
                named += [(f"optimizer {key!r} {entry} of {owner}", value)
                          for entry, value in values.items() if isinstance(value, torch.Tensor)]
        return named

    def refuse_nonfinite(self, path: Any) -> None:
        """Raise `NonFiniteLossError` naming the weights and optimizer state holding NaN or infinity."""
        bad = nonfinite(self.named_tensors())
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise NonFiniteLossError(
                f"not saving checkpoint {str(path)!r}: non-finite values (NaN or inf) in {shown}; the earlier "
                "checkpoints are kept. Resume from the last one, with a lower learning rate or gradient clipping")

    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Check a checkpoint against the setup, then restore it (all or nothing); the author's ``extra`` state."""
        from devplug.core.checkpoint import file as ckpt
        from devplug.core.checkpoint.validate import check_loaded_optimizers, check_matches
        from devplug.core.optim.canonical import import_state

        state = self.own_names(ckpt.read_checkpoint(path))
        check_matches(state, self.modules, self.optimizers, path, self.registered)
        natives = {key: import_state(choice, state["optimizers"][key], key) for key, choice in self.optimizers.items()}
        check_loaded_optimizers(state["optimizers"], natives, self.optimizers, path)
        points = self.resume_points(state, path)
        restore(state, natives, modules=self.modules, optimizers=self.optimizers, scaler=self.scaler,
                device_module=self.device_rng(), path=path, registered=self.registered)
        self.registered_restored = True
        return self.continue_from(state, points)

    def resume_points(self, state: Mapping[str, Any], path: Any = None) -> dict[int, ResumePoint]:
        """The saved loader positions; a loader that cannot continue at the same sample raises now (a
        `CheckpointPositionError` naming the checkpoint ``path``)."""
        points = {i: ResumePoint(**{k: v for k, v in entry.items() if k != "seed"})
                  for i, entry in enumerate(state["loaders"])}
        for loader in self.training_loaders():
            if loader.index in points:
                try:
                    points[loader.index].skip(loader.batch_size, self.world_size, loader.sharded,
                                              f"training loader {loader.index}")
                except CheckpointPositionError as exc:
                    if path is None:
                        raise
                    raise CheckpointPositionError(f"checkpoint {str(path)!r} does not fit this run: {exc}") from None
        return points

    def continue_from(self, state: Mapping[str, Any], points: dict[int, ResumePoint]) -> dict[str, Any]:
        """Set the loop position and loader seeds from a restored ``state``; its ``extra``."""
        position = self.position
        position.global_step = int(state["global_step"])
        position.epoch = int(state["epoch"])
        position.batches_in_epoch = int(state["batches_in_epoch"])
        position.in_window = 0
        position.resume_points = points
        # the data order continues as it was, even if the resumed run was given another seed
        position.resume_seeds = {i: int(entry["seed"]) for i, entry in enumerate(state["loaders"])}
        for loader in self.training_loaders():
            loader.seed = position.resume_seeds.pop(loader.index, loader.seed)
        return dict(state["extra"])

    def own_names(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with each saved module's tensors named as the set-up module names them (compiled or not)."""
        saved = state.get("modules")
        if not isinstance(saved, Mapping):
            return state  # the check says what is wrong with it
        renamed = {key: module_state(value, self.modules[key].state_dict()) if key in self.modules
                   and isinstance(value, Mapping) else value for key, value in saved.items()}
        return {**state, "modules": renamed}


def restore(state: Mapping[str, Any], natives: Mapping[str, dict[str, Any]], *,
            modules: Mapping[str, torch.nn.Module], optimizers: Mapping[str, OptimizerChoice], scaler: Any,
            device_module: Any, path: Any, registered: Mapping[str, Any] | None = None) -> None:
    """Load a checked ``state`` into optimizers (``natives``: their converted states), scaler, modules, RNGs and
    the objects ``registered`` for checkpointing (from its ``extra``).

    All or nothing (`devplug.core.checkpoint.rollback`): if any part fails, the parts already restored are
    put back as they were and one `CheckpointError` says what failed.
    """
    from devplug.core.checkpoint.rollback import all_or_nothing, restore_registered, restore_scaler_and_rng

    with all_or_nothing(path) as rollback:
        for choice in optimizers.values():
            rollback.keep_optimizer(choice.optimizer)  # load_state_dict replaces its state and groups
        for key, choice in optimizers.items():
            choice.optimizer.load_state_dict(natives[key])
        for key, module in modules.items():
            rollback.keep_module(module, f"module {key!r}")
            module.load_state_dict(state["modules"][key])
        restore_scaler_and_rng(scaler, state, device_module, rollback)
        restore_registered(registered or {}, state["extra"], rollback)

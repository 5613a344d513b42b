"""A Trainer's checkpoint state: what is saved, how it is checked against the training setup, how it is restored.

Everything is checked before anything is restored: a checkpoint that does not fit the set-up modules
and built optimizers raises one :class:`CheckpointError` listing every difference.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from devplug.core import checkpoint as ckpt
from devplug.core import rng
from devplug.core.errors import CheckpointError
from devplug.core.loading import LoopPosition, ResumePoint
from devplug.core.optimizers import parameters_outside
from devplug.core.records import Device, OptimizerChoice, PrecisionPlan


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

    def training_loaders(self) -> list[Any]:
        """The training loaders, primary first (evaluation loaders hold no position)."""
        return [loader for loader in self.loaders if loader.train]

    def _device_rng(self) -> Any:
        return rng.device_module(self.device.torch_device.type)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: modules, optimizers, scaler, counters, data positions, RNG states.

        Saved inside an unfinished accumulation window, the position is that of the window's start: the
        partial gradients are not saved, so a resume recomputes the whole step.
        """
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
            "modules": {k: m.state_dict() for k, m in self.modules.items()},
            "optimizers": {k: c.optimizer.state_dict() for k, c in self.optimizers.items()},
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng.rng_state(self._device_rng()),
        }

    def save(self, path: str | os.PathLike[str], extra: Mapping[str, Any]) -> str:
        """Write a checkpoint with the author's ``extra`` state atomically; the path written.

        Warns, naming the optimizer, when a Trainer-built optimizer holds parameters of a module that was
        not set up: their weights are not in the checkpoint.
        """
        for key, count in parameters_outside(self.optimizers, self.modules).items():
            warnings.warn(f"optimizer {key!r} holds {count} parameter(s) of a module that was not passed to "
                          "trainer.setup(); the checkpoint has that optimizer's state but not those weights. "
                          "Set the module up with trainer.setup(module, name=...)", RuntimeWarning, stacklevel=3)
        state = self.state_dict()
        state["extra"] = dict(extra)
        return str(ckpt.atomic_save(ckpt.to_cpu(state), path))

    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Check a checkpoint against the setup, then restore it; the author's ``extra`` state."""
        state = ckpt.read_checkpoint(path)
        check_matches(state, self.modules, self.optimizers, path)
        points = {i: ResumePoint(**{k: v for k, v in entry.items() if k != "seed"})
                  for i, entry in enumerate(state.get("loaders", []))}
        for loader in self.training_loaders():  # a loader that cannot continue at the same sample says so now
            if loader.index in points:
                points[loader.index].skip(loader.batch_size, self.world_size, loader.sharded,
                                          f"training loader {loader.index}")
        restore(state, modules=self.modules, optimizers=self.optimizers, scaler=self.scaler,
                position=self.position, device_module=self._device_rng(), path=path)
        self.position.resume_points = points
        # the data order continues as it was, even if the resumed run was given another seed
        self.position.resume_seeds = {i: int(entry["seed"]) for i, entry in enumerate(state.get("loaders", []))}
        for loader in self.training_loaders():
            loader.seed = self.position.resume_seeds.pop(loader.index, loader.seed)
        return dict(state.get("extra") or {})


def check_matches(state: Mapping[str, Any], modules: Mapping[str, torch.nn.Module],
                  optimizers: Mapping[str, OptimizerChoice], path: Any) -> None:
    """Raise CheckpointError listing every difference between ``state`` and the setup, before anything changes."""
    problems = []
    if sorted(state["modules"]) != sorted(modules):
        problems.append(f"modules {sorted(state['modules'])} vs set up {sorted(modules)}")
    if sorted(state["optimizers"]) != sorted(optimizers):
        problems.append(f"optimizers {sorted(state['optimizers'])} vs built {sorted(optimizers)}")
    for key, module in modules.items():
        saved = state["modules"].get(key)
        if saved is None:
            continue
        current = module.state_dict()
        missing, unexpected = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
        if missing or unexpected:
            problems.append(f"module {key!r}: missing {missing[:3]}, unexpected {unexpected[:3]}")
            continue
        for pname, tensor in current.items():
            if tuple(saved[pname].shape) != tuple(tensor.shape):
                problems.append(f"{key}.{pname} has shape {tuple(saved[pname].shape)}, model has {tuple(tensor.shape)}")
                break
    for key, choice in optimizers.items():
        saved = state["optimizers"].get(key)
        if saved is None:
            continue
        saved_sizes = [len(g["params"]) for g in saved.get("param_groups", [])]
        sizes = [len(g["params"]) for g in choice.optimizer.param_groups]
        if saved_sizes != sizes:
            problems.append(f"optimizer {key!r} has parameter groups of sizes {saved_sizes}, this one {sizes}")
    if problems:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match this training setup: " + "; ".join(problems))


def restore(state: Mapping[str, Any], *, modules: Mapping[str, torch.nn.Module],
            optimizers: Mapping[str, OptimizerChoice], scaler: Any, position: LoopPosition,
            device_module: Any, path: Any) -> None:
    """Load a checked ``state`` into modules, optimizers, scaler, loop position and RNGs."""
    for key, module in modules.items():
        try:
            module.load_state_dict(state["modules"][key])
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint {str(path)!r} does not fit module {key!r}: {exc}") from exc
    for key, choice in optimizers.items():
        try:
            choice.optimizer.load_state_dict(state["optimizers"][key])
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint {str(path)!r} does not fit optimizer {key!r}: {exc}") from exc
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    position.global_step = int(state["global_step"])
    position.epoch = int(state["epoch"])
    position.batches_in_epoch = int(state["batches_in_epoch"])
    position.in_window = 0
    rng.restore_rng_state(state["rng"], device_module)

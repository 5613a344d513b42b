"""The Trainer: the device-specific pieces of a training loop that stays the author's own.

The Trainer never names a device. It resolves one device plugin and asks it (through the hooks in
:mod:`devplug.core.hookspecs`) how to move things, which optimizer and precision to use, when to mark
steps, how to load data and how to join a process group.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from devplug.core import checkpoint as ckpt
from devplug.core.config import TrainerConfig
from devplug.core.devices import DeviceHooks, DeviceRegistry
from devplug.core.errors import CheckpointError, ConfigError, NonFiniteLossError, OptimizerError
from devplug.core.launch import detect_launch
from devplug.core.manager import DevplugPluginManager, get_plugin_manager
from devplug.core.metrics import MetricBuffer, Throughput, nonfinite
from devplug.core.records import LoaderChoice, LoaderOptions, OptimizerChoice, Phase
from devplug.core.tree import map_tensors

log = logging.getLogger("devplug")


def _batch_size(batch: Any) -> int:
    """Samples in a batch, from the first tensor's leading dimension (host metadata, no sync)."""
    found: list[int] = []

    def _first(t: torch.Tensor) -> torch.Tensor:
        if not found and t.dim() > 0:
            found.append(int(t.shape[0]))
        return t

    map_tensors(batch, _first)
    return found[0] if found else 1


class DeviceLoader:
    """Iterates a plugin's loader: batches arrive on the device, steps and samples are counted.

    Each epoch reshuffles deterministically (sampler ``set_epoch`` or a reseeded generator), and after
    a resume the batches the interrupted epoch had already consumed are skipped, so a resumed run sees
    the same data in the same order as an uninterrupted one.
    """

    def __init__(self, trainer: Trainer, choice: LoaderChoice, seed: int) -> None:
        self.trainer = trainer
        self.choice = choice
        self.seed = seed

    @property
    def implementation(self) -> str:
        """Which loader the device plugin chose, e.g. ``"torch DataLoader(workers=4, pin_memory=True)"``."""
        return self.choice.implementation

    def __len__(self) -> int:
        return len(self.choice.loader)  # type: ignore[arg-type]

    def _prepare_epoch(self, epoch: int) -> None:
        sampler = self.choice.sampler
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        generator = getattr(self.choice.loader, "generator", None)
        if isinstance(generator, torch.Generator):
            generator.manual_seed(self.seed + epoch)

    def __iter__(self) -> Iterator[Any]:
        trainer = self.trainer
        self._prepare_epoch(trainer.epoch)
        move = None if self.choice.on_device else trainer.to_device
        batches = iter(self.choice.loader)
        skip, trainer._resume_skip = trainer._resume_skip, 0
        for _ in range(skip):  # first pass after a mid-epoch resume: skip what was already trained on
            if next(batches, _END) is _END:
                return
        while trainer._max_steps is None or trainer.global_step < trainer._max_steps:
            batch = next(batches, _END)
            if batch is _END:
                return
            if move is not None:
                batch = move(batch)
            trainer._begin_iteration(_batch_size(batch))
            yield batch


_END = object()


class Trainer:
    """Device-specific pieces of a training loop, supplied by the resolved device plugin.

    Typical use::

        trainer = devplug.Trainer(device="auto", precision="auto", log_dir="runs/x")
        model = trainer.setup(model)
        opt = trainer.optimizer("adamw", model.parameters(), lr=1e-3)
        loader = trainer.dataloader(dataset, batch_size=256, shuffle=True)
        for epoch in trainer.epochs(10):
            for x, y in loader:
                with trainer.autocast():
                    loss = criterion(model(x), y)
                trainer.backward(loss)
                trainer.step(opt)
                trainer.log(loss=loss)

    Options are :class:`~devplug.core.config.TrainerConfig` fields, given as keyword arguments or as
    ``config=``. ``plugin_manager`` replaces the process-wide one (tests, embedding).
    """

    def __init__(
        self,
        config: TrainerConfig | None = None,
        *,
        plugin_manager: DevplugPluginManager | None = None,
        **options: Any,
    ) -> None:
        if config is not None and options:
            raise ConfigError("pass either config= or keyword options to Trainer, not both")
        self.config = config if config is not None else TrainerConfig.build(**options)
        self.registry = DeviceRegistry(plugin_manager or get_plugin_manager())
        self.launch = detect_launch()
        self.device = self.registry.resolve(self.config.device, self.config.plugin_options())
        self.hooks = DeviceHooks(self.registry, self.device)
        self.hooks.devplug_device_setup()
        self.collective = None
        if self.launch.distributed:
            from devplug.core.distributed import init_process_group

            self.collective = init_process_group(self)
        if self.config.seed is not None:
            seed_everything(self.config.seed)
        self.precision = self.hooks.devplug_precision(precision=self.config.precision)
        self.scaler = self.precision.scaler
        self.modules: dict[str, torch.nn.Module] = {}
        self.optimizers: dict[str, OptimizerChoice] = {}
        self.loaders: list[DeviceLoader] = []
        self.global_step = 0
        self.epoch = 0
        self._batches_in_epoch = 0
        self._resume_skip = 0
        self._max_steps: int | None = None
        self._metrics = MetricBuffer()
        self.throughput = Throughput()
        self.last_metrics: dict[str, float] = {}
        self._writer: Any = None
        self._progress: Any = None

    # ---- where am I -------------------------------------------------------------------------------
    @property
    def torch_device(self) -> torch.device:
        """The ``torch.device`` this trainer places tensors on."""
        return self.device.torch_device

    @property
    def rank(self) -> int:
        """Global rank of this process (0 when not distributed)."""
        return self.launch.rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self.launch.world_size

    @property
    def is_main_process(self) -> bool:
        """True on rank 0, the only rank that writes files and shows progress."""
        return self.launch.rank == 0

    # ---- model, optimizer, data --------------------------------------------------------------------
    def to_device(self, obj: Any) -> Any:
        """Move a module, tensor or nested batch to the device (through the device plugin)."""
        return self.hooks.devplug_to_device(obj=obj)

    def setup(self, module: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
        """Prepare ``module`` for training: precision conversion, device, compile, DDP when launched.

        The module is registered under ``name`` (default: its class name, lower-cased) for checkpoints.
        Returns the module to call in the loop (DDP-wrapped when the world size is above 1).
        """
        key = name or type(module).__name__.lower()
        if key in self.modules:
            raise ConfigError(f"a module named {key!r} is already set up; pass setup(module, name=...)")
        if self.precision.convert_module is not None:
            module = self.precision.convert_module(module) or module
        module = self.to_device(module)
        self.modules[key] = module
        if self.config.compile:
            compiled = self.hooks.devplug_compile(module=module, options=dict(self.config.compile_options))
            module = compiled if compiled is not None else module
        if self.launch.distributed:
            from devplug.core.distributed import wrap_ddp

            module = wrap_ddp(self, module)
        return module

    def optimizer(self, name: str, params: Iterable[Any], **options: Any) -> torch.optim.Optimizer:
        """Build the device's fastest implementation of optimizer ``name`` with the author's options.

        ``trainer.optimizer_implementation(opt)`` tells which implementation the plugin chose.
        """
        params = list(params)
        if not params:
            raise OptimizerError(f"optimizer {name!r} got no parameters to optimize")
        choice = self.hooks.devplug_optimizer(name=name, params=params, options=dict(options))
        if choice is None:
            raise OptimizerError(f"no plugin can build optimizer {name!r} on {self.device}")
        key = f"{name.lower()}{len(self.optimizers)}"
        self.optimizers[key] = choice
        if choice.reason:
            log.info("optimizer %s: %s (%s)", name, choice.implementation, choice.reason)
        return choice.optimizer

    def optimizer_implementation(self, optimizer: torch.optim.Optimizer) -> str:
        """The implementation the plugin chose for ``optimizer``, e.g. ``"torch.optim.Adam(fused=True)"``."""
        for choice in self.optimizers.values():
            if choice.optimizer is optimizer:
                return choice.implementation
        raise ValueError("this optimizer was not built by Trainer.optimizer()")

    def dataloader(
        self,
        source: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        prefetch_factor: int | None = 2,
        collate_fn: Any = None,
        sampler: Any = None,
        seed: int | None = None,
    ) -> DeviceLoader:
        """A loader over ``source`` (a Dataset or an ImageFolderSource) whose batches arrive on the device.

        The device plugin picks the implementation (DALI, HabanaDataLoader, a tuned torch DataLoader).
        ``num_workers`` defaults to the cores left after the main process (at most 8); ``pin_memory``
        defaults to what the device plugin prefers. Under DDP each rank reads its own shard.
        """
        if num_workers is None:
            num_workers = min(8, max(0, (os.cpu_count() or 1) - 1))
        base_seed = self.config.seed if seed is None and self.config.seed is not None else (seed or 0)
        try:
            options = LoaderOptions(
                batch_size=batch_size,
                shuffle=shuffle,
                drop_last=drop_last,
                num_workers=num_workers,
                pin_memory=pin_memory,
                persistent_workers=persistent_workers,
                prefetch_factor=prefetch_factor,
                seed=base_seed,
                rank=self.rank,
                world_size=self.world_size,
                collate_fn=collate_fn,
                sampler=sampler,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid data loader option: {exc}") from exc
        choice = self.hooks.devplug_dataloader(source=source, options=options)
        if choice.reason:
            log.info("data loader: %s (%s)", choice.implementation, choice.reason)
        loader = DeviceLoader(self, choice, base_seed)
        self.loaders.append(loader)
        return loader

    # ---- the step ------------------------------------------------------------------------------------
    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A profiler region named ``name`` as the device plugin marks it (NVTX on CUDA when profiling)."""
        return self.hooks.devplug_region(name=name) or contextlib.nullcontext()

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Context for forward and loss: the precision plan's autocast inside a ``"forward"`` region."""
        with self.region("forward"), self.precision.autocast():
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the grad scaler when there is one, then mark the step boundary."""
        with self.region("backward"):
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
        self.hooks.devplug_mark_step(phase=Phase.BACKWARD)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step (through the scaler), step marking, then ``zero_grad(set_to_none=True)``."""
        step_context = self.precision.optimizer_step_context
        with self.region("optimizer_step"), (step_context() if step_context else contextlib.nullcontext()):
            if self.scaler is not None:
                self.scaler.step(optimizer)
                self.scaler.update()
            else:
                optimizer.step()
        self.hooks.devplug_mark_step(phase=Phase.OPTIMIZER_STEP)
        optimizer.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module) -> Iterator[None]:
        """Skip DDP's gradient all-reduce inside (gradient accumulation); a no-op without DDP."""
        sync_off = getattr(module, "no_sync", None)
        with sync_off() if callable(sync_off) else contextlib.nullcontext():
            yield

    def _begin_iteration(self, samples: int) -> None:
        self.global_step += 1
        self._batches_in_epoch += 1
        self.throughput.add(samples)

    # ---- epochs, logging, progress ---------------------------------------------------------------------
    def epochs(self, n: int, *, max_steps: int | None = None) -> Iterator[int]:
        """Yield epoch numbers from where a resumed run left off up to ``n``.

        Sets loader sampler epochs, shows progress on rank 0, and stops early once ``max_steps``
        iterations have run in total (``None``: no step limit).
        """
        if max_steps is not None and max_steps < 1:
            raise ConfigError(f"max_steps must be a positive integer, got {max_steps!r}")
        self._max_steps = max_steps
        self._open_progress(n, max_steps)
        try:
            while self.epoch < n:
                if max_steps is not None and self.global_step >= max_steps:
                    break
                yield self.epoch
                if max_steps is not None and self.global_step >= max_steps:
                    if self._batches_in_epoch >= self._epoch_length():
                        self._finish_epoch()
                    break
                self._finish_epoch()
            self.flush_logs()
        finally:
            if self._progress is not None:
                self._progress.close()
                self._progress = None

    def _epoch_length(self) -> float:
        try:
            return min(len(loader) for loader in self.loaders) if self.loaders else math.inf
        except TypeError:
            return math.inf

    def _finish_epoch(self) -> None:
        self.epoch += 1
        self._batches_in_epoch = 0

    def _open_progress(self, n: int, max_steps: int | None) -> None:
        if not (self.config.progress and self.is_main_process):
            return
        from tqdm.auto import tqdm

        per_epoch = self._epoch_length()
        total = max_steps
        if total is None and per_epoch is not math.inf:
            total = int(per_epoch * n)
        self._progress = tqdm(total=total, initial=self.global_step, unit="step", dynamic_ncols=True,
                              mininterval=5.0, smoothing=0.1)

    def log(self, **scalars: Any) -> dict[str, float] | None:
        """Record scalars (tensors stay on the device); at every ``log_every``-th step, report them.

        At a log point the values since the previous one are averaged, reduced across ranks, checked for
        NaN/inf, written to TensorBoard (rank 0) and shown on the progress bar. Returns the reported
        values at a log point, else ``None``. This is the only place values are read from the device.
        """
        for name, value in scalars.items():
            self._metrics.add(name, value)
        if self.global_step % self.config.log_every == 0:
            return self.flush_logs()
        return None

    def flush_logs(self) -> dict[str, float] | None:
        """Report pending logged values now (also called at the end of ``epochs``)."""
        if not self._metrics:
            return None
        self.synchronize()
        rate = self.throughput.lap() if self.throughput.samples_since else 0.0
        reduce = None
        if self.launch.distributed:
            from devplug.core.distributed import mean_across_ranks

            reduce = mean_across_ranks
        values = self._metrics.flush(reduce)
        bad = nonfinite(values)
        if bad:
            self._on_nonfinite(bad, values)
        values["samples_per_sec"] = rate * self.world_size
        for key, choice in self.optimizers.items():
            lr = choice.optimizer.param_groups[0].get("lr")
            if isinstance(lr, (int, float)):
                values[f"lr/{key}"] = float(lr)
        self.last_metrics = values
        if self.is_main_process:
            writer = self.writer
            if writer is not None:
                for name, value in values.items():
                    writer.add_scalar(name, value, self.global_step)
            if self._progress is not None:
                self._progress.n = self.global_step
                shown = {k: f"{v:.4g}" for k, v in values.items() if not k.startswith("lr/")}
                self._progress.set_postfix(shown, refresh=False)
                self._progress.refresh()
        return values

    def _on_nonfinite(self, bad: list[str], values: dict[str, float]) -> None:
        message = (
            f"{', '.join(f'{k}={values[k]}' for k in bad)} at step {self.global_step}: training diverged. "
            "Lower the learning rate, check the input data, or try precision='32-true'; "
            "checkpoints already saved are untouched"
        )
        if self.config.nonfinite == "raise":
            raise NonFiniteLossError(message)
        if self.config.nonfinite == "warn":
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    @property
    def writer(self) -> Any:
        """The TensorBoard SummaryWriter (rank 0 with ``log_dir`` set), created on first use; else None."""
        if self._writer is None and self.config.log_dir and self.is_main_process:
            from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is heavy

            self._writer = SummaryWriter(self.config.log_dir)
        return self._writer

    def log_images(self, tag: str, images: torch.Tensor, *, nrow: int = 8, path: str | None = None) -> None:
        """Write a grid of images (N×C×H×W in [-1, 1]) to TensorBoard and optionally a PNG file (rank 0)."""
        if not self.is_main_process:
            return
        from torchvision.utils import make_grid, save_image

        grid = make_grid(images.detach().float().cpu(), nrow=nrow, normalize=True, value_range=(-1, 1))
        if self.writer is not None:
            self.writer.add_image(tag, grid, self.global_step)
        if path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            save_image(grid, path)

    # ---- measurement -----------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for queued device work (log points and timing only)."""
        self.hooks.devplug_synchronize()

    def memory_stats(self) -> Any:
        """The device plugin's memory statistics record, or ``None``."""
        return self.hooks.devplug_memory_stats()

    def summary(self) -> dict[str, Any]:
        """Device, precision, optimizer implementations, loaders and throughput so far."""
        rate = self.throughput.mean_rate * self.world_size
        return {
            "device": str(self.device),
            "device_plugin": self.device.plugin_name,
            "world_size": self.world_size,
            "precision": self.precision.name,
            "precision_detail": self.precision.description,
            "optimizers": {k: c.implementation for k, c in self.optimizers.items()},
            "loaders": [loader.implementation for loader in self.loaders],
            "steps": self.global_step,
            "epoch": self.epoch,
            "samples_per_sec": rate,
            "samples_per_hour": rate * 3600,
            "memory": self.memory_stats(),
        }

    # ---- checkpoints -----------------------------------------------------------------------------------
    def _device_module(self) -> Any:
        return getattr(torch, self.device.torch_device.type, None)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: modules, optimizers, scaler, counters, RNG states."""
        return {
            "format": ckpt.FORMAT_VERSION,
            "device": str(self.device),
            "precision": self.precision.name,
            "global_step": self.global_step,
            "epoch": self.epoch,
            "batches_in_epoch": self._batches_in_epoch,
            "modules": {k: m.state_dict() for k, m in self.modules.items()},
            "optimizers": {k: c.optimizer.state_dict() for k, c in self.optimizers.items()},
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "loader_seeds": [loader.seed for loader in self.loaders],
            "rng": ckpt.rng_state(self._device_module()),
        }

    def save(self, path: str | os.PathLike[str], **extra: Any) -> str | None:
        """Write a checkpoint atomically (rank 0 only); ``extra`` holds the author's own state.

        Returns the path written, or ``None`` on other ranks.
        """
        if not self.is_main_process:
            return None
        state = self.state_dict()
        state["extra"] = extra
        return str(ckpt.atomic_save(ckpt.to_cpu(state), path))

    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save` into the set-up modules and optimizers.

        Call after ``setup`` and ``optimizer``. Raises :class:`CheckpointError` if the file is corrupt or
        does not match what this trainer holds; nothing is modified in that case. Returns ``extra``.
        """
        state = ckpt.read_checkpoint(path)
        self._check_matches(state, path)
        for key, module in self.modules.items():
            try:
                module.load_state_dict(state["modules"][key])
            except RuntimeError as exc:
                raise CheckpointError(f"checkpoint {str(path)!r} does not fit module {key!r}: {exc}") from exc
        for key, choice in self.optimizers.items():
            try:
                choice.optimizer.load_state_dict(state["optimizers"][key])
            except (ValueError, KeyError, RuntimeError) as exc:
                raise CheckpointError(f"checkpoint {str(path)!r} does not fit optimizer {key!r}: {exc}") from exc
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.global_step = int(state["global_step"])
        self.epoch = int(state["epoch"])
        self._batches_in_epoch = int(state["batches_in_epoch"])
        self._resume_skip = self._batches_in_epoch
        # the data order continues as it was, even if the resumed run was given another seed
        for loader, seed in zip(self.loaders, state.get("loader_seeds", []), strict=False):
            loader.seed = int(seed)
        ckpt.restore_rng_state(state["rng"], self._device_module())
        return dict(state.get("extra") or {})

    def _check_matches(self, state: dict[str, Any], path: Any) -> None:
        """Raise CheckpointError listing every difference, before anything is restored."""
        problems = []
        if sorted(state["modules"]) != sorted(self.modules):
            problems.append(f"modules {sorted(state['modules'])} vs set up {sorted(self.modules)}")
        if sorted(state["optimizers"]) != sorted(self.optimizers):
            problems.append(f"optimizers {sorted(state['optimizers'])} vs built {sorted(self.optimizers)}")
        for key, module in self.modules.items():
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
                    problems.append(f"{key}.{pname} has shape {tuple(saved[pname].shape)}, "
                                    f"model has {tuple(tensor.shape)}")
                    break
        for key, choice in self.optimizers.items():
            saved = state["optimizers"].get(key)
            if saved is None:
                continue
            saved_sizes = [len(g["params"]) for g in saved.get("param_groups", [])]
            sizes = [len(g["params"]) for g in choice.optimizer.param_groups]
            if saved_sizes != sizes:
                problems.append(f"optimizer {key!r} has parameter groups of sizes {saved_sizes}, "
                                f"this one {sizes}")
        if problems:
            raise CheckpointError(
                f"checkpoint {str(path)!r} does not match this training setup: " + "; ".join(problems)
            )

    def close(self) -> None:
        """Flush and close TensorBoard and the progress bar.

        The process group stays joined (other trainers in the process may use it); call
        ``torch.distributed.destroy_process_group()`` at the very end of a distributed script.
        """
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def seed_everything(seed: int) -> None:
    """Seed Python and torch (every device torch knows) with ``seed``."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass

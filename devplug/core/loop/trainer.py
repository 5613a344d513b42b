"""The Trainer: the device-specific pieces of a training loop that stays the author's own.

The Trainer never names a device: it resolves one device plugin and asks it, through the hooks, how to move
things, which optimizer and precision to use, when to mark steps, how to load data and join a process group.
Its loop position lives in `devplug.core.data.position`, its reporting in `devplug.core.observe.reporter`,
its checkpoints in `devplug.core.loop.trainer_state`; everything it holds besides the documented
properties is private.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import torch

from devplug.core.checkpoint.compiled import plain_module
from devplug.core.checkpoint.format import CheckpointFormat, format_named
from devplug.core.contract import hookspecs as spec
from devplug.core.contract.records import (
    CompilePlan,
    LaunchInfo,
    MemoryStats,
    OptimizerChoice,
    PeakFlops,
    Phase,
    PrecisionPlan,
    ShardingPlan,
)
from devplug.core.data.position import LoopPosition
from devplug.core.distributed.launch import check_process_group, detect_launch, die_with_launcher
from devplug.core.distributed.strategy import StrategyContext, build_strategy
from devplug.core.distributed.strategy import resolve as resolve_strategy
from devplug.core.errors import ConfigError, DataError, DevplugError, PluginError
from devplug.core.fallback.accelerator import current_index_carrier
from devplug.core.log_once import log_once
from devplug.core.loop.config import TrainerConfig
from devplug.core.loop.run_checkpoints import CheckpointKeeper
from devplug.core.loop.signals import StopRequest
from devplug.core.loop.step import NO_REGION, Regioned, StepRoute, parameters_with_grad
from devplug.core.loop.trainer_state import TrainerState
from devplug.core.observe.flops import FlopMeter, format_name, plain_gemm_flops, precision_dtype
from devplug.core.observe.hparams import flatten_hparams, run_tags
from devplug.core.observe.loggers import build_loggers
from devplug.core.observe.peaks import checked_peak
from devplug.core.observe.profiling import StepProfiler
from devplug.core.observe.reporter import Reporter
from devplug.core.observe.tensorboard import evaluation_name
from devplug.core.registry.bounded import call_with_limit
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import FALLBACK_NAME, DevplugPluginManager, get_plugin_manager
from devplug.core.registry.watchdog import watchdog

if TYPE_CHECKING:  # what a feature needs is imported when the feature is first used
    from devplug.core.checkpoint.policy import CheckpointPolicy
    from devplug.core.checkpoint.resume import Resumed
    from devplug.core.checkpoint.runlock import RunLock
    from devplug.core.data.device_loader import DeviceLoader
    from devplug.core.distributed.combine import RankCombiner
    from devplug.core.observe.summary import RunSummary

log = logging.getLogger("devplug")

#: A precision plan's autocast when it has none (fp32): the step then enters one shared no-op context.
_NO_AUTOCAST = attrs.fields(PrecisionPlan).autocast.default


class Trainer:
    """Device-specific pieces of a training loop, supplied by the resolved device plugin.

    ``setup`` a model, build its ``optimizer`` and ``dataloader``, then loop over ``epochs`` with
    ``autocast``, ``backward``, ``step`` and ``log`` (docs/trainer.md). Options are
    `TrainerConfig` fields, given as keyword arguments or as ``config=``;
    ``plugin_manager`` replaces the process-wide one (tests, embedding).
    """

    def __init__(self, config: TrainerConfig | None = None, *, plugin_manager: DevplugPluginManager | None = None,
                 **options: Any) -> None:
        if config is not None and options:
            raise ConfigError("pass either config= or keyword options to Trainer, not both")
        self._config = config if config is not None else TrainerConfig.build(**options)
        self._registry = DeviceRegistry(plugin_manager or get_plugin_manager())
        self._launch = detect_launch()
        check_process_group(self._launch)  # a group of several ranks joined without the launcher variables
        die_with_launcher()  # under torchrun: no worker outlives its launcher
        self._hooks = self._registry.open(self._config.device, options=self._config.device_options,
                                        channels_last=self._config.channels_last)
        self.device = self._hooks.device
        self._move = self._hooks.caller(spec.devplug_to_device, "obj")  # per batch: the route resolved once
        self._collective, reduce, combiner = None, None, None
        self._combiner: RankCombiner | None = None
        self._handshake: RankCombiner | None = None
        if self._launch.distributed:
            from devplug.core.distributed.combine import RankCombiner, collective_wait_seconds, mean_across_ranks
            from devplug.core.distributed.process_group import init_process_group

            setup = self._hooks(spec.devplug_collective_setup, launch=self._launch)
            self._collective, reduce = init_process_group(self._launch, setup, self.device), mean_across_ranks
            combiner = self._combiner = RankCombiner()
            self._handshake = RankCombiner(timeout=datetime.timedelta(seconds=collective_wait_seconds()))
        self._stop = StopRequest(self._config.stop_signals, combiner)
        self._watched_thread: int | None = threading.get_ident()  # sampled by the hook watchdog: no cost per step
        watchdog().watch(self._watched_thread)
        if self._config.seed is not None:
            from devplug.core.checkpoint import rng

            rng.seed_everything(self._config.seed)
        strategy = resolve_strategy(self._config.strategy, self._launch)  # fp8 plans depend on how weights spread
        plan = call_with_limit(lambda: self._hooks(spec.devplug_precision, precision=self._config.precision,
                                                   strategy=strategy),
                               "devplug_precision", before=current_index_carrier(self.device.torch_device.type))
        assert plan is not None  # the core fallback always answers
        self.precision: PrecisionPlan = plan
        self._strategy = build_strategy(strategy, StrategyContext(  # the name resolved once, above
            hooks=self._hooks, device=self.device, launch=self._launch, collective=self._collective,
            ddp_overrides=self._config.ddp_overrides(), precision=plan.name, tp=self._config.tp))
        self.strategy: str = self._strategy.name
        self.sharding: ShardingPlan | None = self._strategy.sharding
        self._modules: dict[str, torch.nn.Module] = {}
        self._compile_plan: CompilePlan | None = None
        self._compile_by_hook = False  # a plugin's devplug_compile compiles (no plan but the fallback's)
        self._compiled: dict[str, str] = {}  # module name: what compiling it did
        self._optimizers: dict[str, OptimizerChoice] = {}
        self._stepped: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()  # what step() was given
        self._stepped_ids: dict[int, weakref.ref[torch.optim.Optimizer]] = {}  # id → the optimizer, to add it once
        self._backwards = self._backwards_at_step = 0  # trainer.backward() calls, all and as of the last step()
        self._scaler_update_due = False  # a grad scaler stepped: its scale moves once, before it scales again
        self._loaders: list[DeviceLoader] = []
        self._position = LoopPosition(accumulation=self._config.accumulate_grad_batches,
                                     stop_check=self._stop.checker(self._launch.rank))
        self._state = TrainerState(device=self.device, precision=self.precision, modules=self._modules,
                                  optimizers=self._optimizers, loaders=self._loaders, position=self._position,
                                  world_size=self.world_size)
        checkpoint_format = self._checkpoint_format()  # refused before the folder is locked
        policy = self._config.checkpoints  # one job at a time writes its folder: taken before anything is written
        self._run_lock: RunLock | None = None
        if policy is not None:
            from devplug.core.checkpoint import runlock

            self._run_lock = runlock.hold_for_run(policy.directory, main=self.is_main_process,
                                                  combiner=self._combiner)
        try:
            self._start_run(policy, checkpoint_format, reduce)
        except BaseException:  # a logger that cannot start or refuses the run's first point: the folder is free
            if self._run_lock is not None:
                self._run_lock.release()
            raise

    def _start_run(self, policy: CheckpointPolicy | None, checkpoint_format: CheckpointFormat,
                   reduce: Callable[..., Any] | None) -> None:
        # the loggers, the throughput and FLOP meters, the profiler and the checkpoint keeper (the run's first
        # point goes to the loggers here)
        loggers = build_loggers(self._config.logger_items, self._config.log_dir,
                                default=self._config.loggers is None) if self.is_main_process else []
        self._reporter = Reporter(log_dir=self._config.log_dir, progress=self._config.progress,
                                 nonfinite=self._config.nonfinite, is_main=self.is_main_process,
                                 world_size=self.world_size, reduce=reduce, loggers=loggers,
                                 publish=lambda point: self._hooks(spec.devplug_log, point=point),
                                 replicas=(self._strategy.data_parallel() or (self.rank, self.world_size))[1])
        self.throughput = self._reporter.throughput
        self._log_values, self._log_every = self._reporter.metrics.add_all, self._config.log_every  # log()'s path
        self._training_names: set[str] = set()  # names log() has seen that are not evaluation names
        self._flops = self._reporter.flops = FlopMeter(
            steps_done=lambda: self._position.global_step, samples_done=lambda: self.throughput.samples_total,
            peak=self._peak,
            exclude=self.throughput.exclude, price_per_hour=self._config.price_per_hour,
            enabled=self._config.count_flops, number_format=format_name(precision_dtype(self.precision.name)),
            gemm=(lambda: plain_gemm_flops(self.torch_device, precision_dtype(self.precision.name)))
            if self._config.measure_gemm else None)
        self.throughput.while_paused = self._flops.uncounted  # a paused evaluation is not the counted step's work
        self._reporter.log_run(self.global_step, hparams=flatten_hparams(self._config.hparams), tags=run_tags(
            device=str(self.device), device_plugin=self.device.plugin_name, precision=self.precision.name))
        self.profiler = StepProfiler(self._config.profile, self._config.log_dir, lambda: self._hooks(
            spec.devplug_profiler_activities), lambda: self._position.global_step, rank=self.rank,
            exclude=self.throughput.exclude)
        self._route = StepRoute(self._hooks, self.profiler, FALLBACK_NAME)
        self._checkpoint_seconds = 0.0
        runs = None
        if policy is not None:
            from devplug.core.checkpoint.policy import RunCheckpoints

            runs = RunCheckpoints(policy)
        self._keeper = CheckpointKeeper(
            self._state, runs,
            checkpoint_format=checkpoint_format,
            combiner=self._combiner, is_main=self.is_main_process, nonfinite=self._config.nonfinite,
            stepped=self._stepped, policy_save=self._save_by_policy, bookkeeping=self._not_training)
        self._monitor = self._keeper.monitor  # log() hands the policy's monitored value to the keeper

    def _checkpoint_format(self) -> CheckpointFormat:
        # the author's choice, else the strategy's; a strategy whose own format every rank writes (sharded
        # parameters) cannot save in one that rank 0 writes alone
        own = format_named(self._strategy.checkpoint_format)
        if self._config.checkpoint_format is None or self._config.checkpoint_format == own.name:
            return own
        chosen = format_named(self._config.checkpoint_format)
        if own.collective and not chosen.collective:
            raise ConfigError(f"checkpoint_format={chosen.name!r} is written by rank 0 alone and cannot hold "
                              f"strategy={self.strategy!r}'s sharded state; leave checkpoint_format unset")
        return chosen

    def _peak(self) -> PeakFlops | None:
        # the author's figure, else the device plugin's (checked: an unusable figure never reaches MFU)
        if self._config.peak_flops is not None:
            return PeakFlops(float(self._config.peak_flops), "author")
        try:
            answer, plugin = self._hooks.first_answer(spec.devplug_peak_flops, precision=self.precision.name)
        except PluginError as exc:  # refused where the core received it: a reporting figure never ends a run
            log_once(f"MFU not reported: {' '.join(str(exc).split())}", logging.WARNING)
            return None
        return checked_peak(answer, plugin or "unknown")

    # ---- where am I -------------------------------------------------------------------------------
    @property
    def config(self) -> TrainerConfig:
        """The validated configuration this trainer was built with."""
        return self._config

    @property
    def launch(self) -> LaunchInfo:
        """Where this process sits in the job, as its launcher reported it (rank, world size, local rank, ...)."""
        return self._launch

    @property
    def torch_device(self) -> torch.device:
        """The ``torch.device`` this trainer places tensors on."""
        return self.device.torch_device

    @property
    def rank(self) -> int:
        """Global rank of this process (0 when not distributed)."""
        return self._launch.rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self._launch.world_size

    @property
    def is_main_process(self) -> bool:
        """True on rank 0, the only rank that writes files and shows progress."""
        return self._launch.rank == 0

    @property
    def global_step(self) -> int:
        """Training iterations so far (restored by `load`)."""
        return self._position.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self._position.global_step = value

    @property
    def scaler(self) -> Any:
        """The precision plan's grad scaler (``None`` without one); saved and restored with checkpoints.

        Its scale moves once per step, after every optimizer of the step's backward has stepped (torch's
        recipe); reading it here gives the scale the next backward will use.
        """
        self._update_scaler()
        return self._state.scaler

    @scaler.setter
    def scaler(self, value: Any) -> None:
        self._update_scaler()
        self._state.scaler = value

    def _update_scaler(self) -> None:
        # once per step, however many optimizers stepped through the scaler (torch's recipe: step each, then
        # update); done before the scale is used again, saved or replaced
        if self._scaler_update_due:
            self._scaler_update_due = False
            if self._state.scaler is not None:
                self._state.scaler.update()

    @property
    def epoch(self) -> int:
        """The current epoch (restored by `load`)."""
        return self._position.epoch

    @property
    def should_stop(self) -> bool:
        """True once a stop signal reached any rank (a collective under several processes: ask on every rank)."""
        return self._stop.should_stop(self.rank)

    @property
    def stop_signal(self) -> str | None:
        """The name of the stop signal that ended ``epochs()`` (``"SIGTERM"``), or ``None`` when none arrived."""
        return self._stop.signal_name

    @property
    def exit_code(self) -> int:
        """The exit status the run should end with: 0, or ``128 + signal`` after a stop signal (143 for SIGTERM)."""
        return self._stop.exit_code

    @property
    def last_metrics(self) -> dict[str, float]:
        """The values reported at the last log point."""
        return self._reporter.last_metrics

    @property
    def writer(self) -> Any:
        """The TensorBoard SummaryWriter (rank 0 with a TensorBoard logger), created on first use; else None."""
        return self._reporter.writer

    # ---- model, optimizer, data --------------------------------------------------------------------
    def to_device(self, obj: Any) -> Any:
        """Move a module, tensor or nested batch to the device (through the device plugin)."""
        return self._move(obj)

    def setup(self, module: torch.nn.Module, name: str | None = None, *, shard: Any = None,
              activation_checkpointing: Any = None, tp_plan: Any = None) -> torch.nn.Module:
        """Prepare ``module`` for training: precision conversion, device, compile, DDP or FSDP.

        The module is registered under ``name`` (default: its class name, lower-cased) for checkpoints; a
        model you compiled yourself (``torch.compile(model)``) is named and saved as the model it compiled.
        Returns the module to call in the loop: DDP-wrapped when launched with more than one process
        (``strategy="auto"`` or ``"ddp"``); with ``strategy="fsdp"``, sharded in place with ``fully_shard``
        over every instance of the classes in ``shard`` (a parameter count instead: every submodule that
        large; left out: 1,000,000), then the root. ``activation_checkpointing=[Block]`` recomputes those
        blocks' activations in backward instead of keeping them. With ``strategy="tp"`` or ``"fsdp+tp"``,
        ``tp_plan`` maps module paths (wildcards allowed) to ``"colwise"``, ``"rowwise"`` or ``"sequence"``
        (left out: each MLP's first layer colwise and last rowwise); see docs/distributed.md.
        """
        key = name or type(plain_module(module)).__name__.lower()  # a model you compiled: its own class
        if key in self._modules:
            raise ConfigError(f"a module named {key!r} is already set up; pass setup(module, name=...)")
        if self.precision.convert_module is not None:
            module = self.precision.convert_module(module) or module
        module = self.to_device(module)
        self._modules[key] = module
        if activation_checkpointing:
            from devplug.core.loop.recompute import apply_activation_checkpointing

            apply_activation_checkpointing(module, activation_checkpointing)
        plan = {} if tp_plan is None else {"tp_plan": tp_plan}
        module = self._strategy.prepare(module, shard, **plan)  # FSDP shards, TP splits, in place, before compiling
        if self._config.compile:
            module = self._compile(key, module)
        elif self.precision.uncompiled_note:
            log_once(self.precision.uncompiled_note, logging.WARNING)
        return self._strategy.wrap(module)

    def _compile(self, key: str, module: torch.nn.Module) -> Any:
        # the device plugin's backend and options, applied per sharded block (or whole); the summary says which
        from devplug.core.loop.compiling import apply_compile, compile_by_hook, compiles_by_hook

        if self._compile_plan is None:
            plan, plugin = self._hooks.first_answer(spec.devplug_compile_plan)
            if not isinstance(plan, CompilePlan):
                raise PluginError(f"plugin {plugin or 'unknown'} answered devplug_compile_plan with {plan!r}, "
                                  "not a devplug.CompilePlan")
            self._compile_plan = plan
            self._compile_by_hook = compiles_by_hook(self._hooks, plugin, FALLBACK_NAME)  # a pre-1.7 plugin's way
        if self._compile_by_hook:
            module, self._compiled[key] = compile_by_hook(self._hooks, module, self._config.compile_options)
            return module
        module, self._compiled[key] = apply_compile(module, self._compile_plan, self._config.compile_options)
        return module

    def optimizer(self, algorithm: str | type[torch.optim.Optimizer], params: Iterable[Any], *,
                  name: str | None = None, **options: Any) -> torch.optim.Optimizer:
        """Build the device's fastest implementation of ``algorithm`` (``"adamw"`` or ``torch.optim.AdamW``).

        ``name`` keys its state in checkpoints (default: the set-up module whose parameters it holds);
        another optimizer class is built as it is. ``optimizer_implementation(opt)`` names what was built.
        """
        from devplug.core.optim.build import algorithm_name, build_choice, listed_params, optimizer_key

        params = listed_params(params)
        algo, own_class = algorithm_name(algorithm)
        key = optimizer_key(params, self._modules, self._optimizers, algo, name)
        ask = self._strategy.optimizer_request(algo, params, options, lambda: self._hooks(
            spec.devplug_optimizer, name=algo, params=params, options=dict(options)))
        choice = build_choice(algo, own_class, params, options, ask, str(self.device))
        self._optimizers[key] = choice
        self._reporter.log_run(self.global_step, tags={f"optimizer/{key}": choice.implementation})
        if choice.reason:
            log.info("optimizer %s: %s (%s)", key, choice.implementation, choice.reason)
        return choice.optimizer

    def optimizer_implementation(self, optimizer: torch.optim.Optimizer) -> str:
        """The implementation the plugin chose for ``optimizer``, e.g. ``"torch.optim.Adam(fused=True)"``."""
        for choice in self._optimizers.values():
            if choice.optimizer is optimizer:
                return choice.implementation
        raise ValueError("this optimizer was not built by Trainer.optimizer()")

    def dataloader(
        self, source: Any, batch_size: int | None = None, *, train: bool = True, shuffle: bool = False,
        drop_last: bool = False, num_workers: int | None = None, pin_memory: bool | None = None,
        persistent_workers: bool = True, prefetch_factor: int | None = None, collate_fn: Any = None,
        sampler: Any = None, seed: int | None = None,
    ) -> DeviceLoader:
        """A loader whose batches arrive on the device: a training loader, or an evaluation one (``train=False``).

        ``source`` is a Dataset or ImageFolderSource (the device plugin picks the loader: DALI,
        HabanaDataLoader, a tuned torch DataLoader; under DDP each rank reads its own shard), or a
        DataLoader or iterable of batches the author built (used as it is). A list or tuple given with
        ``batch_size`` holds samples (a Dataset); without it, batches. A generator is one pass: iterating it
        again is an error (give a list, or an object whose ``__iter__`` starts a fresh pass). Training loaders
        count steps; an evaluation loader never does and is never skipped on resume. Under several processes an
        evaluation loader's shards are disjoint, unpadded blocks that together hold the dataset exactly once
        (`devplug.core.data.evaluation`): combine what the ranks computed with `all_reduce` or
        `gather` after the pass.
        ``num_workers``, ``pin_memory`` and ``prefetch_factor`` left out (``None``) are chosen by the device
        plugin from the device and a measurement of the source (``loader.choice.reason`` says what and
        why); given, they are used exactly as given.
        """
        from devplug.core.data.device_loader import DeviceLoader, is_dataset, loader_options, own_loader_choice

        base_seed = self._config.seed if seed is None and self._config.seed is not None else (seed or 0)
        if is_dataset(source) and not (batch_size is None and isinstance(source, (list, tuple))):
            if batch_size is None:
                raise ConfigError("batch_size is required to load a Dataset: trainer.dataloader(dataset, 64)")
            data_rank, data_world = self._strategy.data_parallel() or (self.rank, self.world_size)
            options = loader_options(
                batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                pin_memory=pin_memory, persistent_workers=persistent_workers, prefetch_factor=prefetch_factor,
                seed=base_seed, rank=data_rank, world_size=data_world, collate_fn=collate_fn, sampler=sampler,
                evaluation=not train)
            choice = self._hooks(spec.devplug_dataloader, source=source, options=options)
            assert choice is not None  # the core fallback always answers
        else:
            choice = own_loader_choice(source, batch_size)
        if choice.reason:
            log.info("data loader: %s (%s)", choice.implementation, choice.reason)
        index = sum(1 for loader in self._loaders if loader.train)
        loader = DeviceLoader(choice, base_seed, self._position, self._move, self.throughput.add, train=train,
                              index=index, world_size=self.world_size,
                              region=self._route.region_or_none if self._route.may_mark() else None,
                              before_batch=self._before_batch,
                              after_batches=self._flops.stop, on_data_lost=self._data_lost if train else None)
        self._loaders.append(loader)
        return loader

    def _data_lost(self, exc: BaseException) -> DataError:
        # The training data failed between steps: save the last finished step first (the policy's checkpoint;
        # not under FSDP, where a save is a collective the other ranks may not reach), then stop in one line.
        from devplug.core.data.device_loader import data_lost_reason

        step, saved = self._position.global_step, None
        if self._keeper.runs is not None and not self._keeper.format.collective and self._position.window_closed():
            try:
                saved = self._keeper.save_by_policy()
            except Exception as save_exc:  # a full disk too: the data's failure is the one to report
                log.warning("the checkpoint of step %d could not be saved: %s", step, save_exc)
        kept = f"; step {step} was saved first ({saved})" if saved else ""
        return DataError(f"the training data failed after step {step}: {data_lost_reason(exc)}{kept}")

    # ---- the step ---------------------------------------------------------------------------------------
    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A profiler region named ``name`` as the device plugin marks it (NVTX on CUDA when profiling), inside a
        ``record_function`` range in a profiler window (``profile=``)."""
        return self._route.region(name)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for forward and loss: the precision plan's autocast inside a ``"forward"`` region."""
        route, factory = self._route, self.precision.autocast
        if not route.marks_regions and not route.profiler.active:  # nothing marked: the plan's context alone
            return NO_REGION if factory is _NO_AUTOCAST else factory()
        return Regioned(route.region("forward"), factory())

    @property
    def sync_gradients(self) -> bool:
        """True on the micro-batch that completes a step (always, without gradient accumulation)."""
        return self._position.sync_now

    def backward(self, loss: torch.Tensor) -> None:
        """Backward (loss scaled by 1/N when accumulating, through the grad scaler), then step marking.

        The step is marked after every backward, also on micro-batches that do not complete a step, so a
        lazy device's graph holds one forward and backward (as the Gaudi vendor's own trainers do).
        """
        position, route = self._position, self._route
        accumulation = position.accumulation
        if accumulation > 1:
            loss = loss / accumulation
        if self._scaler_update_due:
            self._update_scaler()
        scaler = self._state.scaler
        self._backwards += 1
        if not route.marks_regions and not route.profiler.active:  # nothing marked: no context entered
            (loss if scaler is None else scaler.scale(loss)).backward()
        else:
            with route.region("backward"):
                (loss if scaler is None else scaler.scale(loss)).backward()
        if route.marks_steps:
            route.mark_step(Phase.BACKWARD)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Optimizer step (through the scaler), step marking, ``zero_grad(set_to_none=True)``; True if it stepped.

        On a micro-batch that does not complete a step it does nothing and returns False: the gradients
        keep accumulating. A grad scaler's update waits until every optimizer of the backward has stepped
        (it is made before the next backward, a save, or a read of ``scaler``), as torch's recipe does.
        """
        position = self._position
        if position.accumulation != 1 and not position.sync_now:
            return False
        if self._backwards == self._backwards_at_step:  # no trainer.backward() since the last step()
            self._check_gradients(optimizer)
        self._backwards_at_step = self._backwards
        known = self._stepped_ids.get(id(optimizer))
        if known is None or known() is not optimizer:  # once per optimizer, not a WeakSet add per step
            self._stepped.add(optimizer)
            self._stepped_ids[id(optimizer)] = weakref.ref(optimizer)
        route, step_context, scaler = self._route, self.precision.optimizer_step_context, self._state.scaler
        if scaler is None and step_context is None and not route.marks_regions and not route.profiler.active:
            optimizer.step()  # nothing to enter around it
        else:
            with route.region("optimizer_step"), (step_context() if step_context else NO_REGION):
                if scaler is not None:
                    scaler.step(optimizer)
                    self._scaler_update_due = True  # updated once every optimizer of this backward has stepped
                else:
                    optimizer.step()
        if route.marks_steps:
            route.mark_step(Phase.OPTIMIZER_STEP)
        optimizer.zero_grad(set_to_none=True)
        return True

    def _check_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        # step() without trainer.backward() since the last step: fine for a second optimizer of the same
        # backward, or a loss.backward() of the author's own without a grad scaler; else one line what to do
        if not parameters_with_grad(optimizer):
            raise ConfigError("trainer.step(optimizer) found no gradients: nothing would change; call "
                              "trainer.backward(loss) before trainer.step(optimizer)")
        if self._state.scaler is not None and self._backwards == 0:
            raise ConfigError(f"precision {self.precision.name!r} scales the loss with a grad scaler: call "
                              "trainer.backward(loss) instead of loss.backward(), so that the scaler sees the loss")

    def _unscale(self, optimizer: torch.optim.Optimizer) -> None:
        # torch's GradScaler remembers that this optimizer's gradients are unscaled; its step() then skips
        # unscaling, and a second unscale_ before update() is refused: exactly once per step.
        scaler = self._state.scaler  # (not the property: an update due after another optimizer's step waits)
        if scaler is not None:
            scaler.unscale_(optimizer)

    def clip_grad_norm(self, optimizer: torch.optim.Optimizer, max_norm: float,
                       norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients to a total norm of ``max_norm``; the norm before clipping, on the device.

        Call between ``backward`` and ``step``. With a grad scaler the gradients are unscaled first (once;
        ``step`` does not unscale again), so ``max_norm`` is in the units of the true gradients, and a
        step the scaler skips for inf/NaN gradients is still skipped. The device plugin supplies the
        kernel (Gaudi's fused clip norm). On a micro-batch that does not complete a step (gradient
        accumulation) nothing is clipped and ``None`` is returned. Nothing is read back to the host.
        """
        if not self._position.sync_now:
            return None
        self._unscale(optimizer)
        parameters = parameters_with_grad(optimizer)
        return self._strategy.clip_grad_norm(lambda: self._hooks(
            spec.devplug_clip_grad_norm, parameters=parameters, max_norm=float(max_norm), norm_type=float(norm_type)))

    def clip_grad_value(self, optimizer: torch.optim.Optimizer, clip_value: float) -> bool:
        """Clamp ``optimizer``'s gradients to ``[-clip_value, clip_value]`` (after unscaling); True if it clipped.

        Like `clip_grad_norm`, it acts only on the micro-batch that completes a step.
        """
        if not self._position.sync_now:
            return False
        self._unscale(optimizer)
        torch.nn.utils.clip_grad_value_(parameters_with_grad(optimizer), float(clip_value))
        return True

    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module) -> Iterator[None]:
        """Skip DDP's all-reduce (FSDP's reduce-scatter) of gradients inside; a no-op without them (prefer
        `accumulate`)."""
        with self._strategy.no_sync(module):
            yield

    @contextlib.contextmanager
    def accumulate(self, *modules: torch.nn.Module) -> Iterator[None]:
        """Gradient accumulation over ``accumulate_grad_batches`` micro-batches, around one micro-batch's work.

        For example:

            for x, y in loader:
                with trainer.accumulate(model):
                    with trainer.autocast():
                        loss = criterion(model(x), y)
                    trainer.backward(loss)          # loss / N, then the device's step marking
                    trainer.clip_grad_norm(opt, 1.0)
                    trainer.step(opt)               # steps only on the last micro-batch

        Skips DDP's gradient all-reduce for ``modules`` on the micro-batches that do not complete a step.
        """
        with contextlib.ExitStack() as stack:
            if not self._position.sync_now:
                for module in modules:
                    stack.enter_context(self.no_sync(module))
            yield

    # ---- values across ranks (evaluation) ---------------------------------------------------------------
    def all_reduce(self, value: Any, op: str = "sum") -> Any:
        """``value`` (a tensor or a number) reduced over all ranks: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.

        A collective: call it on every rank, the same number of times, after the evaluation pass rather than
        per batch (an evaluation loader's shards may differ by one batch). Every rank gets the result; a
        tensor is returned as a new tensor, a number as a number. In one process it returns ``value``
        itself. ``correct = trainer.all_reduce(correct, op="sum")`` turns each rank's count of its own
        shard into the count over the whole evaluation set.
        """
        from devplug.core.distributed.reduce import REDUCE_OPS, all_reduce

        if op not in REDUCE_OPS:
            raise ConfigError(f"all_reduce op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        if not self._launch.distributed:
            return value
        return all_reduce(value, op, self.torch_device)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along its first dimension, in rank order (uneven sizes allowed).

        A collective: call it on every rank, the same number of times (collect a pass's outputs, then
        gather once). Other dimensions and the dtype must agree across ranks. An evaluation loader gives
        rank ``r`` the ``r``-th contiguous block of its dataset, so gathering a whole unshuffled pass's
        outputs gives them in the dataset's order, each sample once. In one process it returns ``tensor``.
        """
        if not self._launch.distributed:
            return tensor
        from devplug.core.distributed.reduce import gather

        return gather(tensor)

    # ---- coordination across ranks --------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every rank reaches this call (a collective: call it on every rank; nothing in one process)."""
        if self._combiner is not None:
            self._combiner.max(0)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on rank 0 first, then on the other ranks (a collective: enter it on every rank).

        For work whose result the other ranks then reuse: a download, a preprocessed cache. In one process
        the block simply runs. When the block raises on rank 0, the other ranks do not run it: they raise a
        `devplug.DevplugError` saying so (rank 0's own error says why).
        """
        combiner = self._combiner
        if combiner is not None and not self.is_main_process and combiner.max(0):
            raise DevplugError("the main process failed inside main_process_first(), so this rank did not run the "
                               "block; the main process's error says why")
        failed = True
        try:
            yield
            failed = False
        finally:
            if combiner is not None and self.is_main_process:
                combiner.max(int(failed))  # the other ranks wait for this word

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` (any picklable object), returned on every rank (a collective; one process: ``obj``).

        For small values decided on one rank (a run name, a chosen file, a seed); tensors of a model's size
        belong in ``all_reduce`` or ``gather``.
        """
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.world_size:
            raise ConfigError(f"broadcast src must be a rank from 0 to {self.world_size - 1}, got {src!r}")
        if self._combiner is None:
            return obj
        return self._combiner.broadcast(obj, source=src)

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The plain model inside what `setup` returned, for inference or export: without the DDP and
        ``torch.compile`` wrappers, sharing the training model's parameters (nothing is copied).

        ``torch.save(trainer.unwrap(model).state_dict(), "model.pt")`` writes weights any PyTorch script
        loads. With ``strategy="fsdp"`` the parameters stay sharded: save a checkpoint and make it one file
        with ``devplug.toolkit.consolidate_checkpoint``.
        """
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            module = module.module
        return plain_module(module)

    # ---- epochs, logging, progress ---------------------------------------------------------------------
    def epochs(self, n: int, *, max_steps: int | None = None) -> Iterator[int]:
        """Yield epoch numbers from where a resumed run left off up to ``n``; stop after ``max_steps`` steps.

        Called again after leaving an epoch early (``max_steps``, ``break``), it continues that epoch where
        it was: the training loader's next pass skips the batches already read, as after a resume.

        Sets loader sampler epochs and shows progress on rank 0. A stop signal (``stop_signals``) ends it at
        the next step boundary (then save, and exit with ``exit_code``). Leaving it, however, reports the
        values logged since the last log point and shuts down the loaders' worker processes (a loader
        iterated afterwards starts new ones).
        """
        if max_steps is not None and max_steps < 1:
            raise ConfigError(f"max_steps must be a positive integer, got {max_steps!r}")
        runs = self._keeper.runs
        if runs is not None and runs.policy.auto_resume and not self._keeper.resumed:
            resumed = self.resume()
            if resumed is not None and self.is_main_process:
                print(f"devplug: resumed from {resumed.path} (step {resumed.step}, epoch {resumed.epoch})",
                      file=sys.stderr, flush=True)
        position = self._position
        if position.batches_in_epoch and position.batches_in_epoch >= self._epoch_batches():
            position.finish_epoch()  # resumed from the end of an epoch: its evaluation and save already ran
        elif position.batches_in_epoch and position.window_closed() and not position.resume_points:
            self._continue_epoch()  # a loop left inside this epoch (max_steps, break), entered again
        position.max_steps = max_steps
        position.in_epochs = True
        per_epoch = position.steps_per_epoch(self._epoch_batches())
        total = min(max_steps if max_steps is not None else math.inf, per_epoch * n)  # whichever ends the run
        self._reporter.open_progress(None if total == math.inf else int(total), position.global_step)
        with self._stop.handling():
            try:
                while position.epoch < n and position.steps_left() and not position.stopped:
                    yield position.epoch
                    ended = position.stopped or not position.steps_left()  # max_steps or a stop signal
                    if ended and position.batches_in_epoch < self._epoch_batches():
                        break  # inside the epoch: a resume continues it
                    position.finish_epoch()
                    if (position.epoch < n and position.steps_left() and not position.stopped
                            and position.stop_check is not None and position.stop_check()):
                        position.stopped = True  # asked during the epoch's evaluation: no next epoch begins
                self._flush_logs()
                if runs is not None and runs.policy.at_end:
                    self._keeper.save_by_policy()
                elif runs is not None:  # a save due at the last step: no batch is asked for after it to make it
                    self._keeper.save_if_due()
                self._keeper.warn_unseen_monitor()
            finally:  # left early (break, exception): what is still pending, this rank's values only
                position.in_epochs = False
                self._reporter.flush_quietly(lambda: self._flush_logs(across_ranks=False))
                self._reporter.settle(self.synchronize)  # summary()'s rate: the steps after the last log point too
                self._reporter.close_progress()
                self.profiler.stop()
                self._flops.stop()
                self._stop_loader_workers()  # the loop is over: its loaders' worker processes end now, not at GC

    def _continue_epoch(self) -> None:
        # each training loader's next pass starts where this process left the epoch, as a resume from a checkpoint
        # saved there would, instead of reading the epoch's batches again; an iterator (a generator), and a pass
        # the author still holds open (a loader beside the primary, cycled by the author), go on by themselves
        for loader in self._loaders:
            if loader.train and not loader.passing and not isinstance(loader.choice.loader, Iterator):
                self._position.resume_points[loader.index] = loader.resume_point(self.world_size)

    def _stop_loader_workers(self) -> None:
        for loader in self._loaders:
            loader.stop_workers()

    def _before_batch(self) -> None:
        # a training loader is about to ask for a batch: the profiler window and the FLOP count start here,
        # and between steps the checkpoint policy may save
        if self.profiler.window is not None:
            self.profiler.before_batch()
        self._flops.before_batch()
        if self._keeper.runs is not None and self._position.window_closed():
            self._keeper.save_if_due()

    def _epoch_batches(self) -> float:
        primary = next((loader for loader in self._loaders if loader.primary), None)
        return primary.length() if primary is not None else math.inf

    def log(self, **scalars: Any) -> dict[str, float] | None:
        """Record scalars (tensors stay on the device); at every ``log_every``-th step, report them.

        A log point averages the values since the previous one, reduces them across ranks, checks for
        NaN/inf and writes them (rank 0): the only place training values are read from the device. Returns
        them. Evaluation values (logged inside ``epochs()`` after the epoch's training batches, or named
        ``val_*``, ``eval_*``, ``val/*``, ``eval/*``) are written at once, as logged, at the current step:
        read back then, not averaged with other values nor across ranks (reduce them first).
        """
        position = self._position
        step = position.global_step
        if scalars:
            if position.drawing and self._training_names.issuperset(scalars):
                self._log_values(scalars)  # training values of a step: kept on the device until a log point
            else:
                self._log_split(scalars, step)
            if self._monitor is not None and self._monitor in scalars:
                self._keeper.monitor_logged(step, scalars[self._monitor])
        if step and not step % self._log_every and (position.accumulation == 1 or position.sync_now):
            return self._flush_logs()
        return None

    def _log_split(self, scalars: dict[str, Any], step: int) -> None:
        # evaluation values (logged inside epochs() after the epoch's training batches, or named val_* /
        # eval_*) are written at once, as logged; the rest wait for the next log point
        position, evaluation, training = self._position, {}, {}
        after_batches = position.in_epochs and not position.drawing
        for name, value in scalars.items():
            if evaluation_name(name):
                evaluation[name] = value
                continue
            self._training_names.add(name)
            if after_batches:
                evaluation[name] = value
            else:
                training[name] = value
        if training:
            self._log_values(training)
        if evaluation:
            self._reporter.write_now(step, evaluation)

    def flush_logs(self, *, across_ranks: bool = True) -> dict[str, float] | None:
        """Report pending values now; the last ones if none are pending.

        Under several processes this is a collective (values are averaged across ranks): call it on every
        rank, or pass ``across_ranks=False`` for this rank's values alone. Called on some ranks only, it
        fails after ``$DEVPLUG_COLLECTIVE_WAIT`` seconds (default 120) with an error saying so.
        """
        if across_ranks and self._handshake is not None:
            try:
                self._handshake.max(1)
            except RuntimeError as exc:
                raise ConfigError(f"flush_logs() is a collective under {self.world_size} processes and rank "
                                  f"{self.rank} waited for the others in vain: call it on every rank, or "
                                  "flush_logs(across_ranks=False) for this rank's values") from exc
        return self._flush_logs(across_ranks=across_ranks)

    def _flush_logs(self, *, across_ranks: bool = True) -> dict[str, float] | None:
        rates = {key: c.optimizer.param_groups[0].get("lr") for key, c in self._optimizers.items()}
        return self._reporter.flush(self.global_step, synchronize=self.synchronize, learning_rates=rates,
                                   across_ranks=across_ranks)

    def log_images(self, tag: str, images: torch.Tensor, *, nrow: int = 8, path: str | None = None) -> None:
        """Write a grid of images (N×C×H×W in [-1, 1]) to the loggers and optionally a PNG file (rank 0).

        The PNG written to ``path`` reaches the loggers too (an MLflow artifact under ``images/``).
        """
        self._reporter.log_images(tag, images, self.global_step, nrow=nrow, path=path)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Hand hyperparameters to every logger now (rank 0), as ``Trainer(hparams=...)`` does when it is built.

        Nested mappings are flattened (``{"opt": {"lr": 1e-3}}`` → ``opt.lr``); values other than
        bool/int/float/str are stored as text. Call it again to add more.
        """
        self._reporter.log_run(self.global_step, hparams=flatten_hparams(hparams))

    # ---- measurements ------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for queued device work (log points and timing only)."""
        self._hooks(spec.devplug_synchronize)

    def memory_stats(self) -> MemoryStats | None:
        """The device plugin's memory statistics record, or ``None``."""
        return self._hooks(spec.devplug_memory_stats)

    def summary(self, *, all_ranks: bool = False) -> RunSummary:
        """Device, precision, optimizers, loaders, steps, throughput, efficiency and memory of this run.

        ``reasons`` says why each automatic choice was made (device and precision ``"auto"``, the layout,
        the optimizer and loader implementations, sharding); ``evaluation`` holds the last value of each
        evaluation figure, as logged. On ranks other than 0 the summary prints as an empty string unless
        ``all_ranks=True`` (its values are there on every rank).

        Throughput and efficiency come from the reporter: ``samples_per_sec``, ``samples_per_hour``,
        ``data_wait``, ``input_bound``, and where known ``flops_per_sample``, ``peak_flops`` and ``peak_source``
        (the peak MFU is computed against and where it comes from), ``mfu`` and ``samples_per_dollar``.
        A read-only mapping (``summary()["steps"]``) that prints as a table; ``to_dict()`` for JSON.
        """
        from devplug.core.observe.summary import RunSummary

        return RunSummary({
            "device": str(self.device),
            "device_plugin": self.device.plugin_name,
            "world_size": self.world_size,
            "precision": self.precision.name,
            "precision_detail": self.precision.description,
            "optimizers": {k: c.implementation for k, c in self._optimizers.items()},
            "compiled": dict(self._compiled),
            "loaders": [loader.implementation for loader in self._loaders],
            "steps": self.global_step,
            "epoch": self.epoch,
            **self._reporter.rates(),
            "memory": self.memory_stats(),
            "evaluation": dict(self._reporter.evaluation),
            "reasons": self._reasons(),
            "stop_reason": self._stop.reason,
            "last_checkpoint": str(runs.last_path) if (runs := self._keeper.runs) and runs.last_path else None,
        }, shown=all_ranks or self.is_main_process)

    def _reasons(self) -> dict[str, str]:
        # why each choice the author left to devplug came out as it did
        reasons: dict[str, str] = {}
        if (self._config.device or os.environ.get("DEVPLUG_DEVICE", "").strip() or "auto") == "auto":
            reasons["device"] = (f"'auto' chose {self.device.spec.name}: the available device of highest priority "
                                 f"(plugin {self.device.plugin_name})")
        if self._config.precision == "auto":
            detail = self.precision.description
            why = detail.rsplit("(auto: ", 1)[1].removesuffix(")") if "(auto: " in detail else detail
            reasons["precision"] = f"'auto' chose {self.precision.name}: {why}"
        if self.device.layout_reason:
            reasons["layout"] = self.device.layout_reason
        reasons.update({f"optimizer/{key}": c.reason for key, c in self._optimizers.items() if c.reason})
        reasons.update({f"loader/{i}": loader.choice.reason for i, loader in enumerate(self._loaders)
                        if loader.choice.reason})
        if self._strategy.reason:
            reasons["sharding"] = self._strategy.reason
        return reasons

    # ---- checkpoints -----------------------------------------------------------------------------------
    @property
    def checkpoint_seconds(self) -> float:
        """Seconds this process spent on the checkpoint policy's saves (writing them, then rewriting their index and
        pruning old ones), left out of samples/s and MFU.

        A throughput meter of your own (`devplug.ThroughputMeter`) can leave them out too:
        ``meter.exclude(trainer.checkpoint_seconds)`` before reading its rate.
        """
        return self._checkpoint_seconds

    def _save_by_policy(self, path: str | os.PathLike[str]) -> str | None:
        # a policy save is not training time: the steps queued before it finish first (the save would wait for
        # them anyway), then its time is taken out of the throughput clock
        self.synchronize()
        began = time.perf_counter()
        try:
            return self.save(path)
        finally:
            self._not_training(time.perf_counter() - began)

    def _not_training(self, seconds: float) -> None:
        # checkpoint time (a policy save, its index and pruning): out of the throughput clock, into checkpoint_seconds
        self.throughput.exclude(seconds)
        self._checkpoint_seconds += seconds

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: modules, optimizers, scaler, counters, RNG states."""
        self._update_scaler()
        return self._state.state_dict()

    def save(self, path: str | os.PathLike[str], *, async_save: bool = False, **extra: Any) -> str | None:
        """Write a checkpoint atomically (rank 0 only); ``extra`` holds the author's own state (under names other
        than those given to `register_for_checkpointing`, whose objects' states are saved under them).

        Returns the path written, or ``None`` on other ranks. Raises ``devplug.NonFiniteLossError`` and
        writes nothing when a weight or optimizer state holds NaN or infinity (docs/trainer.md, Checkpoints),
        and ``devplug.CheckpointError`` naming the entry when ``extra`` (or a registered object's state) holds
        what ``torch.load(weights_only=True)`` would not read back (a numpy value, a ``Path``, an object).
        Warns, naming it, about an optimizer given to `step` whose state the checkpoint does not hold.
        With ``strategy="fsdp"`` it writes a sharded checkpoint folder instead, every rank its shards (call
        it on every rank; it returns the path on all); ``async_save=True`` writes it in the background, and
        the next save or `close` waits for it (plain checkpoints are always written at once).
        """
        self._update_scaler()
        return self._keeper.save(path, extra, async_save=async_save)

    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore a checkpoint written by `save` into the set-up modules and optimizers.

        Call after ``setup`` and ``optimizer``; the optimizers may be other implementations than the ones
        that saved (another device's). Raises `CheckpointError` if the file is unreadable, damaged or
        does not match what this trainer holds; nothing is modified in that case. Returns ``extra``.
        A sharded checkpoint folder (``strategy="fsdp"``) loads on any world size, sharded or not: a
        collective under several processes (call it on every rank). Its fit is checked first; the shards are
        then read in place, so a read failing midway (a damaged shard file) can leave weights partly loaded.
        """
        self._update_scaler()
        return self._keeper.load(path)

    def register_for_checkpointing(self, **objects: Any) -> None:
        """Save ``objects`` in every checkpoint and restore them on load (a scheduler, an EMA, fixed noise).

        Each is an object with ``state_dict()`` and ``load_state_dict()`` (restored through it) or a tensor
        (restored in place). Their state is kept under their names in the checkpoint's ``extra``.
        """
        self._keeper.register(**objects)

    def resume(self, path: str | os.PathLike[str] | None = None) -> Resumed | None:
        """Continue from a checkpoint; a `Resumed` record of what happened, ``None`` for a new run.

        Without ``path``: the newest intact checkpoint of the checkpoint policy's directory (``None`` when it
        holds none). With ``path``: that checkpoint file (a damaged one is an error), or the newest intact one
        of that folder. Damaged or non-finite checkpoints of a folder are skipped with a warning (the one
        before is tried); resuming from an older one of the policy's own directory moves the newer ones aside
        into ``abandoned-<time>/`` (another run's folder is only read). Call it after ``setup`` and
        ``optimizer``; ``epochs()`` calls it itself with ``auto_resume=True``. Every rank resumes from the
        checkpoint rank 0 chose (a collective under several processes).
        """
        self._update_scaler()
        resumed = self._keeper.resume(path)
        if resumed is not None:
            self._reporter.resumed(resumed.step)  # the loggers drop what the interrupted run wrote past it
        return resumed

    def checkpoint_now(self) -> str | None:
        """Save this step's checkpoint by the checkpoint policy now (named, pruned and checked as its own saves).

        For a point of your choosing the policy would not save at, e.g. after an interrupted loop, at a step
        boundary. Nothing is written when this step is already saved, at step 0, or when the weights are
        non-finite and ``nonfinite`` is not ``"raise"`` (a warning says so). A checkpoint file is written by
        rank 0 alone (``None`` on the other ranks); a sharded checkpoint (FSDP) by every rank, each writing
        its shards, and every rank gets its path. Returns the path written, else ``None``.
        """
        return self._keeper.save_by_policy()

    def request_stop(self, reason: str) -> None:
        """Stop every rank after the same step, from any rank (e.g. early stopping seen on rank 0).

        ``epochs()`` ends at the next step boundary as after a stop signal, with the exit code left at 0;
        ``summary()["stop_reason"]`` says why.
        """
        self._stop.request_stop(reason)

    def close(self) -> None:
        """Flush and close the loggers (their final point, with the run's summary) and the progress bar, shut
        down the data loaders' worker processes and let go of the checkpoint folder's run lock.

        Values logged since the last log point are reported first, this rank's (as when a loop is left): under
        several processes call ``flush_logs()`` on every rank before, for values averaged across ranks.

        A background save (``save(..., async_save=True)``) is waited for first; if it failed, its error is
        raised after everything else is closed.

        The process group stays joined (other trainers in the process may use it); call
        ``torch.distributed.destroy_process_group()`` at the very end of a distributed script.
        """
        if self._watched_thread is not None:
            watchdog().unwatch(self._watched_thread)
            self._watched_thread = None
        self.profiler.stop()
        self._flops.stop()  # a loop left inside the counted step: the counter and compile's stance end here
        self._stop_loader_workers()
        try:
            self._keeper.writer.wait()  # a background save's failure is raised once the rest is closed
        finally:
            # values logged since the last log point (after the loop, say): reported, this rank's, as a loop left does
            self._reporter.flush_quietly(lambda: self._flush_logs(across_ranks=False))
            summary: dict[str, Any] = {}
            if self.is_main_process and not self._reporter.closed:
                try:
                    summary = self.summary().to_dict()
                except Exception as exc:  # close() may run while an exception unwinds: do not mask it
                    log.warning("the run's summary was not handed to the loggers: %s", exc)
            try:
                self._reporter.close(self.global_step, summary)
            finally:
                if self._run_lock is not None:
                    self._run_lock.release()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


"""The hook contract between devplug's core and its plugins.

Two kinds of plugin implement these hooks:

- a **device plugin** implements ``devplug_register_devices`` and returns one or more
  `DeviceSpec` from it; once a device is resolved, only the plugin that
  registered it (plus device-neutral plugins) sees the operational hooks, so a device plugin never has
  to ask "is this my device?";
- a **device-neutral plugin** does not implement ``devplug_register_devices`` and may implement (or wrap, with
  ``@devplug.hookimpl(wrapper=True)``) any operational hook for every device: profilers, loggers,
  a different optimizer policy.

The kind is a static fact about the plugin, the same on every machine: a plugin that implements
``devplug_register_devices`` must return at least one device whatever the machine has (availability
belongs in the probe); one that returns nothing is rejected at load.

The core ships a fallback plugin implementing every first-result hook with device-generic PyTorch
(``torch.accelerator``, ``torch.get_device_module``, ``torch.amp``, the distributed backend map),
registered so that it runs last. A device plugin therefore only needs
``devplug_register_devices`` and the hooks where its device is faster.

Every operational hook receives ``device``, the resolved `Device`.
Pluggy lets an implementation accept only the arguments it needs. Every answer is checked against
the return annotation of its spec where the core receives it: a wrong type raises a
``devplug.PluginError`` naming the plugin, its distribution, the hook and the expected record.

A hook must return promptly. devplug bounds the one-time questions it asks a plugin by a time limit
(``DEVPLUG_PROBE_TIMEOUT`` seconds): availability probes, ``devplug_doctor`` and ``devplug_precision`` each
run in a worker thread and a plugin that does not answer in time is named. The hooks of the training
step and of setup (moving, compiling, building loaders, marking steps) are not bounded, because bounding
them would cost time in every step: one that blocks blocks the Trainer, and returning promptly is the
plugin's responsibility.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import pluggy
import torch

from devplug.core.contract.records import (
    CollectiveSetup,
    CompilePlan,
    Device,
    DeviceSpec,
    DoctorReport,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    LogPoint,
    MemoryStats,
    OptimizerChoice,
    PeakFlops,
    Phase,
    PrecisionPlan,
    ShardingPlan,
    StepMarks,
)

PROJECT = "devplug"
hookspec = pluggy.HookspecMarker(PROJECT)


# ---- Registration: when a plugin is loaded and a device is chosen -----------------------------------------------


@hookspec
def devplug_register_devices() -> DeviceSpec | Iterable[DeviceSpec]:
    """Announce the device types this plugin serves.

    Called once on every plugin that implements it, when the plugin is loaded. Implementing it makes a
    plugin a device plugin: return a `DeviceSpec` or a list of them, the same on every machine
    (a runtime that is missing makes the device *unavailable* through ``DeviceSpec.probe``, never
    absent). A plugin that returns nothing, or something else, is reported and skipped. Must be cheap
    and must not import a vendor stack: the probe runs only when availability matters, in a worker
    thread under the time limit (``DEVPLUG_PROBE_TIMEOUT``). A
    device-neutral plugin does not implement this hook. Not first-result: every plugin answers.
    """


@hookspec
def devplug_device_setup(device: Device) -> None:
    """Prepare the process for ``device`` once it has been chosen.

    Called once per Trainer, after resolution and before anything is placed on the device: the place
    to import a vendor runtime (``habana_frameworks.torch.core``), set ``torch.cuda.set_device``, enable
    TF32 and so on. Returns nothing. Not first-result: every implementation runs.
    """


# ---- Building a run: what Trainer(...), setup(), optimizer() and dataloader() ask once --------------------------


@hookspec(firstresult=True)
def devplug_to_device(device: Device, obj: Any) -> Any:
    """Move ``obj`` to ``device`` and return the moved object.

    ``obj`` is a ``torch.nn.Module``, a tensor, or a nested batch (lists, tuples, dicts, namedtuples,
    with tensors and other leaves that are returned unchanged). A module is moved in place and the same
    object returned (as ``module.to(device)`` does): a copy, a wrapper or another object is refused with a
    ``PluginError`` naming the plugin, since the Trainer's optimizers and checkpoints hold the module it was
    given. Tensors are copied (``non_blocking`` where the source is pinned). Called by
    ``Trainer.setup``, ``Trainer.to_device`` and for every batch a loader yields off the device.
    First-result.
    """


@hookspec(firstresult=True)
def devplug_optimizer(
    device: Device, name: str, params: Any, options: dict[str, Any]
) -> OptimizerChoice | None:
    """Build the fastest optimizer for ``name`` (``"adam"``, ``"adamw"``, ``"sgd"``, …) on ``device``.

    ``params`` is what ``torch.optim`` accepts (an iterable of parameters or of parameter groups);
    ``options`` are the author's keyword arguments (``lr``, ``betas``, ``weight_decay``, …) to map
    faithfully onto the implementation chosen. Return an `OptimizerChoice` naming the
    implementation, or ``None`` to let the next plugin (ultimately the core's fallback, plain
    ``torch.optim``) decide. An implementation that is not a torch.optim class (nor a subclass of one
    that keeps its state layout) gives the choice its ``to_canonical``/``from_canonical`` converters
    (contract 1.1), so its state is checkpointed in torch.optim's layout and a run resumes on another
    device. First-result.
    """


@hookspec(firstresult=True)
def devplug_precision(device: Device, precision: str, strategy: str) -> PrecisionPlan | None:
    """Plan mixed precision for ``precision`` (``"auto"``, a registered precision, or the plugin's own) on ``device``.

    Called once per Trainer, before its strategy is built. ``"auto"`` must be resolved to the best setting the
    device supports. ``strategy`` (contract 1.8) is the run's resolved strategy name: ``"none"`` (one process,
    nothing wrapped), ``"ddp"``, ``"fsdp"``, ``"tp"``, ``"fsdp+tp"`` or a registered one's; a plan whose module
    conversion depends on how the weights are spread (fp8 weights gathered by FSDP, say) reads it, any other
    implementation leaves it out of its arguments.
    Return a `PrecisionPlan` (autocast context factory, grad scaler or ``None``, optional module
    conversion and optimizer-step context; a ``"16-mixed"`` plan has a grad scaler or says in
    ``no_scaler_reason`` why it needs none), built for a registered precision with
    ``devplug.toolkit.precision_plan`` and the device's parameters rather than restated, or raise
    ``devplug.PrecisionError`` when the device cannot run the setting. ``None`` defers to the next
    plugin. Must return promptly: the call runs in a worker thread under the time limit
    (``DEVPLUG_PROBE_TIMEOUT``), and a plan that takes longer fails the Trainer with a ``PluginError``
    naming the plugin. First-result.
    """


@hookspec(firstresult=True)
def devplug_compile(device: Device, module: torch.nn.Module, options: dict[str, Any]) -> Any:
    """Compile ``module`` for ``device`` (``torch.compile`` with the device's backend) and return it.

    Called by ``Trainer.setup`` when compilation is enabled (``Trainer(compile=True)``) and no plugin but
    the core fallback answers ``devplug_compile_plan``: the way a plugin written before compile plans
    (contract 1.7) compiles, which keeps working; a plugin that states a plan is compiled by the Trainer as
    the plan says, and this hook is then not called. ``options`` (``Trainer(compile_options=...)``) are passed
    on to the compiler (``mode``, ``fullgraph``, …). Return ``None`` to defer. Must return promptly (compile lazily,
    as ``torch.compile`` does, on the first call): the hook is not bounded by devplug, and one that blocks
    blocks the Trainer; that is the plugin's responsibility. First-result.
    """


@hookspec(firstresult=True)
def devplug_compile_plan(device: Device) -> CompilePlan | None:
    """Return how ``device`` compiles a model: a `CompilePlan` (``torch.compile`` backend and options, or none).

    Called once by ``Trainer.setup`` when compilation is enabled (``Trainer(compile=True)``), before the
    first module is compiled. The Trainer, not the plugin, applies the plan: per block under FSDP (each
    sharded block compiled in place, not the sharded root), the whole module otherwise, and the run summary
    names the backend. ``CompilePlan(backend=None, reason=...)`` leaves the model uncompiled (a device whose
    runtime builds graphs itself). ``None`` defers to the next plugin; the core fallback answers
    ``"inductor"``. Optional (contract 1.7). First-result.
    """


@hookspec(firstresult=True)
def devplug_collective_setup(device: Device, launch: LaunchInfo) -> CollectiveSetup | None:
    """Prepare ``device`` for a multi-process job and name its collective backend.

    Called once, before ``torch.distributed.init_process_group``, when ``launch.world_size > 1``, and when a
    single process shards a model (``strategy="fsdp"``: a process group of one).
    May have side effects the device needs (select the local device, import a collective library).
    Return a `CollectiveSetup` with the backend, DDP defaults and extra init arguments.
    First-result.
    """


@hookspec(firstresult=True)
def devplug_sharding(device: Device, precision: str) -> ShardingPlan | None:
    """Say how ``device`` shards a model with PyTorch's FSDP (``fully_shard``) at precision ``precision``.

    Called once per Trainer built with ``strategy="fsdp"`` (contract 1.4), after the precision plan is
    resolved (``precision`` is its name, never ``"auto"``). Return a `ShardingPlan`: whether the
    device supports sharding (if not, ``reason`` says so in one line naming the device and what to use
    instead), the ``MixedPrecisionPolicy`` dtypes for the precision, ``reshard_after_forward``, CPU offload
    support, and the torch.optim kernel allowed over sharded (DTensor) parameters with the reason. ``None``
    defers (the core's fallback: FSDP where torch has a collective backend for the device type, the foreach
    kernel). First-result.
    """


@hookspec(firstresult=True)
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice | None:
    """Build a data loader over ``source`` that keeps ``device`` fed.

    ``source`` is a ``torch.utils.data.Dataset`` or an `ImageFolderSource`.
    ``options`` carries batch size, shuffling, workers, pinning, and the rank and world size to shard
    by; ``options.automatic`` names the options the author left to devplug, which the plugin may tune
    (``devplug.toolkit.tune_loader``) — the others are the author's and are used as given. Return a
    `LoaderChoice` (its ``reason`` says what was chosen and why), or ``None`` to defer (the core's
    fallback builds a ``torch.utils.data.DataLoader`` with tuned workers). Must return promptly, and so must
    the loader's iterator for each batch: neither is bounded by devplug (bounding them would cost time in
    every step), and one that blocks blocks the training loop; that is the plugin's responsibility.
    First-result.
    """


# ---- The step: called in every training step --------------------------------------------------------------------


@hookspec(firstresult=True)
def devplug_region(device: Device, name: str) -> contextlib.AbstractContextManager[Any] | None:
    """Return a context manager that marks a named region of the step for profilers.

    Called around ``"forward"`` (``Trainer.autocast``), ``"backward"``, ``"optimizer_step"`` and
    ``"data_wait"`` (the loop waiting for each training batch). Inside a profiler window the Trainer also
    opens a ``torch.profiler.record_function`` range of the same name around it.
    Return a context manager (e.g. an NVTX range) or ``None`` for no marking. First-result.
    """


@hookspec
def devplug_mark_step(device: Device, phase: Phase) -> None:
    """Mark a step boundary for devices that execute lazily.

    Called by the Trainer right after ``backward`` (``Phase.BACKWARD``) and right after each optimizer
    step (``Phase.OPTIMIZER_STEP``). A lazy-mode device flushes its accumulated graph here (Gaudi:
    ``htcore.mark_step()``); eager devices do nothing. Must not synchronize with the host. Returns nothing. Not
    first-result: every implementation runs (so a neutral plugin can count steps).
    """


@hookspec
def devplug_step_marks(device: Device) -> StepMarks | None:
    """State whether this plugin marks regions and step boundaries on ``device`` with its options.

    Called once per Trainer (contract 1.6), on every plugin that implements it, before the first step.
    Return a `StepMarks`: ``regions=False`` when this plugin's ``devplug_region`` marks nothing for
    this device and its options (e.g. profiling ranges that are off), ``steps=False`` when its
    ``devplug_mark_step`` does nothing (an eager device). The Trainer then leaves the hook out of every step;
    what is marked by no plugin costs nothing per step. Returning ``None``, or not implementing this hook,
    means "both are marked" for the hooks the plugin implements (they are called every step, as before
    contract 1.6). Must not depend on anything that changes during a run. Not first-result: each plugin
    answers for itself.
    """


@hookspec(firstresult=True)
def devplug_clip_grad_norm(
    device: Device, parameters: list[torch.Tensor], max_norm: float, norm_type: float
) -> torch.Tensor | None:
    """Clip the gradients of ``parameters`` in place to a total ``norm_type``-norm of ``max_norm``.

    Called by ``Trainer.clip_grad_norm`` once per optimizer step, after the grad scaler (if any) has
    unscaled the gradients; ``parameters`` are those of one optimizer that have a gradient. Returns the
    total norm before clipping as a tensor on the device (never read back to the host here), or
    ``None`` to defer (the core's fallback uses ``torch.nn.utils.clip_grad_norm_``). A device with a
    fused clip kernel implements it here (Gaudi: ``hpex.normalization.FusedClipNorm``). First-result.
    """


@hookspec(firstresult=True)
def devplug_synchronize(device: Device) -> bool | None:
    """Wait until all work queued on ``device`` has finished; return True when handled.

    Called at log points and before timing measurements only, never in the steady-state step.
    First-result.
    """


# ---- Observing a run: figures for logs, summaries and profiles --------------------------------------------------


@hookspec(firstresult=True)
def devplug_memory_stats(device: Device) -> MemoryStats | None:
    """Report memory use of ``device``.

    Called for summaries and reports, never in the step. Returns `MemoryStats`, or ``None`` when
    the device reports nothing. First-result.
    """


@hookspec(firstresult=True)
def devplug_peak_flops(device: Device, precision: str) -> PeakFlops | float | None:
    """Report the peak FLOP/s of one ``device`` for the precision plan named ``precision``.

    Called once per Trainer, after the FLOPs of a training step were counted, to compute MFU (achieved
    FLOP/s over this peak). Return the dense (no sparsity) peak of the matrix units for the precision the
    plan computes in (``"bf16-mixed"``: BF16; ``"32-true"``: FP32, or TF32 where matmuls use it) as a
    `PeakFlops` naming its source (contract 1.4): ``"datasheet"`` (a published figure), ``"computed"``
    (cores × clock × FLOP per cycle) or ``"measured (cached)"`` (measured once per machine,
    ``devplug.toolkit.cached_matmul_flops``), with a ``detail`` line saying how it was obtained, which the
    run's summary prints next to the value and format (``summary()["peak"]``: ``"166.2 GFLOP/s fp32,
    computed: 2 cores × 2.6 GHz × 32 FLOP/cycle (avx2+fma, fp32)"``); a plain float is still accepted
    (source ``"plugin"``);
    ``None`` when unknown (MFU is then not reported). A figure that is not positive and finite (zero,
    negative, infinite, NaN) is refused with a ``PluginError`` naming the plugin, which the Trainer logs as
    one warning: MFU is then not reported, and training goes on. Must be cheap: never measure on every
    run (the figure would follow the machine's load, and MFU with it). Not called when the author gives
    ``peak_flops=``. First-result.
    """


@hookspec(firstresult=True)
def devplug_profiler_activities(device: Device) -> list[torch.profiler.ProfilerActivity] | None:
    """Name the ``torch.profiler.ProfilerActivity`` values to record on ``device``.

    Called when a profiler window opens (``Trainer(profile="steps 10-15")``), never in a step that is not
    profiled. Return a list that includes ``ProfilerActivity.CPU`` (the host side: data wait, regions,
    launches) and the device's own activity where this torch has one (``CUDA``, ``HPU``, ``XPU``, ...), or
    ``None`` to defer (the core's fallback: CPU plus the activity named like the device type, when torch
    has it). First-result.
    """


@hookspec
def devplug_log(device: Device, point: LogPoint) -> None:
    """Receive the values of a log point, images, facts about the run, or its end (rank 0 only).

    Called on the main process at every log point with ``point.values`` (host floats, averaged since the
    previous point and reduced across ranks: reading them costs no device synchronisation), at every
    ``Trainer.log_images`` with ``point.images`` (and ``point.files``, the PNG it wrote, when given a path),
    and once with ``point.final=True`` when the Trainer closes (``point.summary``: the run's summary as
    plain data). Samples/s, data wait, MFU and learning rates come only with a point that follows at least
    one training step, so a point of evaluation values logged at the same step carries those values alone.
    Evaluation values (logged after an epoch's training batches, or named ``val_*``/``eval_*``) come as
    logged, on a point of their own at their step, not averaged. After a resume a point with
    ``point.resumed=True`` (no values) names the resumed step: drop or mark the points past it that an
    interrupted run wrote (they are computed again).

    Since contract 1.4 the run's facts come on points of their own, with empty ``values``:
    ``point.hparams`` (from ``Trainer(hparams=...)`` when the Trainer is built, and from each
    ``Trainer.log_hparams`` call) and ``point.tags`` (device, device plugin, precision and devplug version
    when the Trainer is built; ``optimizer/<name>`` when an optimizer is built). An implementation written
    for an older contract skips points without values and keeps working.

    The place for a device-neutral experiment tracker (a dashboard, a tracker devplug has no logger for);
    the Trainer's own loggers (``loggers=``) receive the same points. Returns nothing. Not first-result:
    every implementation runs.
    """


# ---- Diagnosis: devplug doctor ----------------------------------------------------------------------------------


@hookspec
def devplug_doctor() -> DoctorReport | None:
    """Contribute to ``devplug doctor``, the report a bug report needs.

    Called on every plugin (device or neutral) when the command runs, with no device resolved. Return a
    `DoctorReport`: the plugin's stack (distribution names, whose versions and declared
    requirements doctor checks), other versions, the environment variables that change its behaviour,
    incompatible pairs and warnings found on this machine; or ``None``. Must be quick (the whole command
    runs in about a second) and must not initialise a device: read metadata and the environment. The
    hooks run at once, each in a worker thread under the time limit (``DEVPLUG_PROBE_TIMEOUT``); one that
    does not answer in time is left out and named in the report. Not first-result: every plugin answers.
    """


#: Every hook of the contract, in the order above: a run's lifecycle (the hook reference and the conformance
#: kit follow it).
HOOKS: tuple[Callable[..., Any], ...] = tuple(
    fn for name, fn in list(globals().items()) if name.startswith("devplug_") and inspect.isfunction(fn)
)

#: Hooks routed to the resolved device's plugin plus device-neutral plugins: those that take ``device``.
OPERATIONAL_HOOKS: tuple[str, ...] = tuple(
    fn.__name__ for fn in HOOKS if "device" in inspect.signature(fn).parameters
)

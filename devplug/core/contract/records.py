"""Typed records that hooks return and receive.

Every hook in `devplug.core.contract.hookspecs` speaks in these small attrs classes rather than loose
tuples or dicts, so a plugin author gets a named field (and a validation error naming it) instead
of a positional surprise.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import torch

from devplug.core.precision.base import FLOAT16_PRECISION as FLOAT16_PRECISION
from devplug.core.precision.base import PrecisionPlan as PrecisionPlan
from devplug.core.precision.registry import choices

#: Version of the hook contract (not of the devplug package; see docs/plugins.md "Contract versions").
#: A plugin declares what it needs with ``DEVPLUG_CONTRACT``: ``"1.1"`` (that minor or newer, same major)
#: or a range such as ``">=1.0,<3"``; a plugin this devplug cannot serve is reported and skipped.
CONTRACT_VERSION = "1.9"

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def _check_device_name(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(
            f"invalid device name {value!r}: use lower-case letters, digits and '_', starting with a letter "
            "(e.g. 'npu' or 'my_accel')"
        )
    if value == "auto":
        raise ValueError("invalid device name 'auto': it is reserved for choosing the available device with the "
                         "highest priority; name the device after its hardware (e.g. 'npu' or 'my_accel')")


@attrs.frozen
class Availability:
    """Answer of a device probe: usable or not, and if not, why and how to fix it."""

    available: bool
    reason: str = ""
    fix: str = ""

    @classmethod
    def yes(cls) -> Availability:
        """An available device."""
        return cls(True)

    @classmethod
    def no(cls, reason: str, fix: str = "") -> Availability:
        """An unavailable device with the reason and, ideally, what to do about it."""
        return cls(False, reason, fix)


@attrs.frozen
class DeviceSpec:
    """One device type a plugin serves, as returned by ``devplug_register_devices``.

    ``name`` is what users type (``--device NAME``); ``torch_type`` is the torch device type tensors
    live on (defaults to ``name``; a plugin may serve a device named ``"mydev"`` on ``"cpu"``).
    ``probe`` is called lazily, only when availability matters, and must not raise (if it does, the
    device is reported unavailable with the exception as the reason). It runs in a worker thread (with
    other probes at the same time in ``devplug devices``) under a time limit, ``DEVPLUG_PROBE_TIMEOUT``
    seconds; a probe that does not answer in time makes the device unavailable ("probe timed out after
    N s"). ``count`` tells how many devices of this type the process can see (bounded the same way).
    ``priority`` orders ``"auto"``: the highest available wins, and devices ranked below it are not probed.

    ``generic`` (contract 1.1) marks a declaration that serves the name only where no other plugin
    does: when a plugin declares the same name without ``generic``, that plugin keeps the name and this
    declaration is dropped silently, not reported as a conflict. The built-in ``generic`` plugin
    declares every accelerator type torch knows this way, so a dedicated plugin always wins its type
    and, once that plugin is blocked, torch's generic path serves the type. Two ``generic``
    declarations of one name are an ordinary conflict.

    ``prefers_channels_last`` (contract 1.5): why this device trains convolutions faster in the channels_last
    memory layout, in a few words; non-empty makes that layout the one ``Trainer(channels_last="auto")``
    picks (an author's ``True`` or ``False`` always wins). Say it only where it pays from the first step.
    """

    name: str = attrs.field(validator=_check_device_name)
    description: str
    priority: int
    probe: Callable[[], Availability]
    count: Callable[[], int] = lambda: 1
    torch_type: str = attrs.field(default=None)
    generic: bool = attrs.field(default=False, kw_only=True, validator=attrs.validators.instance_of(bool))
    prefers_channels_last: str = attrs.field(default="", kw_only=True, validator=attrs.validators.instance_of(str))

    @torch_type.validator
    def _check_torch_type(self, _attr: attrs.Attribute[Any], value: str | None) -> None:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"DeviceSpec.torch_type must be a str, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.torch_type is None:
            object.__setattr__(self, "torch_type", self.name)


@attrs.frozen
class Device:
    """The device a Trainer runs on, passed as ``device`` to every operational hook.

    Typed fields are Trainer options every device plugin must honour (the built-ins and the core
    fallback do, and the conformance kit checks it):

    - ``channels_last``: modules and 4-D tensors moved by ``devplug_to_device`` use the
      ``torch.channels_last`` memory format.

    ``layout_reason`` says why, where the Trainer left the layout to the plugin (``channels_last="auto"``);
    empty when the author chose.

    ``options`` carries the free-form ``Trainer(device_options={...})`` for this plugin (each plugin
    documents the keys it reads and ignores the rest).
    """

    spec: DeviceSpec
    index: int | None
    plugin_name: str
    options: Mapping[str, Any] = attrs.field(factory=dict)
    channels_last: bool = False
    layout_reason: str = ""
    # built once: the step and the loader ask for it on every batch
    _torch_device: torch.device = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        torch_type = self.spec.torch_type
        place = torch.device(torch_type, self.index) if self.index is not None else torch.device(torch_type)
        object.__setattr__(self, "_torch_device", place)

    @property
    def name(self) -> str:
        """The devplug device name, e.g. ``"cpu"``."""
        return self.spec.name

    @property
    def torch_device(self) -> torch.device:
        """The ``torch.device`` tensors are placed on."""
        return self._torch_device

    @property
    def memory_format(self) -> torch.memory_format | None:
        """``torch.channels_last`` when the Trainer asked for it, else ``None`` (keep the layout)."""
        return torch.channels_last if self.channels_last else None

    def __str__(self) -> str:
        return self.name if self.index is None else f"{self.name}:{self.index}"


#: Converts an optimizer's state between its own ``state_dict()`` layout and torch.optim's (see OptimizerChoice).
StateConverter = Callable[[torch.optim.Optimizer, Mapping[str, Any]], dict[str, Any]]


def _check_converters(inst: OptimizerChoice, _attr: attrs.Attribute[Any], _value: Any) -> None:
    if (inst.to_canonical is None) != (inst.from_canonical is None):
        raise ValueError("OptimizerChoice needs both to_canonical and from_canonical, or neither")


@attrs.frozen
class OptimizerChoice:
    """An optimizer a plugin built, and a human-readable name of the implementation chosen.

    ``implementation`` reads like a constructor, e.g. ``"torch.optim.Adam(fused=True)"`` or
    ``"apex.optimizers.FusedAdam"``; ``reason`` says why a faster one was not used, if so.

    Checkpoints hold optimizer state in a *canonical* form (contract 1.1): torch.optim's
    ``state_dict()`` layout for the algorithm (per-parameter ``step`` tensors, ``exp_avg``,
    ``exp_avg_sq``, ``momentum_buffer`` ..., and torch's hyperparameters in each parameter group), so a
    run saved with one device's optimizer resumes with another's. A torch.optim optimizer (for-loop,
    ``foreach`` or ``fused``) is canonical already, and so is one whose class subclasses the torch class
    of its algorithm and keeps its per-parameter state entries and shapes (compared on save). Any other
    implementation of a standard algorithm supplies both converters, each called as
    ``converter(optimizer, state)`` with the optimizer this choice holds:

    - ``to_canonical``: from ``optimizer.state_dict()`` to torch.optim's layout (tensors stay where they
      are; the core moves them to the CPU). Parameter-group keys torch has and the state lacks may be left
      out: the core fills them with the torch class's defaults.
    - ``from_canonical``: from torch.optim's layout (CPU tensors) to a dict ``optimizer.load_state_dict``
      accepts. It must not change the optimizer. Raise ``ValueError`` with a one-line reason when the
      state has no equivalent in this implementation (e.g. parameters of one group at different step
      counts, for an implementation that keeps one count per group).

    An optimizer with neither converter that is not canonical already is saved in its own layout (with
    the reason), and only the same implementation can load it. ``devplug.toolkit`` has helpers for
    the usual conversions (``steps_to_params``, ``steps_to_groups``, ``native_groups``). ``algorithm`` is
    set by the core: the name the author asked for (``"adamw"``), or an author's class's qualified name;
    ``built_by`` too: the plugin and distribution whose ``devplug_optimizer`` answered (errors about the
    optimizer's state name it).
    """

    optimizer: torch.optim.Optimizer
    implementation: str
    reason: str = ""
    to_canonical: StateConverter | None = attrs.field(
        default=None, kw_only=True, validator=attrs.validators.optional(attrs.validators.is_callable()))
    from_canonical: StateConverter | None = attrs.field(
        default=None, kw_only=True,
        validator=[attrs.validators.optional(attrs.validators.is_callable()), _check_converters])
    algorithm: str = attrs.field(default="", kw_only=True)
    built_by: str = attrs.field(default="", kw_only=True)


class Phase(str, enum.Enum):
    """Points in a training step at which ``devplug_mark_step`` is called."""

    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"


@attrs.frozen
class StepMarks:
    """What one plugin marks in the training step on one device with its options (contract 1.6).

    Returned by ``devplug_step_marks``, asked once per Trainer. ``regions``: whether the plugin's
    ``devplug_region`` marks anything (False: it only returns ``None`` or a context that does nothing);
    ``steps``: whether its ``devplug_mark_step`` does anything. What no plugin marks is left out of every step,
    so a plugin that marks nothing at run time costs nothing per step.
    """

    regions: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    steps: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))


#: Precision names understood by devplug, in the conventions PyTorch users already know.
#: ``"auto"`` and the built-in precisions, from `devplug.core.precision.registry` (the one place the names live).
PRECISIONS = choices()


def _as_dict(value: Any) -> dict[str, Any]:
    return dict(value)


@attrs.frozen
class CompilePlan:
    """How a device compiles a model (contract 1.7): the ``torch.compile`` backend and options, or none.

    - ``backend``: the ``torch.compile`` backend name (``"inductor"``, ``"hpu_backend"``), or ``None`` when the
      device should not be compiled (say why in ``reason``).
    - ``options``: further keyword arguments for ``torch.compile`` (``mode``, ``dynamic``, ``options``, ...);
      the author's ``compile_options`` are laid over them.
    - ``reason``: why this backend (or why none), in a few words, for the run summary.

    The Trainer applies the plan per block (``nn.Module.compile`` on each block in place), so parameter
    names and checkpoints are those of the uncompiled model.
    """

    backend: str | None = attrs.field(validator=attrs.validators.optional(attrs.validators.instance_of(str)))
    options: dict[str, Any] = attrs.field(factory=dict, converter=_as_dict)
    reason: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    def __attrs_post_init__(self) -> None:
        if self.backend is not None and not self.backend.strip():
            raise ValueError("a CompilePlan's backend is a torch.compile backend name, or None for no compile")
        if self.backend is None and not self.reason.strip():
            raise ValueError("a CompilePlan without a backend must say in reason why the device is not compiled")


#: The optimizer kernels a ShardingPlan may allow over sharded (DTensor) parameters, as torch.optim options.
SHARDED_OPTIMIZER_KERNELS = ("fused", "foreach", "for-loop")


def _dtype_or_none(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, torch.dtype):
        raise ValueError(f"ShardingPlan.{attribute.name} must be a torch.dtype or None, got {value!r}")


@attrs.frozen(kw_only=True)
class ShardingPlan:
    """How a device shards a model with PyTorch's FSDP (``fully_shard``), as ``devplug_sharding`` answers.

    - ``supported``: False when the device cannot shard; ``reason`` then says so in one line naming the
      device and what to use instead (``"mydev: no reduce-scatter in its collective library; use
      strategy='ddp'"``).
    - ``param_dtype`` / ``reduce_dtype``: FSDP's ``MixedPrecisionPolicy`` for the run's precision: the dtype
      parameters are gathered in for forward and backward, and the dtype gradients are reduce-scattered
      in (``None``: the parameters' own, fp32).
    - ``reshard_after_forward``: free the gathered parameters after forward (less memory, one more
      all-gather in backward).
    - ``cpu_offload``: the device supports FSDP's ``CPUOffloadPolicy`` (sharded parameters, gradients and
      optimizer state kept in host memory).
    - ``optimizer_kernel``: the torch.optim kernel allowed over sharded parameters: ``"fused"``,
      ``"foreach"`` or ``"for-loop"``; ``optimizer_reason`` says why (the Trainer records it in the
      `OptimizerChoice`).
    - ``reason``: what the plugin decided and why, for summaries (required when not supported).
    """

    supported: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    param_dtype: torch.dtype | None = attrs.field(default=None, validator=_dtype_or_none)
    reduce_dtype: torch.dtype | None = attrs.field(default=None, validator=_dtype_or_none)
    reshard_after_forward: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    cpu_offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    optimizer_kernel: str = attrs.field(default="foreach", validator=attrs.validators.in_(SHARDED_OPTIMIZER_KERNELS))
    optimizer_reason: str = ""
    reason: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.supported and not self.reason.strip():
            raise ValueError("a ShardingPlan that is not supported needs a reason naming the device and what to "
                             "use instead")

    @classmethod
    def unsupported(cls, reason: str) -> ShardingPlan:
        """A device that cannot shard: ``reason`` names it and what to use instead, in one line."""
        return cls(supported=False, reason=reason)


@attrs.frozen
class LaunchInfo:
    """Where this process sits in a distributed job, as read from the launcher's environment."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    launcher: str = "none"

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1


@attrs.frozen
class CollectiveSetup:
    """How a device joins a process group and wraps modules for data parallelism.

    ``backend`` is a torch.distributed backend name (``"gloo"``, ``"nccl"``, ``"hccl"``, …);
    ``ddp_kwargs`` are defaults for ``DistributedDataParallel`` that user options override;
    ``init_kwargs`` are extra keyword arguments for ``init_process_group``.
    """

    backend: str
    ddp_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    init_kwargs: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ImageFolderSource:
    """An image folder to load, described rather than opened, so a device plugin can pick a decoder.

    Images are resized (short side) and center-cropped to ``image_size`` and normalized with
    ``mean``/``std`` on the 0..1 scale (the defaults map to [-1, 1]). Batches are ``(images, labels)``.
    With ``skip_unreadable`` (the default) the torch loader replaces an image that cannot be decoded
    by the next readable one and logs a warning naming the file, so one corrupt file does not end a
    long run; ``False`` raises instead. Loaders that decode elsewhere (DALI) may not be able to skip.
    """

    root: str
    image_size: int = attrs.field(validator=attrs.validators.gt(0))
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    skip_unreadable: bool = True


#: The loader options an author may leave to devplug (``LoaderOptions.automatic`` names those left).
AUTOMATIC_LOADER_OPTIONS = frozenset({"num_workers", "pin_memory", "prefetch_factor"})


def _frozen_names(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _check_automatic(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    unknown = set(value) - AUTOMATIC_LOADER_OPTIONS
    if unknown:
        raise ValueError(f"LoaderOptions.automatic names {sorted(unknown)}, which devplug does not choose; "
                         f"it may name {sorted(AUTOMATIC_LOADER_OPTIONS)}")


@attrs.frozen
class LoaderOptions:
    """What the author asked of a data loader; plugins honour what applies to them.

    Every field holds a usable value, so a plugin that passes the options on as they are builds a
    working loader: ``num_workers`` and ``prefetch_factor`` left out by the author hold the Trainer's
    defaults (CPU cores − 1 at most 8, and 2); ``pin_memory`` left out is ``None`` (the device plugin
    decides). ``automatic`` (contract 1.3) names the options the author left to devplug, so a plugin
    can tune those (`devplug.toolkit.tune_loader`) and must keep the others exactly as given: the
    author's explicit settings always win. ``evaluation`` (contract 1.4) marks an evaluation loader: shard
    it without padding, every sample on exactly one rank, uneven splits allowed
    (`devplug.toolkit.evaluation_shard`; ``make_sampler`` and ``torch_dataloader`` do it).
    """

    batch_size: int = attrs.field(validator=attrs.validators.gt(0))
    shuffle: bool = False
    drop_last: bool = False
    num_workers: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    pin_memory: bool | None = None  # None: the device plugin decides (True where pinning helps)
    persistent_workers: bool = True
    prefetch_factor: int | None = 2
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    collate_fn: Callable[..., Any] | None = None
    sampler: Any = None
    automatic: frozenset[str] = attrs.field(default=frozenset(), converter=_frozen_names, validator=_check_automatic)
    evaluation: bool = False  # an evaluation loader: each sample on exactly one rank, no padding


@attrs.frozen
class LoaderChoice:
    """A data loader a plugin built.

    ``loader`` is iterable over batches; ``implementation`` names it (``"torch DataLoader"``,
    ``"DALI"``, ``"HabanaDataLoader"``); ``on_device`` is True when batches already live on the
    device (so the Trainer does not move them again); ``sampler`` is the sampler whose ``set_epoch``
    the Trainer calls each epoch, if any; ``reason`` says why this loader and its settings were
    chosen: why a faster loader was not used, what automatic tuning measured and decided (the Trainer
    logs it).
    """

    loader: Iterable[Any]
    implementation: str
    on_device: bool = False
    sampler: Any = None
    reason: str = ""


@attrs.frozen
class MemoryStats:
    """Device memory use in bytes; ``None`` where the device does not report a figure."""

    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    total: int | None = None


#: Where a peak FLOP/s figure comes from (``PeakFlops.source``): a vendor's published table, a formula
#: over the processor's features and clock, a measurement made once per machine and cached, or the author.
PEAK_SOURCES = ("datasheet", "computed", "measured (cached)", "measured", "author", "plugin")


@attrs.frozen
class PeakFlops:
    """A device's peak FLOP/s for one precision, and where the figure comes from (contract 1.4).

    ``value``: dense peak FLOP/s; ``source``: one of `PEAK_SOURCES` (``"datasheet"``: a vendor's
    published figure; ``"computed"``: cores × clock × FLOP per cycle from the processor's features;
    ``"measured (cached)"``: a matmul measured once per machine and kept in devplug's cache); ``detail``:
    one line on how it was obtained (``"2 cores × 2.6 GHz × 32 FLOP/cycle (avx2+fma)"``), optional.
    ``devplug_peak_flops`` may return this record or a plain float (source then ``"plugin"``).
    """

    value: float
    source: str = attrs.field(validator=attrs.validators.in_(PEAK_SOURCES))
    detail: str = ""


@attrs.frozen
class LogPoint:
    """What a logger receives (rank 0 only): the values of one log point, images, facts about the run, or its end.

    ``values`` are host floats, already averaged since the previous log point and reduced across ranks
    (empty when the point carries only ``images``); ``images`` maps a tag to an image grid (a C×H×W CPU
    float tensor in [0, 1]); ``log_dir`` is the Trainer's ``log_dir`` (``None``: write nowhere on disk);
    ``final`` is True once, when the Trainer closes: flush and close files there.

    Since contract 1.4 a point may instead (with empty ``values``) carry facts about the run, each on a
    point of its own when it becomes known:

    - ``hparams``: hyperparameters (``Trainer(hparams=...)``, ``Trainer.log_hparams``), flat names to
      ``bool``/``int``/``float``/``str`` (nested mappings flattened with ``"."``); only those given in one
      call, so a logger that needs them all merges them;
    - ``tags``: strings describing the run (``device``, ``device_plugin``, ``precision``,
      ``devplug_version``, ``optimizer/<name>``);
    - ``files``: a tag to a file the Trainer wrote (the PNG of ``log_images(..., path=...)``, on the
      same point as its image);
    - ``summary``: on the final point, the run's summary (``Trainer.summary().to_dict()``, JSON-serialisable);
    - ``resumed``: True on a point of its own when the run resumed from the checkpoint of ``step``: points
      past ``step`` written before (by the run that was interrupted) are computed again, so a logger drops
      or marks them (TensorBoard purges them, CSV and JSON Lines are rewritten without them).

    A logger written before 1.4 ignores these fields and keeps working: it already skips points with
    empty ``values``.
    """

    step: int
    values: Mapping[str, float] = attrs.field(factory=dict)
    images: Mapping[str, torch.Tensor] = attrs.field(factory=dict)
    log_dir: str | None = None
    final: bool = False
    hparams: Mapping[str, bool | int | float | str] = attrs.field(factory=dict, kw_only=True)
    tags: Mapping[str, str] = attrs.field(factory=dict, kw_only=True)
    files: Mapping[str, str] = attrs.field(factory=dict, kw_only=True)
    summary: Mapping[str, Any] = attrs.field(factory=dict, kw_only=True)
    resumed: bool = attrs.field(default=False, kw_only=True)


def _string_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _strings(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not all(isinstance(item, str) and item.strip() for item in value):
        raise ValueError(f"DoctorReport.{attribute.name} must hold non-empty strings, got {value!r}")


@attrs.frozen
class DoctorReport:
    """What a plugin contributes to ``devplug doctor``: its stack, the variables it reads, what goes wrong.

    ``packages``: distribution names of the plugin's software stack; doctor prints their versions ("not
    installed" when absent) and reports, as an incompatible pair, a requirement one of them declares that
    the installed packages do not meet. ``versions``: other facts worth a bug report (``"torch CUDA build":
    "12.4"``). ``env``: environment variables that change the plugin's behaviour, a trailing ``*`` for a
    prefix (``"NCCL_*"``). ``incompatible`` and ``warnings``: one line each, found on this machine.
    """

    packages: tuple[str, ...] = attrs.field(default=(), converter=_string_tuple, validator=_strings)
    versions: Mapping[str, str] = attrs.field(factory=dict)
    env: tuple[str, ...] = attrs.field(default=(), converter=_string_tuple, validator=_strings)
    incompatible: tuple[str, ...] = attrs.field(default=(), converter=_string_tuple, validator=_strings)
    warnings: tuple[str, ...] = attrs.field(default=(), converter=_string_tuple, validator=_strings)

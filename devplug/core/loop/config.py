"""The Trainer's configuration: one attrs class, every field validated, errors naming the field."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from devplug.core.errors import ConfigError
from devplug.core.loop.signals import DEFAULT_STOP_SIGNALS, signal_numbers
from devplug.core.observe.loggers import check_logger
from devplug.core.observe.profiling import parse_window
from devplug.core.precision import registry as precisions
from devplug.core.validators import non_negative_int, positive_int

if TYPE_CHECKING:
    from devplug.core.checkpoint.policy import CheckpointPolicy

NONFINITE_POLICIES = ("raise", "warn", "ignore")


def _optional(validator: Any) -> Any:
    return attrs.validators.optional(validator)


def _precision(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{attribute.name} must be one of {', '.join(precisions.choices())} (or a plugin's own), "
                         f"got {value!r}")


@attrs.frozen
class _Registered:
    """Validates a name against what is registered when the value is checked (``options`` for the command line)."""

    names: Callable[[], tuple[str, ...]]

    @property
    def options(self) -> tuple[str, ...]:
        return self.names()

    def __call__(self, _inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in self.options:
            raise ValueError(f"'{attribute.name}' must be in {self.options!r} (got {value!r})")


def _strategies() -> tuple[str, ...]:
    from devplug.core.distributed.strategy import strategy_names

    return strategy_names()


def _formats() -> tuple[str, ...]:
    from devplug.core.checkpoint.format import format_names

    return format_names()


def _checkpoint_policy(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    from devplug.core.checkpoint.policy import CheckpointPolicy  # the checkpoint package loads with a policy

    attrs.validators.instance_of(CheckpointPolicy)(inst, attribute, value)


def _bool(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name} must be True or False, got {value!r}")


def _positive(attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _mapping(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"'{attribute.name}' must be a mapping (a dict), got {type(value).__name__}")


def _layout(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"{attribute.name} must be True, False or 'auto' (the device plugin's choice), got {value!r}")


def _optional_bool(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _bool(inst, attribute, value)


@attrs.frozen(kw_only=True)
class TrainerConfig:
    """Everything a `Trainer` can be told.

    - ``device``: ``"auto"``, a device name, or ``NAME:INDEX``; ``None`` reads ``$DEVPLUG_DEVICE``, then auto.
    - ``precision``: ``"auto"``, ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``, or a name a plugin knows.
    - ``log_dir``: directory the loggers write into (nothing is written when ``None``).
    - ``loggers``: where log points go (rank 0): names (``"tensorboard"``, ``"csv"``, ``"jsonl"``, ``"mlflow"``,
      ``"wandb"``, written under ``log_dir``) and logger objects (a ``devplug_log(point)`` method); default TensorBoard
      when ``log_dir`` is set. Device-neutral plugins implementing ``devplug_log`` receive the points too.
    - ``hparams``: the run's hyperparameters, handed to every logger when the Trainer is built (TensorBoard's
      hparams dashboard, MLflow params, W&B config, ``metrics.hparams.json``, a JSON Lines record).
    - ``profile``: a profiler window, ``"steps 10-15"``: ``torch.profiler`` over those steps (data wait
      included), a trace under ``log_dir/profiler`` for TensorBoard or Perfetto.
    - ``price_per_hour``: what the whole job costs per hour (any currency): samples per dollar in logs and summary.
    - ``count_flops``: count one step's FLOPs (``FlopCounterMode``, the second step the process runs) for MFU;
      False skips it.
    - ``peak_flops``: the device's peak FLOP/s for MFU, given by the author (source ``"author"``); the device
      plugin is then not asked.
    - ``measure_gemm``: also measure a plain GEMM in the run's number format on the device (once per
      machine, then cached), so the summary gives the achieved share of it (``gemm_fraction``) next to MFU.
    - ``log_every``: steps between log points, the only places values are read back from the device.
    - ``accumulate_grad_batches``: micro-batches per optimizer step (gradient accumulation; one step each).
    - ``progress``: show a tqdm progress bar (rank 0 only), refreshed at log points.
    - ``seed``: seeds Python, torch and every rank identically, so replicas start equal.
    - ``compile`` / ``compile_options``: ``torch.compile`` through the device plugin.
    - ``channels_last``: the channels_last memory layout for modules and 4-D batches (``Device.channels_last``,
      honoured by every device plugin); ``"auto"``: the layout the device plugin prefers (its device's
      ``prefers_channels_last``), for a model that works in either (it never calls ``.view`` on a 4-D
      activation). Default ``False``.
    - ``nonfinite``: what a NaN/inf logged value does: ``"raise"``, ``"warn"`` or ``"ignore"``.
    - ``bucket_cap_mb``, ``broadcast_buffers``, ``gradient_as_bucket_view``, ``find_unused_parameters``,
      ``static_graph``: DistributedDataParallel options over the plugin's defaults (``None`` keeps them).
    - ``device_options``: free-form options for the device plugin (see each plugin's docs).
    - ``stop_signals``: signals that end ``epochs()`` at the next step boundary (default SIGINT, SIGTERM,
      SIGUSR1; ``()`` leaves every signal alone).
    - ``strategy``: ``"auto"`` (DDP when launched with more than one process), ``"ddp"``, or ``"fsdp"``: shard
      parameters, gradients and optimizer state across ranks with PyTorch's ``fully_shard`` as the device
      plugin's sharding plan says (one process too: a process group of one); ``"tp"``: tensor parallel over
      every process; ``"fsdp+tp"``: tensor parallel in groups of ``tp`` processes, FSDP across the groups; or
      a registered strategy's name.
    - ``tp``: how many processes split each layer under ``"tp"`` or ``"fsdp+tp"`` (``None``: all of them).
    - ``checkpoint_format``: how checkpoints are written: ``"plain"`` (one file), ``"sharded"`` (a folder every
      rank writes) or a registered format's name; ``None`` (default): the strategy's (sharded under FSDP).
    - ``checkpoints``: a `CheckpointPolicy`: periodic, best-k and end-of-run checkpoints
      into one folder, and auto-resume from its newest intact one.
    """

    device: str | None = attrs.field(default=None, validator=_optional(attrs.validators.instance_of(str)))
    precision: str = attrs.field(default="auto", validator=_precision)
    log_dir: str | None = attrs.field(default=None, converter=attrs.converters.optional(str))
    loggers: tuple[Any, ...] | None = attrs.field(
        default=None, converter=lambda v: None if v is None else (v,) if isinstance(v, str) or hasattr(v, "devplug_log")
        else tuple(v),
        validator=_optional(attrs.validators.deep_iterable(lambda _i, _a, v: check_logger(v))))
    hparams: Mapping[str, Any] = attrs.field(factory=dict, validator=_mapping)
    profile: str | None = attrs.field(default=None, validator=_optional(lambda _i, _a, v: parse_window(v)))
    price_per_hour: float | None = attrs.field(default=None, validator=_optional(lambda _i, a, v: _positive(a, v)))
    count_flops: bool = attrs.field(default=True, validator=_bool)
    peak_flops: float | None = attrs.field(default=None, validator=_optional(lambda _i, a, v: _positive(a, v)))
    measure_gemm: bool = attrs.field(default=False, validator=_bool)
    log_every: int = attrs.field(default=50, validator=positive_int)
    accumulate_grad_batches: int = attrs.field(default=1, validator=positive_int)
    progress: bool = attrs.field(default=True, validator=_bool)
    seed: int | None = attrs.field(default=None, validator=_optional(non_negative_int))
    compile: bool = attrs.field(default=False, validator=_bool)
    compile_options: Mapping[str, Any] = attrs.field(factory=dict)
    channels_last: bool | str = attrs.field(default=False, validator=_layout)
    nonfinite: str = attrs.field(default="raise", validator=attrs.validators.in_(NONFINITE_POLICIES))
    bucket_cap_mb: int | None = attrs.field(default=None, validator=_optional(positive_int))
    broadcast_buffers: bool | None = attrs.field(default=None, validator=_optional_bool)
    gradient_as_bucket_view: bool | None = attrs.field(default=None, validator=_optional_bool)
    find_unused_parameters: bool | None = attrs.field(default=None, validator=_optional_bool)
    static_graph: bool | None = attrs.field(default=None, validator=_optional_bool)
    device_options: Mapping[str, Any] = attrs.field(factory=dict)
    stop_signals: tuple[str, ...] = attrs.field(default=DEFAULT_STOP_SIGNALS, converter=tuple,
                                                validator=lambda _i, _a, v: signal_numbers(v))
    strategy: str = attrs.field(default="auto", validator=_Registered(_strategies))
    tp: int | None = attrs.field(default=None, validator=_optional(positive_int))
    checkpoint_format: str | None = attrs.field(default=None, validator=_optional(_Registered(_formats)))
    checkpoints: CheckpointPolicy | None = attrs.field(
        default=None, validator=_optional(_checkpoint_policy))

    def __attrs_post_init__(self) -> None:
        named = [item for item in self.loggers or () if isinstance(item, str)]
        if named and self.log_dir is None:
            raise ValueError(f"loggers {', '.join(named)} write into log_dir: set log_dir too")
        if self.profile is not None and self.log_dir is None:
            raise ValueError("profile writes its trace under log_dir/profiler: set log_dir too")

    @property
    def logger_items(self) -> tuple[Any, ...]:
        """The loggers to build: ``loggers``, or TensorBoard when it is not set (CSV where tensorboard is missing)."""
        return self.loggers if self.loggers is not None else ("tensorboard",)

    @classmethod
    def build(cls, **values: Any) -> TrainerConfig:
        """Build a config, turning any invalid or unknown field into a `ConfigError`."""
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown Trainer option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(known))}"
            )
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid Trainer configuration: {exc}") from exc

    def ddp_overrides(self) -> dict[str, Any]:
        """DDP options the author set explicitly (the plugin's defaults fill in the rest)."""
        overrides: dict[str, Any] = {}
        names = ("bucket_cap_mb", "broadcast_buffers", "gradient_as_bucket_view", "find_unused_parameters",
                 "static_graph")
        for name in names:
            value = getattr(self, name)
            if value is not None:
                overrides[name] = value
        return overrides

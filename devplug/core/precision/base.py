"""What a precision is (`Precision`), what a device tells it (`PrecisionParams`), what it gives (`PrecisionPlan`).

The bottom of the precision layer: it imports nothing else of devplug's but the errors, so the hook
contract can re-export `PrecisionPlan` and derive its names from the registry.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import Any

import attrs
import torch

#: The precision setting that computes in float16: its plans need a grad scaler (see PrecisionPlan).
FLOAT16_PRECISION = "16-mixed"


def _nullcontext() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


@attrs.frozen
class PrecisionPlan:
    """How a device runs one precision setting.

    - ``name``: the resolved setting (never ``"auto"``), e.g. ``"bf16-mixed"``.
    - ``autocast``: a factory for the context entered around forward and loss.
    - ``scaler``: a grad scaler (``torch.amp.GradScaler``-like) or ``None``.
    - ``convert_module``: applied once to each module in ``Trainer.setup`` (e.g. Habana HMP), or ``None``.
    - ``optimizer_step_context``: a factory for a context entered around every optimizer step
      (e.g. ``hmp.disable_casts()``), or ``None``.
    - ``description``: what the plugin did and why, for summaries.
    - ``no_scaler_reason`` (contract 1.3, keyword only): why a ``"16-mixed"`` plan has no grad scaler.
    - ``uncompiled_note`` (contract 1.9, keyword only): what training under this plan costs where the model is
      not compiled, in a sentence; the Trainer logs it once as a warning when it sets a module up without
      ``compile=True`` (torchao's fp8 on a GPU runs its scaling as separate kernels unless compiled).

    ``"16-mixed"`` is float16 autocast, whose narrow exponent range flushes small gradients to zero unless
    the loss is scaled: a ``"16-mixed"`` plan must carry a ``scaler``, or say in ``no_scaler_reason`` why
    none is needed (e.g. ``"the optimizer scales the loss itself"``). A ``"16-mixed"`` plan with neither
    cannot be built (``ValueError``); returned from ``devplug_precision``, that is reported as the plugin's
    error, naming it. The same holds for any registered precision that says it needs a grad scaler.
    """

    name: str
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = _nullcontext
    scaler: Any = None
    convert_module: Callable[[torch.nn.Module], torch.nn.Module] | None = None
    optimizer_step_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    description: str = ""
    no_scaler_reason: str = attrs.field(default="", kw_only=True, validator=attrs.validators.instance_of(str))
    uncompiled_note: str = attrs.field(default="", kw_only=True, validator=attrs.validators.instance_of(str))

    def __attrs_post_init__(self) -> None:
        if self.scaler is not None or self.no_scaler_reason.strip():
            return
        if self.name == FLOAT16_PRECISION:
            raise ValueError(
                f"a {FLOAT16_PRECISION!r} PrecisionPlan (float16 autocast) has no grad scaler, so small gradients "
                "underflow to zero: give it scaler=torch.amp.GradScaler(...), or no_scaler_reason='why none is "
                "needed'")
        precision = REGISTERED.get(self.name)
        if precision is not None and precision.needs_scaler:
            raise ValueError(
                f"a {self.name!r} PrecisionPlan has no grad scaler, which that precision needs "
                f"({precision.scaler_reason}): give it scaler=torch.amp.GradScaler(...), or "
                "no_scaler_reason='why none is needed'")


def _notes(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(note, str) for note in value):
        raise ValueError(f"PrecisionParams.{attribute.name} must be a tuple of strings, got {value!r}")


@attrs.frozen(kw_only=True)
class PrecisionParams:
    """What a device plugin says when it asks a precision for its plan: the device's parameters.

    - ``device_type``: the torch device type autocast and the grad scaler are built for (``"cuda"``).
    - ``scaler``: ``None`` follows the precision (a scaler exactly when it needs one); ``True`` or
      ``False`` overrides it, and turning off a scaler the precision needs takes ``no_scaler_reason``.
    - ``autocast``: False when the device casts by other means (a module conversion, e.g. Habana HMP):
      the plan then enters no autocast context.
    - ``convert_module``, ``optimizer_step_context``: passed into the plan as they are (see `PrecisionPlan`).
    - ``forward_context``: a device's own context, entered inside the precision's autocast around forward and
      loss (Intel Gaudi's ``te.fp8_autocast``); only a precision that says it takes one uses it (``"fp8-mixed"``).
    - ``description``: replaces the precision's own description of the plan; ``notes``: what the
      plugin decided and why, appended in parentheses (``"TF32 on Ampere and newer"``).
    """

    device_type: str = attrs.field(validator=attrs.validators.instance_of(str))
    scaler: bool | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.instance_of(bool)))
    no_scaler_reason: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    autocast: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    convert_module: Callable[[torch.nn.Module], torch.nn.Module] | None = None
    optimizer_step_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    forward_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    description: str | None = None
    notes: tuple[str, ...] = attrs.field(default=(), validator=_notes)


class Precision(abc.ABC):
    """One precision setting: its name, compute dtype, grad-scaler need, and how its plan is built.

    Subclasses set the class attributes and implement `plan`; register an instance in
    `devplug.core.precision.registry` (or, from a plugin, with ``devplug.toolkit.register_precision``).
    """

    #: The setting's name, as ``Trainer(precision=...)`` takes it ("bf16-mixed").
    name: str
    #: The dtype forward and backward compute in (float32 for fp32 training).
    compute_dtype: torch.dtype
    #: Whether its gradients need loss scaling to survive (a grad scaler), and why or why not.
    needs_scaler: bool
    scaler_reason: str
    #: One line for users: what the setting does (help texts, docs, ``devplug doctor``).
    summary: str

    @abc.abstractmethod
    def plan(self, params: PrecisionParams) -> PrecisionPlan:
        """The plan for a device with ``params``; ``devplug.PrecisionError`` when the device type cannot run it."""

    @property
    def gather_dtype(self) -> torch.dtype | None:
        """The dtype FSDP gathers parameters in at this precision: the compute dtype where it is a 16-bit float.

        ``None`` keeps the parameters' own (fp32). A precision whose weights travel otherwise overrides it.
        """
        return self.compute_dtype if self.compute_dtype in (torch.bfloat16, torch.float16) else None

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype this precision's autocast casts to, if it autocasts: the compute dtype, unless that is fp32.

        ``None``: a plan for it casts nothing (the core refuses one that does). A precision that casts
        by other means overrides it.
        """
        return None if self.compute_dtype == torch.float32 else self.compute_dtype

    def describe(self, text: str, params: PrecisionParams) -> str:
        """``text`` (or the device's own ``description``) with the device's notes appended in parentheses."""
        description = text if params.description is None else params.description
        return description + (f" ({'; '.join(params.notes)})" if params.notes else "")

    def use_scaler(self, params: PrecisionParams) -> bool:
        """Whether the plan carries a grad scaler: the device's say, else this precision's need.

        Dropping one the precision needs takes ``params.no_scaler_reason``: the `PrecisionPlan` refuses it
        otherwise.
        """
        return self.needs_scaler if params.scaler is None else params.scaler

    def __repr__(self) -> str:
        return f"<precision {self.name}: {self.summary}>"


#: The registered precisions by name, filled by `devplug.core.precision.registry` (kept here, at the bottom of
#: the layer, so that a `PrecisionPlan` can hold any precision that needs a grad scaler to its need).
REGISTERED: dict[str, Precision] = {}

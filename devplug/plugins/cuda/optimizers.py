"""The fastest optimizer for a name on CUDA: NVIDIA apex's fused optimizers, torch ``fused=True``, foreach.

Order of preference:

1. ``apex.optimizers.FusedAdam`` (``"adam"``, ``"adamw"``), ``FusedSGD`` (``"sgd"``), ``FusedLAMB``
   (``"lamb"``) when *NVIDIA* apex is importable. The ``apex`` on PyPI is an unrelated package, so a
   module named ``apex`` only counts when it has ``apex.optimizers``.
2. torch's fused CUDA kernel (``fused=True``) for the optimizers that have one.
3. torch's multi-tensor implementation (``foreach=True``).

Author options are mapped faithfully: apex gets torch's defaults for the options both share (so
``"adamw"`` keeps torch's ``weight_decay=0.01``), FusedAdam's ``adam_w_mode`` says Adam or AdamW, and an
option apex cannot honour (``amsgrad=True``, ``maximize=True``, explicit ``fused``/``foreach``) sends
the request to torch with the reason recorded. apex's state is converted to and from torch.optim's
layout for checkpoints (`devplug.plugins.cuda.optimizer_state`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, cast

import attrs
import torch

from devplug import OptimizerChoice, OptimizerError
from devplug.plugins.cuda.optimizer_state import CONVERTERS
from devplug.toolkit import groups_kept_on_failure, torch_optimizer_class, torch_optimizer_defaults

#: apex class for each optimizer name.
APEX_CLASSES: dict[str, str] = {"adam": "FusedAdam", "adamw": "FusedAdam", "sgd": "FusedSGD", "lamb": "FusedLAMB"}

#: Optimizers with a fused CUDA kernel in torch (``fused=True``).
TORCH_FUSED: tuple[str, ...] = ("adam", "adamw", "sgd", "adagrad")

#: Options apex accepts besides the ones it shares with torch (passed through unchanged).
_APEX_ONLY: dict[str, frozenset[str]] = {
    "FusedAdam": frozenset({"bias_correction", "set_grad_none", "capturable", "master_weights"}),
    "FusedSGD": frozenset({"wd_after_momentum", "materialize_master_grads", "set_grad_none"}),
}

#: torch options apex shares, per apex class.
_SHARED: dict[str, frozenset[str]] = {
    "FusedAdam": frozenset({"lr", "betas", "eps", "weight_decay"}),
    "FusedSGD": frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov"}),
}

#: torch options apex does not have, accepted only at their torch default.
_TORCH_ONLY_DEFAULTS: dict[str, Any] = {"amsgrad": False, "maximize": False, "differentiable": False}

INSTALL_APEX = (
    "build NVIDIA apex with its CUDA extensions for fused optimizers: "
    "APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation ./apex (see docs/devices/cuda.md)"
)


@attrs.frozen
class ApexStatus:
    """Whether NVIDIA apex's optimizers can be used: the ``apex.optimizers`` module, or why not."""

    optimizers: Any = None
    reason: str = ""

    @property
    def available(self) -> bool:
        """True when ``apex.optimizers`` imported."""
        return self.optimizers is not None


def find_apex() -> ApexStatus:
    """Import NVIDIA apex's ``apex.optimizers`` if it is there; otherwise say why it is not usable.

    Not cached, so installing apex (or a test inserting a stand-in) takes effect at once. Importing a
    module that is already imported is a dictionary look-up.
    """
    try:
        importlib.import_module("apex")
    except ModuleNotFoundError as exc:
        if exc.name == "apex":
            return ApexStatus(reason="NVIDIA apex is not installed")
        return ApexStatus(reason=f"a package named 'apex' is installed but does not import ({exc}); "
                                 "it is probably PyPI's unrelated 'apex', not NVIDIA apex")
    except Exception as exc:  # PyPI's apex is old Python 2 code: SyntaxError, ImportError, ...
        return ApexStatus(reason=f"a package named 'apex' is installed but does not import "
                                 f"({type(exc).__name__}: {exc}); it is probably PyPI's unrelated 'apex', "
                                 "not NVIDIA apex")
    try:
        module = importlib.import_module("apex.optimizers")
    except ModuleNotFoundError as exc:
        if exc.name in ("apex.optimizers", "apex"):
            return ApexStatus(reason="the installed 'apex' is not NVIDIA apex: it has no apex.optimizers "
                                     "(PyPI's 'apex' is an unrelated package; uninstall it)")
        return ApexStatus(reason=f"NVIDIA apex is installed but apex.optimizers does not import: {exc}")
    except Exception as exc:
        return ApexStatus(reason=f"NVIDIA apex is installed but apex.optimizers does not import "
                                 f"({type(exc).__name__}: {exc})")
    return ApexStatus(optimizers=module)


def apex_arguments(name: str, options: Mapping[str, Any], groups: Sequence[Mapping[str, Any]] = ()
                   ) -> tuple[dict[str, Any] | None, str]:
    """apex keyword arguments equivalent to torch optimizer ``name`` with ``options`` and parameter ``groups``.

    Returns ``(kwargs, "")``, or ``(None, reason)`` when apex cannot honour an option. Shared options
    start from torch's defaults, so the optimizer behaves as ``torch.optim`` would. apex reads only its own
    keys from a group, so a torch option set there (``amsgrad=True``), or a group's ``decoupled_weight_decay``
    other than the optimizer's (FusedAdam takes that mode once), cannot be honoured either; keys that are no
    torch option (a group's own ``name``) are the author's, ignored by torch too.
    """
    key = name.lower()
    cls_name = APEX_CLASSES[key]
    if cls_name == "FusedLAMB":  # no torch counterpart: the options are FusedLAMB's own
        return dict(options), ""
    for explicit in ("fused", "foreach"):
        if explicit in options:
            return None, f"the options ask for torch's {explicit} implementation ({explicit}={options[explicit]!r})"
    torch_cls = torch_optimizer_class(key)
    defaults = torch_optimizer_defaults(torch_cls)
    kwargs: dict[str, Any] = {k: defaults[k] for k in _SHARED[cls_name] if k in defaults}
    decoupled = key == "adamw"
    for option, value in options.items():
        if option in _SHARED[cls_name] or option in _APEX_ONLY[cls_name]:
            kwargs[option] = value
        elif option == "decoupled_weight_decay" and key == "adam":
            decoupled = bool(value)
        elif option in _TORCH_ONLY_DEFAULTS and value == _TORCH_ONLY_DEFAULTS[option]:
            continue
        else:
            return None, f"apex.optimizers.{cls_name} has no equivalent of {option}={value!r}"
    for group in groups:
        for option, value in group.items():
            if option == "params" or option in _SHARED[cls_name] or option in _APEX_ONLY[cls_name]:
                continue
            if option == "decoupled_weight_decay" and key == "adam":
                if bool(value) != decoupled:
                    return None, (f"apex.optimizers.{cls_name} takes decoupled_weight_decay once for all parameter "
                                  f"groups, and one group asks for {value!r}")
            elif option in defaults and value != defaults[option]:
                return None, (f"apex.optimizers.{cls_name} has no equivalent of {option}={value!r} (in a parameter "
                              "group)")
    if cls_name == "FusedAdam":
        kwargs["adam_w_mode"] = decoupled
        if kwargs.get("master_weights") and not kwargs.get("capturable"):
            raise OptimizerError(
                "apex.optimizers.FusedAdam accepts master_weights=True only with capturable=True (apex refuses "
                "the combination); add capturable=True or leave master_weights out"
            )
    # The Trainer zeroes gradients with set_to_none=True; apex's FusedSGD defaults to zero-filling.
    kwargs.setdefault("set_grad_none", True)
    return kwargs, ""


@functools.cache
def with_set_to_none(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``cls`` itself when its ``zero_grad`` accepts ``set_to_none``; else a subclass whose one does.

    apex's fused optimizers define ``zero_grad(self)`` without torch's ``set_to_none`` argument, which
    the Trainer (and most training loops) pass.
    """
    if "set_to_none" in inspect.signature(cls.zero_grad).parameters:
        return cls

    def zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        """Reset gradients: to ``None`` (default) or, with ``set_to_none=False``, to zero."""
        if set_to_none:
            for group in self.param_groups:
                for param in group["params"]:
                    param.grad = None
        else:
            torch.optim.Optimizer.zero_grad(self, set_to_none=False)

    namespace = {"zero_grad": zero_grad, "__module__": __name__, "__doc__": cls.__doc__,
                 "__qualname__": cls.__qualname__}
    return cast("type[torch.optim.Optimizer]", type(cls.__name__, (cls,), namespace))


class _AlreadyUnscaled:
    """The GradScaler as apex's capturable step should see it once the gradients are unscaled.

    apex's capturable ``FusedAdam.step(grad_scaler=...)`` divides the gradients by the scaler's scale
    without asking whether ``scaler.unscale_`` (gradient clipping) has done so already. This view
    reports a scale of one and hands over the inf/NaN check ``unscale_`` recorded, so the gradients are
    divided once and a step with inf/NaN gradients is still skipped, on the device.
    """

    def __init__(self, scaler: Any, optimizer: torch.optim.Optimizer) -> None:
        self._scaler, self._optimizer = scaler, optimizer

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        return self._scaler._per_optimizer_states[id(self._optimizer)]["found_inf_per_device"]

    def _get_scale_async(self) -> torch.Tensor:
        return torch.ones_like(self._scaler._get_scale_async())


def _unscaled_already(scaler: Any, optimizer: torch.optim.Optimizer) -> bool:
    from torch.amp.grad_scaler import OptState

    states = getattr(scaler, "_per_optimizer_states", None)
    return states is not None and states[id(optimizer)]["stage"] is OptState.UNSCALED


@functools.cache
def unscale_once(cls: Any) -> type[torch.optim.Optimizer]:
    """A subclass of apex's ``FusedAdam`` whose capturable step does not unscale gradients twice."""
    apex_step = cls.step

    def step(self: Any, closure: Any = None, grad_scaler: Any = None, **kwargs: Any) -> Any:
        """apex's step; a GradScaler that already unscaled this optimizer is passed with a scale of one."""
        if grad_scaler is not None and self.capturable and _unscaled_already(grad_scaler, self):
            grad_scaler = _AlreadyUnscaled(grad_scaler, self)
        return apex_step(self, closure, grad_scaler=grad_scaler, **kwargs)

    namespace = {"step": step, "__module__": __name__, "__doc__": cls.__doc__, "__qualname__": cls.__qualname__}
    return cast("type[torch.optim.Optimizer]", type(cls.__name__, (cls,), namespace))


def _describe(prefix: str, kwargs: Mapping[str, Any]) -> str:
    if not kwargs:
        return prefix
    return prefix + "(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


def build_apex(name: str, params: list[Any], options: Mapping[str, Any], apex: ApexStatus) -> OptimizerChoice | str:
    """An apex optimizer for ``name``, or the reason (a string) it cannot be used."""
    cls_name = APEX_CLASSES.get(name.lower())
    if cls_name is None:
        return f"apex has no fused {name!r}"
    if not apex.available:
        return apex.reason
    cls = getattr(apex.optimizers, cls_name, None)
    if cls is None:
        return f"this NVIDIA apex has no apex.optimizers.{cls_name}"
    kwargs, reason = apex_arguments(name, options, [p for p in params if isinstance(p, Mapping)])
    if kwargs is None:
        return reason
    built: Any = with_set_to_none(cls)
    if kwargs.get("capturable"):
        built = unscale_once(built)
    try:
        with groups_kept_on_failure(params):  # apex writes its defaults into the groups before it refuses
            optimizer = built(params, **kwargs)
    except RuntimeError as exc:  # e.g. "apex.optimizers.FusedAdam requires cuda extensions"
        return (f"apex.optimizers.{cls_name} could not be built ({exc}); "
                "apex was probably built without its CUDA extensions (APEX_CUDA_EXT=1)")
    shown = {"adam_w_mode": kwargs["adam_w_mode"]} if cls_name == "FusedAdam" else {}
    return OptimizerChoice(optimizer, _describe(f"apex.optimizers.{cls_name}", shown), **CONVERTERS.get(cls_name, {}))


def build_torch(name: str, params: list[Any], options: Mapping[str, Any], reason: str = "") -> OptimizerChoice:
    """torch's fastest CUDA implementation of ``name``: ``fused=True``, else ``foreach=True``, else default."""
    key = name.lower()
    cls = torch_optimizer_class(key)
    accepted = inspect.signature(cls).parameters
    base = f"torch.optim.{cls.__name__}"
    if "fused" in options or "foreach" in options:  # the author chose: respect it
        chosen = {k: options[k] for k in ("fused", "foreach") if k in options}
        return OptimizerChoice(cls(params, **options), _describe(base, chosen), reason)
    if key in TORCH_FUSED and "fused" in accepted and not options.get("differentiable", False):
        # a torch.optim subclass: its constructor takes the options Optimizer's own signature lacks
        optimizer = cls(params, fused=True, **options)  # type: ignore[call-arg]
        return OptimizerChoice(optimizer, f"{base}(fused=True)", reason)
    if "foreach" in accepted:
        # a torch.optim subclass: its constructor takes the options Optimizer's own signature lacks
        optimizer = cls(params, foreach=True, **options)  # type: ignore[call-arg]
        return OptimizerChoice(optimizer, f"{base}(foreach=True)", reason)
    return OptimizerChoice(cls(params, **options), base, reason)


def build_optimizer(
    name: str, params: Any, options: Mapping[str, Any], *, use_apex: bool = True, apex: ApexStatus | None = None
) -> OptimizerChoice:
    """Build the fastest CUDA optimizer for ``name``; the choice names the implementation and why.

    ``use_apex=False`` skips apex (device option ``apex=False``). ``apex`` is the result of
    `find_apex` (looked up when ``None``). Raises `OptimizerError` for a name neither apex
    nor torch provides.
    """
    params = list(params)  # it may be a generator and an apex attempt must not consume it
    key = name.lower()
    reason = ""
    if key in APEX_CLASSES:
        if use_apex:
            status = apex if apex is not None else find_apex()
            built = build_apex(key, params, options, status)
            if isinstance(built, OptimizerChoice):
                return built
            reason = built
        else:
            reason = "apex disabled by the device option apex=False"
    if key == "lamb":
        raise OptimizerError(
            f"optimizer 'lamb' needs NVIDIA apex (apex.optimizers.FusedLAMB) on CUDA, and {reason}. "
            f"To fix: {INSTALL_APEX}"
        )
    return build_torch(key, params, options, reason)

"""Plain-PyTorch recipes that the core fallback and device plugins share (public through devplug.toolkit).

Standard optimizer names and their torch classes and defaults, torch's fastest optimizer kernel for a
device type (``fused``, ``foreach``), precision plans built from ``torch.autocast`` and
``torch.amp.GradScaler`` (with ``"auto"`` resolved from what torch reports for the device type), and the
memory figure of the host process.
"""

from __future__ import annotations

import functools
import inspect
import logging
import platform
from typing import Any

import attrs
import torch

from devplug.core import accelerator
from devplug.core.errors import OptimizerError, PrecisionError
from devplug.core.records import Device, MemoryStats, OptimizerChoice, PrecisionPlan

log = logging.getLogger("devplug")

#: Standard optimizer names and their torch classes.
TORCH_OPTIMIZERS: dict[str, str] = {
    "adam": "Adam",
    "adamw": "AdamW",
    "sgd": "SGD",
    "rmsprop": "RMSprop",
    "adagrad": "Adagrad",
    "adamax": "Adamax",
    "nadam": "NAdam",
    "radam": "RAdam",
    "lamb": "",  # no torch implementation; plugins with apex provide it
}


def torch_optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The ``torch.optim`` class for a standard optimizer name, or an :class:`OptimizerError`."""
    cls_name = TORCH_OPTIMIZERS.get(name.lower())
    if not cls_name:
        known = ", ".join(n for n, c in TORCH_OPTIMIZERS.items() if c)
        raise OptimizerError(f"unknown optimizer {name!r}; torch provides: {known}")
    return getattr(torch.optim, cls_name)


@functools.cache
def torch_optimizer_defaults(cls: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """The keyword defaults of a torch optimizer's constructor, e.g. ``{"lr": 0.001, "betas": ...}``.

    Plugins mapping an author's options onto a vendor optimizer start from these, so an option the author
    left out behaves as it would in ``torch.optim``.
    """
    return {
        name: p.default
        for name, p in inspect.signature(cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def autocast_plan(device: Device, precision: str, *, scaler: bool | None = None) -> PrecisionPlan:
    """A precision plan built only from ``torch.autocast`` and ``torch.amp.GradScaler``.

    ``"16-mixed"`` gets a grad scaler unless ``scaler=False``; ``"bf16-mixed"`` none.
    """
    kind = device.torch_device.type
    if precision == "32-true":
        return PrecisionPlan(name="32-true", description="full fp32")
    if precision not in ("16-mixed", "bf16-mixed"):
        raise PrecisionError(f"precision {precision!r} is not one of 32-true, 16-mixed, bf16-mixed, auto")
    dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
    if not torch.amp.is_autocast_available(kind):
        raise PrecisionError(f"torch has no autocast for device type {kind!r}; use precision='32-true'")
    use_scaler = (precision == "16-mixed") if scaler is None else scaler
    grad_scaler = torch.amp.GradScaler(kind) if use_scaler else None
    return PrecisionPlan(
        name=precision,
        autocast=lambda: torch.autocast(device_type=kind, dtype=dtype),
        scaler=grad_scaler,
        description=f"torch.autocast({kind!r}, {str(dtype).replace('torch.', '')})"
        + (" + GradScaler" if grad_scaler is not None else ""),
    )



def torch_precision_plan(device: Device, precision: str) -> PrecisionPlan:
    """:func:`autocast_plan`, with ``"auto"`` resolved from what torch reports for the device type, and why.

    ``"auto"`` is ``"bf16-mixed"`` where torch has autocast for the type
    (``torch.amp.is_autocast_available``) and the type's module reports native bf16
    (``is_bf16_supported``), else ``"32-true"``; the plan's description says which and why.
    """
    if precision != "auto":
        return autocast_plan(device, precision)
    kind = device.torch_device.type
    if not torch.amp.is_autocast_available(kind):
        chosen, why = "32-true", f"torch has no autocast for device type {kind!r}"
    else:
        bf16, why = accelerator.native_bf16(kind)
        chosen = "bf16-mixed" if bf16 else "32-true"
    plan = autocast_plan(device, chosen)
    return attrs.evolve(plan, description=f"{plan.description} (auto: {why})")


#: torch.optim implementations faster than the default loop, fastest first (constructor options).
KERNELS: tuple[str, ...] = ("fused", "foreach")


@functools.cache
def torch_kernel(name: str, device_type: str) -> tuple[str, str]:
    """torch's fastest kernel for optimizer ``name`` on ``device_type``: ``("fused" | "foreach" | "", reason)``.

    Probed once per (name, device type) by building the optimizer over a one-element parameter on the
    device type and taking a step; ``reason`` says why a faster kernel was not chosen (empty when
    ``fused`` was).
    """
    cls = torch_optimizer_class(name)
    accepted = inspect.signature(cls).parameters
    try:
        param = torch.nn.Parameter(torch.zeros(1, device=device_type))
    except Exception as exc:  # the device type cannot hold a tensor in this process
        return "", f"no tensor could be placed on {device_type!r} to probe torch's kernels ({_first_line(exc)})"
    reasons: list[str] = []
    for kernel in KERNELS:
        if kernel not in accepted:
            reasons.append(f"torch.optim.{cls.__name__} has no {kernel} option")
            continue
        try:
            param.grad = torch.zeros_like(param)
            cls([param], **{kernel: True}).step()
        except Exception as exc:  # whatever torch raises for a kernel it lacks on this device type
            reasons.append(f"no {kernel} {cls.__name__} for {device_type!r} in this torch ({_first_line(exc)})")
            continue
        return kernel, "; ".join(reasons)
    return "", "; ".join(reasons)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fastest_torch_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice:
    """torch's fastest implementation of optimizer ``name`` on ``device``: ``fused=True``, ``foreach=True``, default.

    The choice names the implementation (``"torch.optim.Adam(fused=True)"``) and, when a faster kernel
    was not used, why. ``fused`` or ``foreach`` in ``options`` is the author's choice and is kept.
    """
    cls = torch_optimizer_class(name)
    base = f"torch.optim.{cls.__name__}"
    chosen = {k: options[k] for k in KERNELS if k in options}
    if chosen:
        described = ", ".join(f"{k}={v!r}" for k, v in chosen.items())
        return OptimizerChoice(cls(params, **options), f"{base}({described})", "the author chose the implementation")
    params = list(params)
    kernel, reason = torch_kernel(name.lower(), device.torch_device.type)
    if kernel:
        try:
            return OptimizerChoice(cls(params, **{kernel: True}, **options), f"{base}({kernel}=True)", reason)
        except (RuntimeError, ValueError, TypeError) as exc:  # e.g. fused with differentiable=True
            reason = f"{kernel}=True does not take these options ({exc})"
    return OptimizerChoice(cls(params, **options), base, reason)


def process_memory_stats() -> MemoryStats:
    """Peak resident memory of this process as the OS reports it (the host's figure for CPU-resident devices)."""
    try:
        import resource

        scale = 1 if platform.system() == "Darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    except (ImportError, OSError):
        peak = None
    return MemoryStats(peak_allocated=peak)


_logged: set[str] = set()


def log_once(message: str, level: int = logging.INFO, *, logger: str = "devplug") -> None:
    """Log ``message`` on ``logger`` at ``level`` the first time it comes up in this process."""
    if message not in _logged:
        _logged.add(message)
        logging.getLogger(logger).log(level, "%s", message)


def forget_logged() -> None:
    """Forget which messages :func:`log_once` has logged (tests)."""
    _logged.clear()

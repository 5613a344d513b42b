"""torch.optim's table: standard optimizer names, their torch classes and defaults, torch's fastest kernel.

What the core fallback and device plugins share (public through devplug.toolkit): the standard names and
their ``torch.optim`` classes, a class's constructor defaults, and torch's fastest kernel for an optimizer on
a device type (``fused``, ``foreach``), probed once per process.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Iterator
from typing import Any

import torch

from devplug.core.contract.records import Device, OptimizerChoice
from devplug.core.errors import OptimizerError

log = logging.getLogger("devplug")

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
"""Standard optimizer names and the names of their ``torch.optim`` classes (empty: torch has none)."""


def torch_optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The ``torch.optim`` class for a standard optimizer name, or an `OptimizerError`."""
    cls_name = TORCH_OPTIMIZERS.get(name.lower())
    if not cls_name:
        known = ", ".join(n for n, c in TORCH_OPTIMIZERS.items() if c)
        raise OptimizerError(f"unknown optimizer {name!r}; torch provides: {known}")
    return getattr(torch.optim, cls_name)


# Computed once per class. Not functools.cache: mypy does not accept a class for the Hashable arguments of
# its wrapper, so every caller passing a type[Optimizer] would fail to type-check.
_DEFAULTS: dict[type[torch.optim.Optimizer], dict[str, Any]] = {}


def torch_optimizer_defaults(cls: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """The keyword defaults of a torch optimizer's constructor, e.g. ``{"lr": 0.001, "betas": ...}``.

    Plugins mapping an author's options onto a vendor optimizer start from these, so an option the author
    left out behaves as it would in ``torch.optim``.
    """
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        defaults = _DEFAULTS[cls] = {
            name: p.default
            for name, p in inspect.signature(cls).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
    return defaults


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
            # a torch.optim subclass: its constructor takes the options Optimizer's own signature lacks
            cls([param], **{kernel: True}).step()  # type: ignore[arg-type]
        except Exception as exc:  # whatever torch raises for a kernel it lacks on this device type
            reasons.append(f"no {kernel} {cls.__name__} for {device_type!r} in this torch ({_first_line(exc)})")
            continue
        return kernel, "; ".join(reasons)
    return "", "; ".join(reasons)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _build(cls: type[torch.optim.Optimizer], params: Any, options: dict[str, Any]) -> torch.optim.Optimizer:
    """``cls(params, **options)``; an option torch refuses is the author's `OptimizerError`, in one line."""
    try:
        return cls(params, **options)
    except (TypeError, ValueError, RuntimeError) as exc:  # an unknown option, a value out of range, a conflict
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise OptimizerError(f"cannot build torch.optim.{cls.__name__} with {sorted(options)}: {text}") from exc


def _authors_choice(cls: type[torch.optim.Optimizer], params: Any, options: dict[str, Any]) -> OptimizerChoice | None:
    """The optimizer built as the author asked, when ``options`` name a kernel (``fused`` or ``foreach``)."""
    chosen = {k: options[k] for k in KERNELS if k in options}
    if not chosen:
        return None
    described = ", ".join(f"{k}={v!r}" for k, v in chosen.items())
    return OptimizerChoice(_build(cls, params, options), f"torch.optim.{cls.__name__}({described})",
                           "the author chose the implementation")


def fastest_torch_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice:
    """torch's fastest implementation of optimizer ``name`` on ``device``: ``fused=True``, ``foreach=True``, default.

    The choice names the implementation (``"torch.optim.Adam(fused=True)"``) and, when a faster kernel
    was not used, why. ``fused`` or ``foreach`` in ``options`` is the author's choice and is kept.
    """
    cls = torch_optimizer_class(name)
    authors = _authors_choice(cls, params, options)
    if authors is not None:
        return authors
    kernel, reason = torch_kernel(name.lower(), device.torch_device.type)
    return _with_kernel(cls, list(params), options, kernel, reason)


def _with_kernel(cls: type[torch.optim.Optimizer], params: list[Any], options: dict[str, Any], kernel: str | None,
                 reason: str) -> OptimizerChoice:
    """``cls`` with ``kernel=True`` (``None``: torch's default); where the kernel refuses the options (``fused``
    with ``differentiable=True``), torch's default kernel, the reason saying why."""
    base = f"torch.optim.{cls.__name__}"
    if kernel:
        try:
            with groups_kept_on_failure(params):
                # a torch.optim subclass: its constructor takes the options Optimizer's own signature lacks
                optimizer = cls(params, **{kernel: True}, **options)  # type: ignore[arg-type]
            return OptimizerChoice(optimizer, f"{base}({kernel}=True)", reason)
        except (RuntimeError, ValueError, TypeError) as exc:  # e.g. fused with differentiable=True
            reason = f"{kernel}=True does not take these options ({' '.join(str(exc).split())})"
    return OptimizerChoice(_build(cls, params, options), base, reason)


@contextlib.contextmanager
def groups_kept_on_failure(params: list[Any]) -> Iterator[None]:
    """Build an optimizer over ``params`` inside: if that fails, each parameter group dict is put back as the
    author gave it, so the next attempt (another kernel or implementation) starts from the author's groups.

    torch writes its defaults (``fused=True``, say) into the group dicts it is given, also when it then
    refuses the options. The ``params`` list torch made of a group's generator is kept: a generator is read
    once.
    """
    saved = [(group, dict(group)) for group in params if isinstance(group, dict)]
    try:
        yield
    except BaseException:
        for group, before in saved:
            listed = {"params": group["params"]} if "params" in group else {}
            group.clear()
            group.update(before, **listed)
        raise


def sharded_torch_optimizer(name: str, params: Any, options: dict[str, Any], kernel: str,
                            reason: str) -> OptimizerChoice:
    """torch.optim's ``name`` over sharded (DTensor) parameters with the ``kernel`` a ShardingPlan allows.

    ``kernel`` is ``"fused"``, ``"foreach"`` or ``"for-loop"``; ``reason`` (the plan's) is recorded in the
    choice. ``fused`` or ``foreach`` in ``options`` is the author's choice and is kept.
    """
    cls = torch_optimizer_class(name)
    authors = _authors_choice(cls, params, options)
    if authors is not None:
        return authors
    usable = kernel in KERNELS and kernel in inspect.signature(cls).parameters
    return _with_kernel(cls, list(params), options, kernel if usable else None, reason)

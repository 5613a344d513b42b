"""Habana's fused optimizers for "adamw", "adam" and "sgd", with the author's options mapped faithfully.

``habana_frameworks.torch.hpex.optimizers`` has ``FusedAdamW(params, lr=1e-3, betas=(0.9, 0.999),
eps=1e-6, weight_decay=0.0, bias_correction=True, moments_dtype=None)`` and ``FusedSGD(params, lr,
momentum=0, weight_decay=0, dampening=0, nesterov=False)``; they update every parameter of a group in
one kernel launch instead of one per tensor. Their defaults differ from torch's (eps 1e-6 vs 1e-8,
AdamW's weight decay 0.0 vs 1e-2), so every option the author left out is filled in from the *torch*
optimizer's defaults. ``moments_dtype`` (FusedAdamW's own: a dtype for both moments, or a pair) is
passed through.

FusedAdamW is AdamW with one difference in where ``eps`` goes: it folds both bias corrections into the
step size, ``lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps)``, where torch divides first,
``lr / bc1 * m / (sqrt(v / bc2) + eps)``. That is torch's update with ``eps`` scaled by
``1 / sqrt(bc2)`` (about 32x on the first step with ``beta2=0.999``, fading over the first few thousand
steps). It matters only where ``sqrt(v)`` is near ``eps``: for a first-step gradient of 1e-6 with
``eps=1e-8`` the update is 0.76 of ``lr`` on FusedAdamW and 0.99 on torch's AdamW. devplug does not
rescale ``eps`` per step to hide this: in lazy mode a new constant every step would compile a new graph.

There is no fused Adam. Adam's ``weight_decay`` adds ``wd * param`` to the gradient (L2), AdamW's decays
the weights directly (decoupled); the two differ whenever the decay is not zero. So "adam" runs on
``FusedAdamW(weight_decay=0)``, which is Adam (with FusedAdamW's eps placement, below), when its weight
decay is 0 (the default) or when it asks for ``decoupled_weight_decay=True`` (torch's own spelling of
AdamW); Adam with L2 weight decay stays ``torch.optim.Adam``, with the reason. So does any option the
fused kernels lack (``amsgrad``, ``maximize``, ...). Options that only steer torch's own kernels
(``foreach``, ``fused``, ``capturable``) do not apply to Habana's and are dropped. Their state is
converted to and from torch.optim's layout for checkpoints (`devplug.plugins.hpu.optimizer_state`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from devplug import Device, OptimizerChoice
from devplug.plugins.hpu import optimizer_state, runtime
from devplug.toolkit import torch_optimizer_class, torch_optimizer_defaults

HPEX_OPTIMIZERS = "habana_frameworks.torch.hpex.optimizers"
#: torch options that choose among torch's own kernels; they mean nothing to a Habana fused optimizer.
TORCH_KERNEL_HINTS = ("foreach", "fused", "capturable")


@attrs.frozen
class FusedMapping:
    """A Habana fused optimizer and the torch options it implements, for one optimizer name."""

    hpex_class: str
    options: tuple[str, ...]


#: Options of Habana's fused optimizers that torch's have not (passed through when given).
HABANA_ONLY: dict[str, tuple[str, ...]] = {"FusedAdamW": ("moments_dtype",), "FusedSGD": ()}

MAPPINGS: dict[str, FusedMapping] = {
    "adamw": FusedMapping("FusedAdamW", ("lr", "betas", "eps", "weight_decay", "moments_dtype")),
    "adam": FusedMapping("FusedAdamW", ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay",
                                        "moments_dtype")),
    "sgd": FusedMapping("FusedSGD", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
}


def _groups(params: list[Any]) -> list[Mapping[str, Any]]:
    return [p for p in params if isinstance(p, Mapping)]


def _unsupported(name: str, options: Mapping[str, Any], groups: list[Mapping[str, Any]],
                 defaults: Mapping[str, Any]) -> str:
    """Why the fused optimizer cannot run these options faithfully ("" when it can)."""
    mapping = MAPPINGS[name]
    changed = {
        key: value
        for key, value in options.items()
        if key not in mapping.options and key not in TORCH_KERNEL_HINTS and value != defaults.get(key, object())
    }
    for group in groups:
        changed.update(
            (key, value)
            for key, value in group.items()
            if key in defaults and key not in mapping.options and key not in TORCH_KERNEL_HINTS
            and value != defaults[key]
        )
    if changed:
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(changed.items()))
        return f"{mapping.hpex_class} has no equivalent of {shown}"
    if name == "adam" and not options.get("decoupled_weight_decay", False):
        decays = [options.get("weight_decay", 0)] + [g["weight_decay"] for g in groups if "weight_decay" in g]
        if any(d != 0 for d in decays):
            return (
                "Adam's weight_decay is an L2 term added to the gradient, while FusedAdamW decays weights "
                "decoupled (AdamW), a different algorithm; ask for 'adamw' to get the fused kernel"
            )
    return ""


def _fused_kwargs(name: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    keys = [k for k in MAPPINGS[name].options if k != "decoupled_weight_decay"]
    return {key: options[key] if key in options else defaults[key] for key in keys
            if key in options or key in defaults}


def _torch_choice(cls: type[torch.optim.Optimizer], params: list[Any], options: dict[str, Any],
                  reason: str) -> OptimizerChoice:
    habana_only = sorted(k for names in HABANA_ONLY.values() for k in names if k in options)
    if habana_only:  # FusedAdamW's own options: torch's optimizer keeps its moments in the parameters' dtype
        reason += f" ({', '.join(habana_only)} applies to FusedAdamW only and is not used)"
        options = {k: v for k, v in options.items() if k not in habana_only}
    return OptimizerChoice(cls(params, **options), f"torch.optim.{cls.__name__}", reason=reason)


def build_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice | None:
    """A Habana fused optimizer for "adamw", "adam" or "sgd"; ``None`` for other names (torch decides).

    Falls back to the torch optimizer, with the reason, when the options need something the fused
    kernels lack or when ``habana_frameworks.torch.hpex.optimizers`` cannot be imported.
    """
    key = name.lower()
    if key not in MAPPINGS:
        return None
    params = list(params)
    cls = torch_optimizer_class(key)
    defaults = torch_optimizer_defaults(cls)
    reason = _unsupported(key, options, _groups(params), defaults)
    if reason:
        runtime.log_once(f"optimizer {name!r}: {reason}; using torch.optim.{cls.__name__}")
        return _torch_choice(cls, params, options, reason)
    hpex_class = MAPPINGS[key].hpex_class
    try:
        fused = getattr(importlib.import_module(HPEX_OPTIMIZERS), hpex_class)
    except (ImportError, AttributeError) as exc:
        reason = (
            f"{HPEX_OPTIMIZERS}.{hpex_class} is not available ({type(exc).__name__}: {exc}); "
            "install the Intel Gaudi PyTorch packages for fused optimizers"
        )
        runtime.log_once(f"optimizer {name!r}: {reason}; using torch.optim.{cls.__name__}", logging.WARNING)
        return _torch_choice(cls, params, options, reason)
    kwargs = _fused_kwargs(key, options, defaults)
    implementation = f"{HPEX_OPTIMIZERS}.{hpex_class}"
    if key == "adam":
        implementation += f"(weight_decay={kwargs['weight_decay']}) as Adam"
    converters = optimizer_state.converters(hpex_class, key, options)
    optimizer = fused(params, **kwargs)
    if kwargs.get("moments_dtype") is not None:
        optimizer.register_load_state_dict_post_hook(_restore_moments_dtype)
    return OptimizerChoice(optimizer, implementation, to_canonical=converters["to_canonical"],
                           from_canonical=converters["from_canonical"])


def _restore_moments_dtype(optimizer: torch.optim.Optimizer) -> None:
    """Moments back in FusedAdamW's ``moments_dtype`` after ``load_state_dict`` (torch casts them to the
    parameters' dtype, and FusedAdamW creates them in ``moments_dtype`` only for a fresh state)."""
    dtypes = getattr(optimizer, "get_moment_dtypes", None)
    if dtypes is None:
        return
    for param, state in optimizer.state.items():
        avg_dtype, avg_sq_dtype = dtypes(param.dtype)
        for key, dtype in (("exp_avg", avg_dtype), ("exp_avg_sq", avg_sq_dtype)):
            if isinstance(state.get(key), torch.Tensor) and state[key].dtype != dtype:
                state[key] = state[key].to(dtype)

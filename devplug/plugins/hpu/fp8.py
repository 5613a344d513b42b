"""fp8 training on Gaudi 2 and Gaudi 3 through the Intel Gaudi Transformer Engine, the way Intel documents it.

Intel's recipe (https://docs.habana.ai/en/latest/PyTorch/PyTorch_FP8_Training/index.html): the model's
``nn.Linear`` layers become ``te.Linear`` (``habana_frameworks.torch.hpex.experimental.transformer_engine``), and
the forward runs inside ``te.fp8_autocast(enabled=True, fp8_recipe=recipe.DelayedScaling(...))``. devplug's plan:

- **Which layers**: those whose dimensions are multiples of 16 and large enough for fp8 to pay (the rule the
  CUDA path uses, `devplug.toolkit.pays_off`, measured on H100: no Gaudi measurement is published), except the
  model's output head (its last linear layer: the logits feed the loss, and fp8 frameworks keep it in
  bf16). Device options: ``fp8_small_layers=True`` swaps every layer with dimensions divisible by 16;
  ``fp8_head=True`` swaps the head too; ``fp8_skip`` names layers (substrings; a list, or one
  name as a string) never swapped.
- **How**: each chosen layer is replaced in place by a ``te.Linear`` built without its own weights
  (``skip_weight_param_allocation=True``) that takes over the layer's ``weight`` and ``bias`` parameters, as
  optimum-habana does: the parameters (and any optimizer state built on them) are the same objects, under the
  same names.
- **Recipe**: ``DelayedScaling`` with Intel's defaults and the HYBRID format (E4M3 forward, E5M2 backward):
  ``margin=0``, ``interval=1``, ``amax_history_len=1``, ``amax_compute_algo="most_recent"``. The device option
  ``fp8_recipe`` (a mapping of those fields; ``fp8_format`` as ``"hybrid"`` or ``"e5m2"``) changes them.
- **Context**: ``te.fp8_autocast`` inside ``torch.autocast("hpu", torch.bfloat16)`` around forward and loss, so
  the layers TE does not cover compute in bf16 (as optimum-habana's ``FP8ContextWrapper`` nests them).
- **Checkpoints** stay in the canonical layout: a ``te.Linear`` adds an ``_extra_state`` entry (its fp8 scaling
  meta, pickled into a tensor) to ``state_dict()``; the swapped layers leave it out when saving and load without
  it, so an fp8 checkpoint loads into a bf16 run and back, and no checkpoint carries a pickle. A resumed fp8 run
  starts its scaling afresh: the amax history refills within ``amax_history_len`` steps.
- First-generation Gaudi has no fp8: a one-line `PrecisionError` naming the hardware that has it.

Lazy and eager mode are the same to TE (the bridge runs its fp8 tests in both), and the optimizer and its
state are untouched: TE keeps the weights as they are and makes fp8 copies per step.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch

from devplug import Device, PrecisionError, PrecisionPlan
from devplug.plugins.hpu import data
from devplug.toolkit import fp8_plan, fp8_skip_names, fp8_unavailable, log_once, pays_off

TE_MODULE = "habana_frameworks.torch.hpex.experimental.transformer_engine"
#: Intel's ``DelayedScaling`` defaults, with the HYBRID format (E4M3 forward, E5M2 backward).
RECIPE_DEFAULTS: dict[str, Any] = {"fp8_format": "hybrid", "margin": 0, "interval": 1, "amax_history_len": 1,
                                   "amax_compute_algo": "most_recent"}
RECIPE_FIELDS = (*RECIPE_DEFAULTS, "reduce_amax")
EXTRA_STATE = torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX


def transformer_engine() -> ModuleType:
    """Intel's Transformer Engine; a one-line `PrecisionError` when the installed Gaudi software lacks it."""
    try:
        return importlib.import_module(TE_MODULE)
    except ImportError as exc:
        raise PrecisionError(
            f"precision 'fp8-mixed' on Gaudi trains through the Intel Gaudi Transformer Engine ({TE_MODULE}), which "
            f"the installed Intel Gaudi software lacks ({exc}); install release 1.14 or newer, or use "
            "precision='bf16-mixed'") from None


def fp8_recipe(te: ModuleType, options: Any) -> Any:
    """``recipe.DelayedScaling`` from `RECIPE_DEFAULTS` updated with the ``fp8_recipe`` device option."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise PrecisionError(f"device option fp8_recipe={options!r}: give a mapping of "
                             f"{', '.join(RECIPE_FIELDS)}")
    unknown = sorted(set(options) - set(RECIPE_FIELDS))
    if unknown:
        raise PrecisionError(f"unknown fp8_recipe field(s) {', '.join(map(str, unknown))}; use "
                             f"{', '.join(RECIPE_FIELDS)}")
    fields = {**RECIPE_DEFAULTS, **options}
    name = str(fields["fp8_format"]).upper()
    fmt = getattr(te.recipe.Format, name, None)
    if fmt is None:
        raise PrecisionError(f"fp8_recipe fp8_format={fields['fp8_format']!r} is not a Gaudi fp8 format; use "
                             "'hybrid' (E4M3 forward, E5M2 backward) or 'e5m2'")
    try:
        return te.recipe.DelayedScaling(**{**fields, "fp8_format": fmt})
    except (AssertionError, TypeError, ValueError) as exc:
        raise PrecisionError(f"Intel's Transformer Engine refuses fp8_recipe {dict(options)!r}: "
                             f"{' '.join(str(exc).split()) or type(exc).__name__}") from None


def _divisible(layer: torch.nn.Linear) -> bool:
    return not layer.weight.shape[0] % 16 and not layer.weight.shape[1] % 16


def layer_filter(*, small_layers: bool, head: bool, skip: Sequence[str]) -> Callable[[torch.nn.Module],
                                                                                     Callable[[torch.nn.Linear, str],
                                                                                              bool]]:
    """For a model, the test that says whether its linear layer at a path is swapped for ``te.Linear``."""

    def for_model(model: torch.nn.Module) -> Callable[[torch.nn.Linear, str], bool]:
        linears = [name for name, m in model.named_modules() if type(m) is torch.nn.Linear]
        last = linears[-1] if linears and not head else None

        def wanted(layer: torch.nn.Linear, path: str) -> bool:
            if path == last or any(name in path for name in skip):
                return False
            return _divisible(layer) if small_layers else pays_off(layer, path, "tensorwise")

        return wanted

    return for_model


def _drop_extra_state(module: torch.nn.Module, state: dict[str, Any], prefix: str, local: Any) -> None:
    state.pop(prefix + EXTRA_STATE, None)


def _no_extra_state(module: torch.nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
    state[prefix + EXTRA_STATE] = None  # the canonical layout has none; TE's set_extra_state(None) restores nothing


def swap_linears(model: torch.nn.Module, te: ModuleType, wanted: Callable[[torch.nn.Linear, str], bool]) -> list[str]:
    """Replace ``model``'s wanted ``nn.Linear`` layers by ``te.Linear`` holding the same parameters; their paths."""
    swapped: dict[int, torch.nn.Module] = {}
    paths = []
    for parent_path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            path = f"{parent_path}.{name}" if parent_path else name
            if id(child) in swapped:  # one layer registered twice stays one layer
                setattr(parent, name, swapped[id(child)])
                continue
            if type(child) is not torch.nn.Linear or not wanted(child, path):
                continue
            layer = te.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                              params_dtype=child.weight.dtype, skip_weight_param_allocation=True)
            layer.weight = child.weight
            if child.bias is not None:
                layer.bias = child.bias
            layer.train(child.training)
            layer.register_state_dict_post_hook(_drop_extra_state)
            layer.register_load_state_dict_pre_hook(_no_extra_state)
            setattr(parent, name, layer)
            swapped[id(child)] = layer
            paths.append(path)
    return paths


def plan_fp8(device: Device) -> PrecisionPlan:
    """``"fp8-mixed"`` on Gaudi 2/3 through Intel's Transformer Engine (see the module docstring); Gaudi 1 refused."""
    if data._generation() == "gaudi":
        raise fp8_unavailable("first-generation Gaudi (Gaudi 1)")
    te = transformer_engine()
    check = getattr(getattr(te, "fp8", None), "is_fp8_available", None)  # (available, reason), as Lightning asks
    available, reason = check() if callable(check) else (True, "")
    if not available:
        raise fp8_unavailable(f"this Gaudi ({' '.join(str(reason).split())})")
    options = device.options
    recipe = fp8_recipe(te, options.get("fp8_recipe"))
    choose = layer_filter(small_layers=bool(options.get("fp8_small_layers", False)),
                          head=bool(options.get("fp8_head", False)), skip=fp8_skip_names(options.get("fp8_skip")))

    def convert(module: torch.nn.Module) -> torch.nn.Module:
        linears = sum(type(m) is torch.nn.Linear for m in module.modules())
        swapped = swap_linears(module, te, choose(module))
        if linears and not swapped:
            log_once(f"precision 'fp8-mixed': none of the {linears} linear layer(s) of {type(module).__name__} is "
                     "large enough for fp8 to pay (or they are the output head), so it trains in bf16; "
                     "device_options={'fp8_small_layers': True} swaps every layer with dimensions divisible by 16",
                     logging.WARNING)
        else:
            log_once(f"precision 'fp8-mixed': {len(swapped)} of the {linears} linear layer(s) of "
                     f"{type(module).__name__} run in fp8 (te.Linear)")
        return module

    def context() -> Any:
        return te.fp8_autocast(enabled=True, fp8_recipe=recipe)

    fmt = recipe.fp8_format.name
    text = (f"Intel Gaudi Transformer Engine: te.Linear layers inside te.fp8_autocast (DelayedScaling {fmt}, "
            f"margin {recipe.margin}, interval {recipe.interval}, amax history {recipe.amax_history_len} "
            f"{recipe.amax_compute_algo}); the output head and layers too small for fp8 to pay stay in bf16, "
            "bfloat16 autocast elsewhere")
    return fp8_plan(device, convert, text, context=context)

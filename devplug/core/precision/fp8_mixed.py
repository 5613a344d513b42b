"""``"fp8-mixed"``: the linear layers multiply in fp8 (torchao's float8 training; on Gaudi, Intel's Transformer
Engine, built by the Gaudi plugin), the rest in bfloat16 autocast.

A device plugin parameterises it: the recipe (``"tensorwise"`` or ``"rowwise"`` scaling), whether FSDP
gathers weights in fp8, whether the fp8 matrix multiplies are emulated (in higher precision, for tests and
the conformance kit on a CPU), and whether layers too small for fp8 to pay are kept in bfloat16. A device
without fp8 matrix units refuses the setting with `fp8_unavailable`, which names the hardware that has them.

The weights stay ordinary float32 parameters of ``nn.Linear`` subclasses, so checkpoints keep the canonical
layout: an fp8 run resumes in bf16 and back. torchao is an optional extra (``pip install 'devplug[fp8]'``),
imported only when a plan converts a module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from devplug.core.errors import PrecisionError
from devplug.core.precision.base import Precision, PrecisionParams, PrecisionPlan

NAME = "fp8-mixed"
#: The recipes torchao's float8 training offers that devplug passes on (``Float8LinearConfig.from_recipe_name``).
RECIPES = ("tensorwise", "rowwise")
#: Who sells fp8 matrix units that devplug drives, for the refusal on every other device.
FP8_HARDWARE = ("NVIDIA GPUs of compute capability 8.9 or newer (Ada: L4, L40S; Hopper: H100, H200; Blackwell) "
                "with torchao, or Intel Gaudi 2 and Gaudi 3")


def fp8_skip_names(value: Any) -> tuple[str, ...]:
    """The ``fp8_skip`` device option as layer names: one name (a string) or a list of them (``None``: none).

    Anything else is a one-line `PrecisionError` (a string is one name, never its letters).
    """
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(name, str) for name in value):
        return tuple(value)
    raise PrecisionError(f"device option fp8_skip={value!r}: give a layer name or a list of them, e.g. ['head']")


def fp8_unavailable(where: str, hint: str = "") -> PrecisionError:
    """The one-line refusal for a device without fp8 matrix units: ``where`` says which device it is, ``hint``
    (optional) what else the device offers."""
    return PrecisionError(f"precision {NAME!r} needs fp8 matrix units, which {where} lacks: they are on "
                          f"{FP8_HARDWARE}; use precision='bf16-mixed' here{'; ' + hint if hint else ''}")


def pays_off(module: torch.nn.Module, fqn: str, recipe: str, skip: Sequence[str] = ()) -> bool:
    """Whether converting the linear layer ``module`` (at ``fqn``) to fp8 is worth it on an H100-class GPU.

    fp8 tensor cores need both dimensions divisible by 16; below the sizes torchao's benchmarks show a
    speed-up for (torchao's float8 README, "Performance", measured on H100), the casts cost more than the
    fp8 matrix multiply saves, so those layers stay in bfloat16. ``skip`` names layers (substrings of
    their names) never converted, e.g. the output head.
    """
    if not isinstance(module, torch.nn.Linear) or any(name in fqn for name in skip):
        return False
    n, k = module.weight.shape  # out_features, in_features
    if n % 16 or k % 16:
        return False
    if recipe == "rowwise":
        return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))
    return not (k <= 4096 and n <= 1024)


def float8_conversion(*, recipe: str = "tensorwise", emulate: bool = False, fp8_all_gather: bool = False,
                      small_layers: bool = False, skip: Sequence[str] = ()) -> Callable[[torch.nn.Module],
                                                                                            torch.nn.Module]:
    """A ``convert_module`` that swaps a model's linear layers for torchao's ``Float8Linear``, in place.

    ``recipe``: torchao's scaling recipe; ``emulate``: fp8 matrix multiplies computed in higher precision
    (any device, no speed-up); ``fp8_all_gather``: FSDP2 gathers the weights in fp8 (tensorwise only; pass it
    only where FSDP shards the weights: elsewhere torchao's gathering wrapper only puts every op on the weights,
    the optimizer's included, through its ``__torch_dispatch__``);
    ``small_layers``: convert every layer with dimensions divisible by 16, not only those where fp8 pays
    (`pays_off`); ``skip``: names of layers never converted. torchao missing is a one-line ``PrecisionError``.
    """
    if recipe not in RECIPES:
        raise PrecisionError(f"fp8 recipe {recipe!r} is not one of {', '.join(RECIPES)}")

    def convert(module: torch.nn.Module) -> torch.nn.Module:
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # type: ignore[import-untyped]  # torchao ships no py.typed
        except ImportError:
            raise PrecisionError(f"precision {NAME!r} trains through torchao's float8 training, which is not "
                                 "installed: pip install 'devplug[fp8]'") from None
        config = Float8LinearConfig.from_recipe_name(recipe)
        config = _replace(config, emulate=emulate,
                          enable_fsdp_float8_all_gather=fp8_all_gather and recipe == "tensorwise")

        def wanted(layer: torch.nn.Module, fqn: str) -> bool:
            if small_layers:
                return (isinstance(layer, torch.nn.Linear) and not any(name in fqn for name in skip)
                        and not layer.weight.shape[0] % 16 and not layer.weight.shape[1] % 16)
            return pays_off(layer, fqn, recipe, skip)

        return convert_to_float8_training(module, config=config, module_filter_fn=wanted)

    return convert


def _replace(config: object, **changes: object) -> object:
    import dataclasses

    return dataclasses.replace(config, **changes)  # type: ignore[type-var]


def converted_layers(module: torch.nn.Module) -> int:
    """How many of ``module``'s layers multiply in fp8 (torchao ``Float8Linear``)."""
    return sum(type(m).__name__ == "Float8Linear" for m in module.modules())


class Fp8Mixed(Precision):
    """fp8 matrix multiplies in the layers a device plugin's ``convert_module`` swaps, bfloat16 autocast elsewhere.

    The plan needs the device's conversion (``PrecisionParams.convert_module``, e.g. `float8_conversion`): a
    device that gives none has no fp8 path, and the plan is the one-line refusal of `fp8_unavailable`. A
    device whose fp8 layers also need a context around the forward (``PrecisionParams.forward_context``, e.g.
    Intel Gaudi's ``te.fp8_autocast``) gets it entered inside the bfloat16 autocast.
    """

    name = NAME
    compute_dtype = torch.bfloat16
    needs_scaler = False
    scaler_reason = ("fp8 scales each tensor itself (dynamic or delayed scaling); the rest runs in bfloat16, which "
                     "needs none")
    summary = ("fp8 matrix multiplies in the linear layers (torchao float8 training on NVIDIA GPUs, Intel's "
               "Transformer Engine on Gaudi 2/3), bfloat16 autocast elsewhere")

    def plan(self, params: PrecisionParams) -> PrecisionPlan:
        """The plan with the device's fp8 conversion; `fp8_unavailable` when the device gives none."""
        if params.convert_module is None:
            raise fp8_unavailable(f"device type {params.device_type!r}")
        kind, inner = params.device_type, params.forward_context

        def autocast() -> contextlib.AbstractContextManager[None]:
            return torch.autocast(device_type=kind, dtype=torch.bfloat16) if inner is None else _nested(kind, inner)

        return PrecisionPlan(name=self.name, autocast=autocast, convert_module=params.convert_module,
                             optimizer_step_context=params.optimizer_step_context,
                             description=self.describe(self.summary, params))


@contextlib.contextmanager
def _nested(kind: str, inner: Callable[[], contextlib.AbstractContextManager[Any]]) -> Iterator[None]:
    """bfloat16 autocast with the device's fp8 context inside it (as optimum-habana enters Intel's)."""
    with torch.autocast(device_type=kind, dtype=torch.bfloat16), inner():
        yield


PRECISION = Fp8Mixed()

"""Check of ``devplug_precision``: every precision setting gets a consistent plan, or a clear refusal."""

from __future__ import annotations

import math

import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import PrecisionPlan
from devplug.core.errors import PrecisionError
from devplug.core.precision import registry
from devplug.core.precision.fp8_mixed import NAME as FP8
from devplug.testing.kit import DeviceUnderTest, conformance_check


@conformance_check("devplug_precision", over="precisions")
def check_precision(dut: DeviceUnderTest, precision: str) -> str:
    """``devplug_precision`` returns a consistent plan, or refuses a mixed setting with ``PrecisionError``.

    ``"auto"`` and ``"32-true"`` must always work. A grad scaler belongs only to a precision that needs one
    (``"16-mixed"``, or a registered precision that says so); the autocast context, the optional
    optimizer-step context and module conversion must all work.
    """
    hooks = dut.hooks
    try:
        plan = hooks(hookspecs.devplug_precision, precision=precision, strategy="none")
    except PrecisionError as exc:
        if precision in ("auto", "32-true"):
            raise dut.fail(f"refused precision {precision!r} ({exc}); every device must run it") from exc
        if not str(exc).strip():
            raise dut.fail(f"refused precision {precision!r} with an empty PrecisionError message") from exc
        if precision == FP8 and "fp8" not in str(exc).lower():
            raise dut.fail(f"refused {FP8!r} without saying why in terms of fp8 ({exc}); say which hardware has "
                           "fp8 (devplug.toolkit.fp8_unavailable does)") from exc
        return f"refuses {precision}: {exc}"
    except Exception as exc:
        raise dut.fail(
            f"devplug_precision({precision!r}) raised {type(exc).__name__}: {exc}; raise devplug.PrecisionError "
            "for a setting the device cannot run"
        ) from exc
    if not isinstance(plan, PrecisionPlan):
        raise dut.fail(f"devplug_precision({precision!r}) returned {plan!r}, not a devplug.PrecisionPlan")
    if not plan.name or plan.name == "auto":
        raise dut.fail(f"devplug_precision({precision!r}) did not resolve the setting (plan name {plan.name!r})")
    if precision != "auto" and plan.name != precision:
        raise dut.fail(f"asked for {precision!r}, the plan says {plan.name!r}; raise PrecisionError instead")
    if plan.scaler is not None:
        precision_of_plan = registry.find(plan.name)
        if precision_of_plan is None or not precision_of_plan.needs_scaler:
            scaled = ", ".join(name for name in registry.names() if registry.get(name).needs_scaler)
            raise dut.fail(f"the {plan.name} plan has a grad scaler; a scaler belongs only to {scaled} (the "
                           "precisions that need one)")
        needed = ("scale", "step", "update", "state_dict", "load_state_dict")
        missing = [m for m in needed if not hasattr(plan.scaler, m)]
        if missing:
            raise dut.fail(f"the grad scaler lacks {', '.join(missing)} (use torch.amp.GradScaler or alike)")
    module: torch.nn.Module = torch.nn.Linear(4, 2)
    if plan.convert_module is not None:
        converted = plan.convert_module(module)
        module = converted if converted is not None else module
        if not isinstance(module, torch.nn.Module):
            raise dut.fail(f"the {plan.name} plan's convert_module returned {type(module).__name__}, not a module")
    module = hooks(hookspecs.devplug_to_device, obj=module)
    x = hooks(hookspecs.devplug_to_device, obj=torch.ones(3, 4))
    try:
        with plan.autocast():
            out = module(x)
            loss = out.float().pow(2).mean()
    except Exception as exc:
        raise dut.fail(f"the {plan.name} plan's autocast context failed: {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(float(loss.detach().cpu())):
        raise dut.fail(f"a forward pass under the {plan.name} plan's autocast gave {float(loss)}")
    if plan.optimizer_step_context is not None:
        try:
            with plan.optimizer_step_context():
                pass
        except Exception as exc:
            raise dut.fail(
                f"the {plan.name} plan's optimizer_step_context failed: {type(exc).__name__}: {exc}"
            ) from exc
    if plan.name == FP8:
        check_fp8(dut, plan)
    return f"{precision} -> {plan.name}" + (f": {plan.description}" if plan.description else "")


def check_fp8(dut: DeviceUnderTest, plan: PrecisionPlan) -> None:
    """An ``"fp8-mixed"`` plan converts the linear layers of a model large enough for fp8 to pay (built on the meta
    device: nothing is allocated) and keeps its parameter names and state-dict entries, so checkpoints stay
    canonical (an fp8 checkpoint loads into a bf16 run and back).

    A plan may keep the model's last layer (its output head) as it was; the first layer must change type.
    """
    if plan.convert_module is None:
        raise dut.fail("the fp8-mixed plan converts no module: fp8 training needs its linear layers replaced")
    width = 4096  # above the sizes where fp8 pays, whatever the recipe (see devplug.toolkit.pays_off)
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 2 * width))
    names = [name for name, _ in model.named_parameters()]
    entries = list(model.state_dict())
    converted = plan.convert_module(model) or model
    if [name for name, _ in converted.named_parameters()] != names:
        raise dut.fail("the fp8-mixed plan's conversion renamed parameters, so checkpoints leave the canonical layout")
    added = [key for key in converted.state_dict() if key not in entries]
    if added:
        raise dut.fail(f"the fp8-mixed plan's conversion adds {', '.join(added)} to the model's state_dict(), so a "
                       "bf16 run cannot load its checkpoints: leave fp8 scaling state out of the saved layout")
    if type(dict(converted.named_modules()).get("0")) is torch.nn.Linear:
        raise dut.fail(f"the fp8-mixed plan left a {width}x{width} linear layer as it was: nothing runs in fp8")

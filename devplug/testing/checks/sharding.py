"""Check of ``devplug_sharding``: a coherent sharding plan for every precision, or a one-line refusal."""

from __future__ import annotations

import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import SHARDED_OPTIMIZER_KERNELS, ShardingPlan
from devplug.core.errors import PrecisionError
from devplug.testing.kit import DeviceUnderTest, conformance_check

_LOW = (torch.bfloat16, torch.float16)


@conformance_check("devplug_sharding", over="precisions")
def check_sharding(dut: DeviceUnderTest, precision: str) -> str:
    """``devplug_sharding`` returns a `ShardingPlan` whose fields agree with each other and the precision.

    A refusal is one line naming the device; a plan for ``"32-true"`` gathers and reduces in fp32; low-precision
    dtypes appear only for mixed settings; gradients are never reduced in a lower precision than parameters
    are gathered in; the optimizer kernel is one torch.optim has and comes with its reason.
    """
    hooks = dut.hooks
    try:
        resolved = hooks(hookspecs.devplug_precision, precision=precision, strategy="fsdp")
    except PrecisionError:
        return f"{precision} refused by devplug_precision: nothing to shard at it"
    if resolved is None:
        raise dut.fail(f"devplug_precision({precision!r}) gave no plan (the core fallback always answers)")
    name = resolved.name
    plan = hooks(hookspecs.devplug_sharding, precision=name)
    if plan is None:
        return f"{name}: no plan (the core's fallback decides)"
    if not isinstance(plan, ShardingPlan):
        raise dut.fail(f"devplug_sharding({name!r}) returned {plan!r}, not a devplug.ShardingPlan")
    if not plan.supported:
        lines = plan.reason.strip().splitlines()
        if len(lines) != 1 or dut.device.name not in lines[0]:
            raise dut.fail(f"a refusal must be one line naming the device {dut.device.name!r} and what to use "
                           f"instead, got {plan.reason!r}")
        return f"{name}: cannot shard ({lines[0]})"
    if name == "32-true" and (plan.param_dtype in _LOW or plan.reduce_dtype in _LOW):
        raise dut.fail(f"the 32-true plan gathers in {plan.param_dtype} and reduces in {plan.reduce_dtype}; "
                       "fp32 training keeps both in fp32 (None)")
    if plan.param_dtype is not None and plan.reduce_dtype is not None:
        if torch.finfo(plan.reduce_dtype).bits < torch.finfo(plan.param_dtype).bits:
            raise dut.fail(f"gradients reduced in {plan.reduce_dtype}, below the {plan.param_dtype} parameters "
                           "are gathered in; reduce in fp32")
    if plan.optimizer_kernel not in SHARDED_OPTIMIZER_KERNELS or not plan.optimizer_reason.strip():
        raise dut.fail(f"optimizer_kernel {plan.optimizer_kernel!r} needs a reason (optimizer_reason)")
    return (f"{name}: gather {plan.param_dtype or 'fp32'}, reduce {plan.reduce_dtype or 'fp32'}, "
            f"{plan.optimizer_kernel} optimizer, offload {'yes' if plan.cpu_offload else 'no'}")

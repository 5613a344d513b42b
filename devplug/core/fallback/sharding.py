"""A device-generic sharding plan: FSDP where torch has a collective backend for the device type.

What the core's fallback answers to ``devplug_sharding`` and what device plugins start from (public as
``devplug.toolkit.torch_sharding_plan``): the ``MixedPrecisionPolicy`` dtypes for a precision, FSDP's
defaults for resharding, and the torch.optim kernel allowed over sharded parameters.
"""

from __future__ import annotations

import torch

from devplug.core.contract.records import Device, ShardingPlan
from devplug.core.fallback import accelerator
from devplug.core.precision import registry


def torch_sharding_plan(device: Device, precision: str, *, optimizer_kernel: str = "foreach",
                        optimizer_reason: str = "", cpu_offload: bool = False,
                        gather_low_precision: bool | None = None, reason: str = "") -> ShardingPlan:
    """FSDP for ``device`` at ``precision``: gradients reduced in fp32, parameters gathered in the precision's dtype.

    ``gather_low_precision`` left as ``None`` gathers in the low-precision dtype except over gloo (the
    CPU's backend, whose collectives are slow in bf16 and lack fp16 reductions): there parameters travel
    in fp32 and autocast computes in low precision. Unsupported where the device type is neither the CPU
    nor a type torch knows a collective backend for.
    """
    kind = device.torch_device.type
    backend = accelerator.collective_backend(kind)
    if kind != "cpu" and backend == accelerator.PORTABLE_BACKEND and not accelerator.is_current_accelerator(kind):
        return ShardingPlan.unsupported(
            f"{device}: torch knows no collective backend for device type {kind!r}, which FSDP's reduce-scatter "
            "needs; train on one process without sharding (strategy='auto')")
    low = registry.gather_dtype(precision)  # None: fp32, the parameters' own dtype
    if gather_low_precision is None:
        gather_low_precision = backend != accelerator.PORTABLE_BACKEND
    param_dtype = low if low is not None and gather_low_precision else None
    kernel_reason = optimizer_reason or f"torch.optim's {optimizer_kernel} kernel runs over DTensor parameters"
    described = reason or (f"FSDP over {backend}: parameters gathered in "
                           f"{str(param_dtype or 'fp32').replace('torch.', '')}, gradients reduced in fp32")
    return ShardingPlan(supported=True, param_dtype=param_dtype, reduce_dtype=torch.float32 if low else None,
                        reshard_after_forward=True, cpu_offload=cpu_offload, optimizer_kernel=optimizer_kernel,
                        optimizer_reason=kernel_reason, reason=described)

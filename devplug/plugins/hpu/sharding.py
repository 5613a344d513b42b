"""FSDP on Gaudi: what Intel documents and what devplug therefore plans.

Intel Gaudi supports PyTorch's FSDP in eager mode, with or without ``torch.compile(backend="hpu_backend")``
(``PT_HPU_LAZY_MODE=0``, the default since release 1.21); lazy mode does not run it. Collectives go through
HCCL; bf16 is Gaudi's native low precision, so parameters are gathered in bf16 and gradients reduced in
fp32. Habana's fused optimizers (``hpex.optimizers.FusedAdamW``) do not take DTensor parameters, so
torch.optim's foreach kernel steps the shards; CPU offload is not offered (not documented for Gaudi).
"""

from __future__ import annotations

import torch

from devplug import Device, ShardingPlan
from devplug.plugins.hpu import mode
from devplug.toolkit import find_precision


def sharding_plan(device: Device, precision: str) -> ShardingPlan:
    """FSDP over HCCL in eager mode; in lazy mode a one-line refusal naming the switch and the alternative."""
    if mode.activate(device).lazy:
        return ShardingPlan.unsupported(
            f"{device}: the Gaudi bridge runs in lazy mode, where FSDP does not run; start the process with "
            f"{mode.ENV_LAZY}=0 (eager mode) to shard, or use strategy='ddp'")
    known = find_precision(precision)
    low = known.gather_dtype if known is not None else None
    gathered = str(low or "their own dtype").replace("torch.", "")
    return ShardingPlan(supported=True, param_dtype=low, reduce_dtype=torch.float32 if low else None,
                        reshard_after_forward=True, cpu_offload=False, optimizer_kernel="foreach",
                        optimizer_reason="torch.optim's foreach kernel over DTensor shards; Habana's FusedAdamW "
                                         "does not take DTensors",
                        reason=f"FSDP over hccl (eager mode): parameters gathered in {gathered}, gradients reduced "
                               "in fp32")

"""Mixed precision on CUDA (AMP) and TF32.

- ``"16-mixed"``: ``torch.autocast("cuda", float16)`` and a ``torch.amp.GradScaler("cuda")``, whose state the
  Trainer saves in checkpoints.
- ``"bf16-mixed"``: ``torch.autocast("cuda", bfloat16)``, no scaler (bf16 has fp32's exponent range).
- ``"auto"``: bf16-mixed on GPUs with native bf16 (Ampere, compute capability 8.0, and newer), else 16-mixed.
- ``"fp8-mixed"``: torchao's float8 training on compute capability 8.9 and newer (`plan_fp8`).
- ``"32-true"``: fp32; on Ampere and newer its matmuls and convolutions use TF32 tensor cores unless the
  device option ``tf32`` is False (see `configure_tf32`).
"""

from __future__ import annotations

import torch

from devplug import Device, PrecisionError, PrecisionPlan
from devplug.toolkit import find_precision, float8_conversion, fp8_plan, fp8_skip_names, fp8_unavailable, precision_plan

#: First compute capability with TF32 and native bf16 tensor cores (Ampere).
AMPERE = (8, 0)


def native_bf16() -> bool:
    """True when the current GPU computes bf16 natively (not emulated); False without a GPU."""
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 has no including_emulation
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def resolve_precision(precision: str, *, bf16: bool | None = None) -> str:
    """``"auto"`` → ``"bf16-mixed"`` when ``bf16`` (default: `native_bf16`), else ``"16-mixed"``."""
    if precision != "auto":
        return precision
    if bf16 is None:
        bf16 = native_bf16()
    return "bf16-mixed" if bf16 else "16-mixed"


#: First compute capability with fp8 tensor cores (Ada Lovelace; Hopper is 9.0).
FP8_CAPABILITY = (8, 9)


#: Said when an fp8 model is trained uncompiled (figures: benchmarks/README.md, the LM on an H200).
FP8_UNCOMPILED = ("fp8-mixed without compile=True runs torchao's fp8 scaling (casts, amax reductions) as separate "
                  "kernels around every matrix multiply: the LM example at width 2048 trained at 0.43x bf16's "
                  "tokens/s uncompiled on an H200, and at 0.98x compiled; compile the model (Trainer(compile=True), "
                  "the LM's --compile)")


def fsdp_shards(strategy: str) -> bool:
    """Whether the strategy named ``strategy`` shards parameters with FSDP (``"fsdp"``, ``"fsdp+tp"``, any name
    with an ``fsdp`` part)."""
    return "fsdp" in strategy.split("+")


def fp8_all_gather(device: Device, strategy: str) -> bool:
    """The device option ``fp8_all_gather``: ``"auto"`` (the default) is on only when ``strategy`` shards with
    FSDP, as torchtitan's float8 converter decides (pytorch/torchtitan, torchtitan/components/quantization/
    float8.py, ``Float8Converter.__init__``: ``parallel_dims.dp_shard_enabled and ...``); ``True``/``False``
    are obeyed. Without FSDP the fp8-gathering weight wrapper only adds a ``__torch_dispatch__`` to every op
    on the weights, the optimizer's included."""
    value = device.options.get("fp8_all_gather", "auto")
    if value == "auto":
        return fsdp_shards(strategy)
    if isinstance(value, bool):
        return value
    raise PrecisionError(f"device option fp8_all_gather={value!r} is not one of 'auto', true, false")


def plan_fp8(device: Device, capability: tuple[int, int], strategy: str = "none") -> PrecisionPlan:
    """``"fp8-mixed"``: torchao's float8 training on compute capability 8.9 and newer, refused on older GPUs.

    Device options: ``fp8_recipe`` (``"tensorwise"``, the default, or ``"rowwise"``); ``fp8_all_gather``
    (`fp8_all_gather`: by default on only where ``strategy`` shards with FSDP, which then gathers the
    tensorwise-scaled weights in fp8, half the bytes of bf16); ``fp8_small_layers`` (default False: layers
    below the sizes where fp8 pays stay in bf16); ``fp8_skip`` (names of layers to keep in bf16, e.g.
    ``["head"]``, or one name as a string).
    """
    if tuple(capability) < FP8_CAPABILITY:
        raise fp8_unavailable(f"this GPU (compute capability {capability[0]}.{capability[1]})")
    recipe = str(device.options.get("fp8_recipe", "tensorwise"))
    gather = fp8_all_gather(device, strategy) and recipe == "tensorwise"
    small = bool(device.options.get("fp8_small_layers", False))
    convert = float8_conversion(recipe=recipe, fp8_all_gather=gather, small_layers=small,
                                skip=fp8_skip_names(device.options.get("fp8_skip")))
    if gather and not fsdp_shards(strategy):
        gathered = f"weights wrapped for FSDP's fp8 gathering (device option fp8_all_gather) under {strategy!r}"
    elif gather:
        gathered = "FSDP gathers the weights in fp8"
    elif fsdp_shards(strategy):
        gathered = "FSDP gathers the weights in its parameter dtype, not fp8"
    else:
        gathered = f"weights not gathered in fp8: strategy {strategy!r} does not shard them"
    layers = ("every layer with dimensions divisible by 16 converted (device option fp8_small_layers)" if small
              else "layers too small for fp8 to pay stay in bf16")
    return fp8_plan(device, convert, f"torchao float8 training ({recipe} scaling; {gathered}; {layers}), "
                                     "bfloat16 autocast elsewhere", uncompiled_note=FP8_UNCOMPILED)


def plan_precision(device: Device, precision: str, *, bf16: bool | None = None,
                   strategy: str = "none") -> PrecisionPlan:
    """The CUDA precision plan for ``precision`` (``"auto"`` resolved as `resolve_precision` says).

    Any registered precision is planned by the precision layer for ``cuda`` (16-mixed with its
    ``GradScaler("cuda")``); the plugin adds what it knows about the GPU as notes. ``"fp8-mixed"`` is
    `plan_fp8`'s, for the run's ``strategy``.
    """
    if precision == "fp8-mixed":
        from devplug.plugins.cuda.probe import compute_capability

        return plan_fp8(device, compute_capability(device.torch_device.index), strategy)
    requested = precision
    name = resolve_precision(precision, bf16=bf16)
    notes = []
    if requested == "auto":
        notes.append("auto: " + ("GPU has native bf16" if name == "bf16-mixed" else "no native bf16 on this GPU"))
    known = find_precision(name)
    dtype = known.compute_dtype if known is not None else None
    if dtype == torch.bfloat16 and requested != "auto":
        native = bf16 if bf16 is not None else (native_bf16() if torch.cuda.is_available() else None)
        if native is False:
            notes.append("bf16 is emulated on GPUs older than Ampere and slow; prefer 16-mixed")
    if dtype == torch.float32 and device.options.get("tf32", True):
        notes.append("TF32 matmul/cuDNN on Ampere and newer")
    return precision_plan(device, name, notes=notes)


def configure_tf32(enabled: bool, capability: tuple[int, int]) -> str:
    """Turn TF32 for fp32 matmuls and cuDNN convolutions on (Ampere and newer) or off; say what was done.

    Uses ``torch.set_float32_matmul_precision`` and ``torch.backends.cudnn.allow_tf32``: recent torch
    raises when these are read after the per-backend ``fp32_precision`` API was used to set them, and
    inductor still reads them, so the long-standing API is the safe one.
    """
    if not enabled:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        return "TF32 off (device option tf32=False)"
    if tuple(capability) < AMPERE:
        return f"TF32 not available (compute capability {capability[0]}.{capability[1]} is older than Ampere)"
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    return "TF32 on for fp32 matmuls and cuDNN convolutions"

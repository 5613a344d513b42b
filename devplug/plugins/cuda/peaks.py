"""Peak dense FLOP/s of current NVIDIA GPUs by name and precision (for MFU).

Figures are NVIDIA's published datasheet numbers for the tensor cores *without* structured sparsity (the
datasheets' "with sparsity" figures halved); ``fp32`` is the non-tensor FP32 rate; ``fp8`` is the FP8 tensor
rate (H100 SXM: 3,958 TFLOP/s with sparsity, 1,979 dense), on Ada, Hopper and Blackwell only. Matching is by
substring of ``torch.cuda.get_device_name()``, most specific first. A GPU not listed reports ``None``
(MFU is then not shown); add it here with its source.
"""

from __future__ import annotations

import torch

from devplug.toolkit import find_precision

TERA = 1e12
#: The peak table's column for each reduced compute dtype.
_FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16"}

#: name substring -> {precision kind: dense peak TFLOP/s}; ``None`` rows stop a shorter name matching.
PEAKS: tuple[tuple[str, dict[str, float] | None], ...] = (
    # NVIDIA HGX B200 datasheet (8 GPUs: 36 PF FP16/BF16 and 18 PF TF32 with sparsity, 600 TF FP32)
    ("B200", {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 SXM's compute (before H200: "GH200" holds "H200")
    ("GH200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): same compute as H100 SXM
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    # NVIDIA H100 Tensor Core GPU datasheet: H100 PCIe, H100 NVL, H100 SXM5
    ("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}),
    ("H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe share the peak)
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("A10G", None),  # AWS's A10G has its own (unpublished by NVIDIA) clocks: not the A10's figures
    # NVIDIA A10 Tensor Core GPU datasheet
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    # NVIDIA L40S datasheet
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0}),
    # NVIDIA L40 datasheet
    ("L40", {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0}),
    # NVIDIA L4 Tensor Core GPU datasheet
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}),
    # NVIDIA V100 Tensor Core GPU datasheet (SXM2 / PCIe); no BF16, no TF32
    ("V100-SXM", {"fp32": 15.7, "fp16": 125.0}),
    ("V100", {"fp32": 14.0, "fp16": 112.0}),
    # NVIDIA T4 Tensor Core GPU datasheet; no BF16, no TF32
    ("T4", {"fp32": 8.1, "fp16": 65.0}),
    # NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090; tensor FP16/BF16 with FP32 accumulate)
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}),
    # NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3090; tensor FP16 with FP32 accumulate)
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0}),
)


def precision_kind(precision: str, tf32: bool) -> str:
    """The number format a plan named ``precision`` multiplies in: fp8, bf16, fp16, tf32 or fp32.

    A registered precision says its compute dtype; another name is read for ``bf16`` / ``fp16`` in it.
    """
    if "fp8" in precision:
        return "fp8"
    known = find_precision(precision)
    if known is not None and known.compute_dtype in _FORMATS:
        return _FORMATS[known.compute_dtype]
    if known is None and "bf16" in precision:
        return "bf16"
    if known is None and "fp16" in precision:
        return "fp16"
    return "tf32" if tf32 else "fp32"


def peak_row(name: str, precision: str, *, tf32: bool | None = None) -> tuple[str, str, float] | None:
    """The datasheet figure for the GPU called ``name`` and ``precision``: (the table's row, the number format
    read, dense peak FLOP/s); ``None`` when not in the table.

    ``tf32``: whether fp32 matmuls use TF32 (by default torch's current setting); a GPU without TF32 gives
    its FP32 figure, and says so.
    """
    if tf32 is None:
        tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    kind = precision_kind(precision, tf32)
    for key, figures in PEAKS:
        if key.lower() in name.lower():
            if figures is None:
                return None
            if kind not in figures and kind == "tf32":
                kind = "fp32"
            value = figures.get(kind)
            return (key, kind, value * TERA) if value is not None else None
    return None


def peak_flops(name: str, precision: str, *, tf32: bool | None = None) -> float | None:
    """Dense peak FLOP/s of the GPU called ``name`` for ``precision``; ``None`` when not in the table."""
    row = peak_row(name, precision, tf32=tf32)
    return row[2] if row is not None else None


def peak_detail(name: str, row: str, kind: str) -> str:
    """How the figure was obtained, in one line: ``"NVIDIA's published H100 figure, bf16 dense tensor core
    (NVIDIA H100 80GB HBM3)"``."""
    units = "fp32 on the CUDA cores" if kind == "fp32" else f"{kind} dense tensor core"
    return f"NVIDIA's published {row} figure, {units} ({name})"

"""Peak BF16 FLOP/s of Intel Gaudi accelerators (for MFU).

Source: Intel, "Intel Gaudi 3 AI Accelerator: Architected for Gen AI Training and Inference" (Hot Chips
2024), product table "Peak Compute (BF16)": Gaudi 60 TFLOPs, Gaudi 2 432 TFLOPs, Gaudi 3 1835 TFLOPs (the
matrix engines; Intel publishes no FP32 matrix figure, so ``"32-true"`` reports ``None``).
"""

from __future__ import annotations

TERA = 1e12

#: Device-name substring (``torch.hpu.get_device_name()``, e.g. ``"GAUDI2"``) -> peak BF16 TFLOP/s, most specific first.
BF16_PEAKS: tuple[tuple[str, float], ...] = (("GAUDI3", 1835.0), ("GAUDI2", 432.0), ("GAUDI", 60.0))


#: Peak FP8 matrix TFLOP/s (same source, "Peak Compute (FP8)"): Gaudi 2 865, Gaudi 3 1835 (its matrix engines run
#: FP8 and BF16 at one rate); first-generation Gaudi has no fp8.
FP8_PEAKS: tuple[tuple[str, float | None], ...] = (("GAUDI3", 1835.0), ("GAUDI2", 865.0), ("GAUDI", None))


def peak_flops(name: str, precision: str) -> float | None:
    """Peak FLOP/s of the Gaudi called ``name`` for a 16-bit or fp8 ``precision`` plan; ``None`` otherwise."""
    if precision.startswith("32"):
        return None
    compact = name.upper().replace(" ", "")
    if "fp8" in precision:
        found = next((tflops for key, tflops in FP8_PEAKS if key in compact), None)
        return found * TERA if found is not None else None
    return next((tflops * TERA for key, tflops in BF16_PEAKS if key in compact), None)

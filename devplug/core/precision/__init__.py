"""Precisions as modules: ``fp8_mixed`` (fp8 matrix multiplies through torchao's float8 training)."""

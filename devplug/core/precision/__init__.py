"""Precisions as objects: one module per precision (``full_32``, ``fp16_mixed``, ``bf16_mixed``), the record a
device's plan is (`base.PrecisionPlan`), and the registry that holds the names (`registry`).

A precision says its compute dtype, whether it needs a grad scaler and why, and how to build its plan from
a device's parameters (`base.PrecisionParams`); a device plugin parameterises it rather than restating it.
Adding a precision is one new module here plus one registration line in `registry`.
"""

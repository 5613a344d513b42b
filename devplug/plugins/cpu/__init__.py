"""Built-in CPU device plugin: torch fused optimizers, bf16 autocast where the CPU has native bf16, gloo.

The hooks live in `.plugin`, which devplug registers directly (nothing is re-exported here).
"""

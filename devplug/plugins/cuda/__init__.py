"""Built-in CUDA device plugin: apex/torch fused optimizers, AMP (fp16 + GradScaler, bf16), TF32, NCCL, DALI.

Modules, one job each: `.probe` (is a GPU usable, and why not), `.optimizers` (apex or torch
fused), `.precision` (AMP plans, TF32), `.dali` (DALI image-folder loader), `.plugin`
(the hook implementations). Neither apex nor DALI is imported when the plugin is registered.

The hooks live in `.plugin`, which devplug registers directly (nothing is re-exported here).
"""

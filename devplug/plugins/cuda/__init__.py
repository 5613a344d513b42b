"""Built-in CUDA device plugin: apex/torch fused optimizers, AMP (fp16 + GradScaler, bf16), TF32, NCCL, DALI.

Modules, one job each: :mod:`.probe` (is a GPU usable, and why not), :mod:`.optimizers` (apex or torch
fused), :mod:`.precision` (AMP plans, TF32), :mod:`.dali` (DALI image-folder loader), :mod:`.plugin`
(the hook implementations). Neither apex nor DALI is imported when the plugin is registered.

The hooks live in :mod:`.plugin`, which devplug registers directly (nothing is re-exported here).
"""

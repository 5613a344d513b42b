"""Built-in CUDA device plugin: apex/torch fused optimizers, AMP (fp16 + GradScaler, bf16), TF32, NCCL, DALI.

Modules, one job each: :mod:`.probe` (is a GPU usable, and why not), :mod:`.optimizers` (apex or torch
fused), :mod:`.precision` (AMP plans, TF32), :mod:`.dali` (DALI image-folder loader), :mod:`.plugin`
(the hook implementations). Neither apex nor DALI is imported when the plugin is registered.
"""

from devplug.plugins.cuda.plugin import (
    devplug_collective_setup,
    devplug_compile,
    devplug_dataloader,
    devplug_device_setup,
    devplug_mark_step,
    devplug_memory_stats,
    devplug_optimizer,
    devplug_precision,
    devplug_region,
    devplug_register_devices,
    devplug_synchronize,
    devplug_to_device,
)

DEVPLUG_CONTRACT = "1.0"

__all__ = [
    "devplug_collective_setup",
    "devplug_compile",
    "devplug_dataloader",
    "devplug_device_setup",
    "devplug_mark_step",
    "devplug_memory_stats",
    "devplug_optimizer",
    "devplug_precision",
    "devplug_region",
    "devplug_register_devices",
    "devplug_synchronize",
    "devplug_to_device",
]

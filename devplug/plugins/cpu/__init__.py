"""Built-in CPU device plugin: torch fused optimizers, bf16 autocast where the CPU has native bf16, gloo."""

from devplug.plugins.cpu.plugin import (
    devplug_collective_setup,
    devplug_memory_stats,
    devplug_optimizer,
    devplug_precision,
    devplug_register_devices,
)

DEVPLUG_CONTRACT = "1.0"

__all__ = [
    "devplug_collective_setup",
    "devplug_memory_stats",
    "devplug_optimizer",
    "devplug_precision",
    "devplug_register_devices",
]

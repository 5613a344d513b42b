"""``Trainer.summary()``: what ran where, and how fast, as one dictionary."""

from __future__ import annotations

from typing import Any


def summarize(trainer: Any) -> dict[str, Any]:
    """Device, precision, optimizer implementations, loaders, steps, throughput and memory of ``trainer``."""
    return {
        "device": str(trainer.device),
        "device_plugin": trainer.device.plugin_name,
        "world_size": trainer.world_size,
        "precision": trainer.precision.name,
        "precision_detail": trainer.precision.description,
        "optimizers": {k: c.implementation for k, c in trainer.optimizers.items()},
        "loaders": [loader.implementation for loader in trainer.loaders],
        "steps": trainer.global_step,
        "epoch": trainer.epoch,
        **trainer.reporter.rates(),
        "memory": trainer.memory_stats(),
    }

"""The Trainer's measurements: synchronize, memory statistics, and ``summary()``, what ran where and how fast."""

from __future__ import annotations

from typing import Any

from devplug.core.contract import hookspecs as spec
from devplug.core.registry.devices import DeviceHooks


def summarize(trainer: Any) -> dict[str, Any]:
    """Device, precision, optimizer implementations, loaders, steps, throughput, efficiency and memory of ``trainer``.

    Throughput and efficiency come from the reporter: ``samples_per_sec``, ``samples_per_hour``, ``data_wait``,
    ``input_bound``, and where known ``flops_per_sample``, ``mfu`` and ``samples_per_dollar``.
    """
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


class MeasureMethods:
    """The measurement methods of :class:`~devplug.Trainer` (a mixin: it uses the Trainer's hooks)."""

    hooks: DeviceHooks

    def synchronize(self) -> None:
        """Wait for queued device work (log points and timing only)."""
        self.hooks(spec.devplug_synchronize)

    def memory_stats(self) -> Any:
        """The device plugin's memory statistics record, or ``None``."""
        return self.hooks(spec.devplug_memory_stats)

    def summary(self) -> dict[str, Any]:
        """Device, precision, optimizers, loaders, throughput, efficiency (MFU, samples per dollar) and memory."""
        return summarize(self)

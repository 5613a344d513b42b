"""Built-in Intel Gaudi (HPU) device plugin.

Lazy-mode ``htcore.mark_step()`` after backward and after each optimizer step (nothing in eager mode,
where ``torch.compile(backend="hpu_backend")`` applies), ``hpex`` ``FusedAdamW``/``FusedSGD``, bf16
autocast or Habana Mixed Precision, HCCL with Habana's DDP defaults, ``HabanaDataLoader`` for image
folders, and ``torch.hpu`` synchronization and memory statistics. Nothing from the Intel Gaudi stack
is imported until a Gaudi device is probed or selected. See ``docs/devices/hpu.md``.

Modules: ``probe`` (availability), ``mode`` (lazy/eager, step marking, compile), ``optimizers``, ``clipping``,
``precision``, ``distributed``, ``data``, ``stats``, ``runtime`` (process-wide state), ``plugin`` (hooks).

The hooks live in `.plugin`, which devplug registers directly (nothing is re-exported here).
"""

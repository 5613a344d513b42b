"""Building blocks for plugin authors, stable for hook contract 1.x.

A device plugin usually differs from plain PyTorch in a few places; these let it reuse the rest:

- `move_to`, `map_tensors` — move modules, tensors and nested batches;
- `autocast_plan` — a precision plan from ``torch.autocast`` and ``torch.amp.GradScaler``;
- `fp8_plan`, `float8_conversion`, `pays_off`, `fp8_unavailable`, `fp8_skip_names` — the ``"fp8-mixed"`` plan
  (torchao's float8 training, a recipe, emulation, which layers pay), the refusal naming fp8 hardware, and
  the ``fp8_skip`` device option read as layer names;
- `precision_plan` — a registered precision's plan, parameterised by the device (scaler, autocast or
  a module conversion, notes for the summary); `autocast_plan` — its short form;
  `precision_named` / `find_precision` / `precision_names` — a registered `Precision` (its compute dtype,
  whether it needs a grad scaler and why, the dtype FSDP gathers in; ``find_precision`` gives ``None``
  for an unregistered name) and the registered names (``"auto"`` aside); `Precision`, `AutocastPrecision`,
  `PrecisionParams` and `register_precision` / `unregister_precision` — a plugin's own precision;
- `TORCH_OPTIMIZERS`, `torch_optimizer_class`, `torch_optimizer_defaults` — standard
  optimizer names, their torch classes and defaults, to map an author's options faithfully onto a
  vendor optimizer;
- `torch_dataloader`, `make_sampler`, `image_transform`, `ImageFolderDataset`,
  `list_images`, `IMAGE_EXTENSIONS`, `load_rgb` — the tuned torch loader to fall back to
  when a faster loader does not apply, and the image pipeline every loader of an ``ImageFolderSource``
  must match (any pixel format to 8-bit RGB, EXIF orientation, reduced-scale JPEG decoding);
  `evaluation_shard`, `EvaluationSampler` — how an evaluation loader (``options.evaluation``)
  splits its dataset over ranks: every sample on exactly one rank, no padding;
- `tune_loader` — the worker processes for the loader options the author left to devplug
  (``LoaderOptions.automatic``), chosen from the device (does compute share the host's cores?) and a
  measurement of the source; ``torch_dataloader(..., compute_competes=...)`` calls it;
  `available_cpus` — the cores this process may run on (its affinity mask), what it counts with;
  `stop_workers` — shut a torch DataLoader iterator's worker processes down now and wait until they are
  gone (torch's own clean-up waits for garbage collection);
- `display_path`, `printable` — file names and messages shown readably (names that are not
  UTF-8 included);
- `process_memory_stats` — the host process's memory figure;
- `measured_matmul_flops` — a device's measured matmul FLOP/s, a peak for MFU where none is published;
  `cached_matmul_flops` — the same, measured once per machine and cached (never on every run's
  critical path); `plain_gemm_flops` — a plain GEMM's rate in a format on a device (cached per
  machine): the achievable rate to put a run's achieved FLOP/s against, next to MFU's peak;
  `cache_dir` — devplug's cache folder (``$DEVPLUG_CACHE_DIR`` relocates it); `read_json_object`,
  `write_json_object` — a JSON file there read (empty when missing or damaged) and written atomically;
  `probe_time_limit` — the seconds a probe may take (``DEVPLUG_PROBE_TIMEOUT``);
- PyTorch's device-generic API, as the core fallback uses it for any device type:
  `device_module`, `current_accelerator_type`, `device_available`, `device_count`,
  `select_device`, `synchronize`, `memory_stats`, `collective_backend`,
  `native_bf16`;
  `fastest_torch_optimizer` / `torch_kernel` (torch's ``fused`` or ``foreach`` kernel where
  the device type has one) and `torch_precision_plan` (``"auto"`` from what torch reports) — the
  fallback's answers, to adjust rather than restate; `groups_kept_on_failure` — around an optimizer
  attempt that may be refused, the author's parameter groups put back for the next one;
- `steps_to_params`, `steps_to_groups`, `native_groups`, `bias_corrected_to_canonical`,
  `momentum_to_canonical`, `momentum_from_canonical` — for an optimizer whose state is not in
  torch.optim's layout: the pieces of its ``OptimizerChoice.to_canonical``/``from_canonical`` converters
  (step counts per group or per parameter, the hyperparameters each side has, fused Adam and SGD layouts);
- `consolidate_checkpoint` — one module's full weights from a sharded checkpoint folder
  (``Trainer(strategy="fsdp").save``) in one file that ``torch.load(weights_only=True)`` reads into a plain module;
  `torch_sharding_plan` — the fallback's FSDP plan for a device and precision, to adjust;
- `remove_stale_temp_files` — delete the temporary files of checkpoint saves whose process is gone
  (``Trainer.save`` does it itself; call it at start to tidy a checkpoint folder at once);
- `write_atomically` — write an output file whole or not at all (a temporary file renamed into place);
- `log_once` — say something (a fallback and its reason) once per process (`forget_logged`
  resets it in tests);
- `environment_changes` — the environment variables a plugin changed while loading (each an
  ``EnvironmentChange``: ``variable``, ``before``, ``after``, ``plugin``, ``distribution``), so a probe
  that finds a variable hiding its device can name the plugin that set it instead of blaming the user;
- `CheckpointFormat`, `register_checkpoint_format` — a checkpoint format of your own (a safetensors file, a
  remote store): a subclass with ``name``, ``save``, ``load`` and ``recognises``, registered once, then
  ``Trainer(checkpoint_format=name)``;
- `Strategy`, `StrategyContext`, `register_strategy` — a training strategy of your own (how modules are
  wrapped, the optimizer over their parameters, clipping, no-sync, its checkpoint format), registered once,
  then ``Trainer(strategy=name)``;
- `builtin_plugin` — a built-in device plugin, to delegate to its hooks (build on ``cpu`` or
  ``generic`` rather than restate it).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports each name on first use
    from devplug.core.checkpoint.diskfull import write_atomically
    from devplug.core.checkpoint.format import CheckpointFormat
    from devplug.core.checkpoint.format import register_format as register_checkpoint_format
    from devplug.core.checkpoint.sharded import consolidate_checkpoint
    from devplug.core.checkpoint.tempfiles import remove_stale_temp_files
    from devplug.core.data.device_loader import stop_workers
    from devplug.core.data.evaluation import EvaluationSampler, evaluation_shard
    from devplug.core.data.images import display_path, load_rgb, printable
    from devplug.core.data.torch_loader import (
        IMAGE_EXTENSIONS,
        ImageFolderDataset,
        image_transform,
        list_images,
        make_sampler,
        torch_dataloader,
    )
    from devplug.core.data.tuning import available_cpus, tune_loader
    from devplug.core.distributed.strategy import Strategy, StrategyContext, register_strategy
    from devplug.core.fallback.accelerator import (
        collective_backend,
        current_accelerator_type,
        device_available,
        device_count,
        device_module,
        memory_stats,
        native_bf16,
        process_memory_stats,
        select_device,
        synchronize,
    )
    from devplug.core.fallback.precision import autocast_plan, fp8_plan, precision_plan, torch_precision_plan
    from devplug.core.fallback.sharding import torch_sharding_plan
    from devplug.core.log_once import forget_logged, log_once
    from devplug.core.observe.flops import cached_matmul_flops, measured_matmul_flops, plain_gemm_flops
    from devplug.core.observe.host_memory import available_host_memory, check_model_fits, human_bytes
    from devplug.core.observe.peak_cache import cache_dir, read_json_object, write_json_object
    from devplug.core.optim.conversion import (
        bias_corrected_to_canonical,
        momentum_from_canonical,
        momentum_to_canonical,
        native_groups,
        steps_to_groups,
        steps_to_params,
    )
    from devplug.core.optim.torch_optimizers import (
        TORCH_OPTIMIZERS,
        fastest_torch_optimizer,
        groups_kept_on_failure,
        torch_kernel,
        torch_optimizer_class,
        torch_optimizer_defaults,
    )
    from devplug.core.precision.autocast import AutocastPrecision
    from devplug.core.precision.base import Precision, PrecisionParams
    from devplug.core.precision.fp8_mixed import float8_conversion, fp8_skip_names, fp8_unavailable, pays_off
    from devplug.core.precision.registry import find as find_precision
    from devplug.core.precision.registry import get as precision_named
    from devplug.core.precision.registry import names as precision_names
    from devplug.core.precision.registry import register as register_precision
    from devplug.core.precision.registry import unregister as unregister_precision
    from devplug.core.registry.bounded import time_limit as probe_time_limit
    from devplug.core.registry.environment import environment_changes
    from devplug.core.tree import map_tensors, move_to

#: Each public name and the module it lives in (with the name it has there, where that differs).
_WHERE: dict[str, str | tuple[str, str]] = {
    "autocast_plan": "devplug.core.fallback.precision",
    "AutocastPrecision": "devplug.core.precision.autocast",
    "available_cpus": "devplug.core.data.tuning",
    "available_host_memory": "devplug.core.observe.host_memory",
    "bias_corrected_to_canonical": "devplug.core.optim.conversion",
    "cache_dir": "devplug.core.observe.peak_cache",
    "read_json_object": "devplug.core.observe.peak_cache",
    "write_json_object": "devplug.core.observe.peak_cache",
    "cached_matmul_flops": "devplug.core.observe.flops",
    "check_model_fits": "devplug.core.observe.host_memory",
    "CheckpointFormat": "devplug.core.checkpoint.format",
    "collective_backend": "devplug.core.fallback.accelerator",
    "consolidate_checkpoint": "devplug.core.checkpoint.sharded",
    "current_accelerator_type": "devplug.core.fallback.accelerator",
    "device_available": "devplug.core.fallback.accelerator",
    "device_count": "devplug.core.fallback.accelerator",
    "device_module": "devplug.core.fallback.accelerator",
    "display_path": "devplug.core.data.images",
    "environment_changes": "devplug.core.registry.environment",
    "evaluation_shard": "devplug.core.data.evaluation",
    "EvaluationSampler": "devplug.core.data.evaluation",
    "fastest_torch_optimizer": "devplug.core.optim.torch_optimizers",
    "find_precision": ("devplug.core.precision.registry", "find"),
    "float8_conversion": "devplug.core.precision.fp8_mixed",
    "forget_logged": "devplug.core.log_once",
    "fp8_plan": "devplug.core.fallback.precision",
    "fp8_skip_names": "devplug.core.precision.fp8_mixed",
    "fp8_unavailable": "devplug.core.precision.fp8_mixed",
    "groups_kept_on_failure": "devplug.core.optim.torch_optimizers",
    "human_bytes": "devplug.core.observe.host_memory",
    "IMAGE_EXTENSIONS": "devplug.core.data.torch_loader",
    "image_transform": "devplug.core.data.torch_loader",
    "ImageFolderDataset": "devplug.core.data.torch_loader",
    "list_images": "devplug.core.data.torch_loader",
    "load_rgb": "devplug.core.data.images",
    "log_once": "devplug.core.log_once",
    "make_sampler": "devplug.core.data.torch_loader",
    "map_tensors": "devplug.core.tree",
    "measured_matmul_flops": "devplug.core.observe.flops",
    "memory_stats": "devplug.core.fallback.accelerator",
    "momentum_from_canonical": "devplug.core.optim.conversion",
    "momentum_to_canonical": "devplug.core.optim.conversion",
    "move_to": "devplug.core.tree",
    "native_bf16": "devplug.core.fallback.accelerator",
    "native_groups": "devplug.core.optim.conversion",
    "pays_off": "devplug.core.precision.fp8_mixed",
    "plain_gemm_flops": "devplug.core.observe.flops",
    "Precision": "devplug.core.precision.base",
    "precision_named": ("devplug.core.precision.registry", "get"),
    "precision_names": ("devplug.core.precision.registry", "names"),
    "precision_plan": "devplug.core.fallback.precision",
    "PrecisionParams": "devplug.core.precision.base",
    "printable": "devplug.core.data.images",
    "probe_time_limit": ("devplug.core.registry.bounded", "time_limit"),
    "process_memory_stats": "devplug.core.fallback.accelerator",
    "register_checkpoint_format": ("devplug.core.checkpoint.format", "register_format"),
    "register_precision": ("devplug.core.precision.registry", "register"),
    "register_strategy": "devplug.core.distributed.strategy",
    "remove_stale_temp_files": "devplug.core.checkpoint.tempfiles",
    "select_device": "devplug.core.fallback.accelerator",
    "steps_to_groups": "devplug.core.optim.conversion",
    "steps_to_params": "devplug.core.optim.conversion",
    "Strategy": "devplug.core.distributed.strategy",
    "StrategyContext": "devplug.core.distributed.strategy",
    "synchronize": "devplug.core.fallback.accelerator",
    "torch_dataloader": "devplug.core.data.torch_loader",
    "torch_kernel": "devplug.core.optim.torch_optimizers",
    "torch_optimizer_class": "devplug.core.optim.torch_optimizers",
    "torch_optimizer_defaults": "devplug.core.optim.torch_optimizers",
    "TORCH_OPTIMIZERS": "devplug.core.optim.torch_optimizers",
    "torch_precision_plan": "devplug.core.fallback.precision",
    "torch_sharding_plan": "devplug.core.fallback.sharding",
    "stop_workers": "devplug.core.data.device_loader",
    "tune_loader": "devplug.core.data.tuning",
    "unregister_precision": ("devplug.core.precision.registry", "unregister"),
    "write_atomically": "devplug.core.checkpoint.diskfull",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it here."""
    if name not in _WHERE:
        raise AttributeError(f"module 'devplug.toolkit' has no attribute {name!r}")
    where = _WHERE[name]
    module, attribute = (where, name) if isinstance(where, str) else where
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (imported or not yet)."""
    return sorted({*globals(), *__all__})


def builtin_plugin(name: str) -> ModuleType:
    """The module of built-in device plugin ``name`` (``"cpu"``, ``"cuda"``, ``"hpu"``, ``"generic"``), to delegate to.

    Its public surface is its ``devplug_*`` hook functions, called with the same arguments the hook
    takes, e.g. ``toolkit.builtin_plugin("cpu").devplug_memory_stats(device=device)``.
    """
    from devplug.core.registry.manager import BUILTIN_PLUGINS

    modules = dict(BUILTIN_PLUGINS)
    if name not in modules:
        raise ValueError(f"no built-in device plugin {name!r}; built-ins: {', '.join(modules)}")
    return importlib.import_module(modules[name])


__all__ = [
    "IMAGE_EXTENSIONS",
    "TORCH_OPTIMIZERS",
    "AutocastPrecision",
    "CheckpointFormat",
    "EvaluationSampler",
    "ImageFolderDataset",
    "Precision",
    "PrecisionParams",
    "Strategy",
    "StrategyContext",
    "autocast_plan",
    "available_cpus",
    "available_host_memory",
    "bias_corrected_to_canonical",
    "builtin_plugin",
    "cache_dir",
    "cached_matmul_flops",
    "check_model_fits",
    "collective_backend",
    "consolidate_checkpoint",
    "current_accelerator_type",
    "device_available",
    "device_count",
    "device_module",
    "display_path",
    "environment_changes",
    "evaluation_shard",
    "fastest_torch_optimizer",
    "find_precision",
    "float8_conversion",
    "forget_logged",
    "fp8_plan",
    "fp8_skip_names",
    "fp8_unavailable",
    "groups_kept_on_failure",
    "human_bytes",
    "image_transform",
    "list_images",
    "load_rgb",
    "log_once",
    "make_sampler",
    "map_tensors",
    "measured_matmul_flops",
    "memory_stats",
    "momentum_from_canonical",
    "momentum_to_canonical",
    "move_to",
    "native_bf16",
    "native_groups",
    "pays_off",
    "plain_gemm_flops",
    "precision_named",
    "precision_names",
    "precision_plan",
    "printable",
    "probe_time_limit",
    "process_memory_stats",
    "read_json_object",
    "register_checkpoint_format",
    "register_precision",
    "register_strategy",
    "remove_stale_temp_files",
    "select_device",
    "steps_to_groups",
    "steps_to_params",
    "stop_workers",
    "synchronize",
    "torch_dataloader",
    "torch_kernel",
    "torch_optimizer_class",
    "torch_optimizer_defaults",
    "torch_precision_plan",
    "torch_sharding_plan",
    "tune_loader",
    "unregister_precision",
    "write_atomically",
    "write_json_object",
]

"""devplug: write a PyTorch training loop once; device plugins make it fast on CPU, CUDA, Gaudi and more.

Public API: `Trainer` and its `TrainerConfig`, the ``hookimpl`` marker for plugins, the
records hooks exchange, the built-in loggers, the errors devplug raises, and `create_plugin_manager` /
`reset_plugin_manager` to choose plugins in code.

Importing this package is cheap: each name is imported when it is first used (``devplug.Trainer``,
``from devplug import Trainer``), so ``devplug --version`` answers without importing torch. No name
imports a vendor stack or TensorBoard.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from devplug._version import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports each name on first use
    from devplug.core.checkpoint.policy import CheckpointPolicy
    from devplug.core.checkpoint.resume import Resumed
    from devplug.core.contract.hookimpl import hookimpl
    from devplug.core.contract.records import (
        CONTRACT_VERSION,
        Availability,
        CollectiveSetup,
        CompilePlan,
        Device,
        DeviceSpec,
        DoctorReport,
        ImageFolderSource,
        LaunchInfo,
        LoaderChoice,
        LoaderOptions,
        LogPoint,
        MemoryStats,
        OptimizerChoice,
        PeakFlops,
        Phase,
        PrecisionPlan,
        ShardingPlan,
        StepMarks,
    )
    from devplug.core.distributed.launch import detect_launch
    from devplug.core.errors import (
        CheckpointError,
        CheckpointMismatchError,
        CheckpointPositionError,
        ConfigError,
        DataError,
        DeviceUnavailableError,
        DevplugError,
        NonFiniteLossError,
        OptimizerError,
        PluginError,
        PrecisionError,
        UnknownDeviceError,
    )
    from devplug.core.loop.binding import ConfigParser, Flag, RunFolder
    from devplug.core.loop.config import TrainerConfig
    from devplug.core.loop.early_stopping import EarlyStopping
    from devplug.core.loop.trainer import Trainer
    from devplug.core.observe.loggers import CSVLogger, JSONLinesLogger, Logger
    from devplug.core.observe.mlflow import MLflowLogger
    from devplug.core.observe.summary import RunSummary
    from devplug.core.observe.tensorboard import TensorBoardLogger
    from devplug.core.observe.throughput import ThroughputMeter
    from devplug.core.observe.wandb import WandbLogger
    from devplug.core.optim.schedules import DECAYS, LR_SCALING_RULES, LRSchedule, scale_lr
    from devplug.core.registry.manager import create_plugin_manager, reset_plugin_manager

#: Each public name and the module it lives in.
_WHERE: dict[str, str] = {
    "Availability": "devplug.core.contract.records",
    "CheckpointError": "devplug.core.errors",
    "CheckpointMismatchError": "devplug.core.errors",
    "CheckpointPositionError": "devplug.core.errors",
    "CheckpointPolicy": "devplug.core.checkpoint.policy",
    "CollectiveSetup": "devplug.core.contract.records",
    "ConfigParser": "devplug.core.loop.binding",
    "ConfigError": "devplug.core.errors",
    "CONTRACT_VERSION": "devplug.core.contract.records",
    "create_plugin_manager": "devplug.core.registry.manager",
    "CSVLogger": "devplug.core.observe.loggers",
    "DataError": "devplug.core.errors",
    "DECAYS": "devplug.core.optim.schedules",
    "detect_launch": "devplug.core.distributed.launch",
    "Device": "devplug.core.contract.records",
    "DeviceSpec": "devplug.core.contract.records",
    "DeviceUnavailableError": "devplug.core.errors",
    "DevplugError": "devplug.core.errors",
    "DoctorReport": "devplug.core.contract.records",
    "EarlyStopping": "devplug.core.loop.early_stopping",
    "Flag": "devplug.core.loop.binding",
    "hookimpl": "devplug.core.contract.hookimpl",
    "ImageFolderSource": "devplug.core.contract.records",
    "JSONLinesLogger": "devplug.core.observe.loggers",
    "LaunchInfo": "devplug.core.contract.records",
    "LoaderChoice": "devplug.core.contract.records",
    "LoaderOptions": "devplug.core.contract.records",
    "Logger": "devplug.core.observe.loggers",
    "LogPoint": "devplug.core.contract.records",
    "LR_SCALING_RULES": "devplug.core.optim.schedules",
    "LRSchedule": "devplug.core.optim.schedules",
    "MemoryStats": "devplug.core.contract.records",
    "MLflowLogger": "devplug.core.observe.mlflow",
    "NonFiniteLossError": "devplug.core.errors",
    "OptimizerChoice": "devplug.core.contract.records",
    "OptimizerError": "devplug.core.errors",
    "PeakFlops": "devplug.core.contract.records",
    "Phase": "devplug.core.contract.records",
    "PluginError": "devplug.core.errors",
    "PrecisionError": "devplug.core.errors",
    "CompilePlan": "devplug.core.contract.records",
    "PrecisionPlan": "devplug.core.contract.records",
    "reset_plugin_manager": "devplug.core.registry.manager",
    "Resumed": "devplug.core.checkpoint.resume",
    "RunFolder": "devplug.core.loop.binding",
    "RunSummary": "devplug.core.observe.summary",
    "scale_lr": "devplug.core.optim.schedules",
    "ShardingPlan": "devplug.core.contract.records",
    "StepMarks": "devplug.core.contract.records",
    "TensorBoardLogger": "devplug.core.observe.tensorboard",
    "ThroughputMeter": "devplug.core.observe.throughput",
    "Trainer": "devplug.core.loop.trainer",
    "TrainerConfig": "devplug.core.loop.config",
    "UnknownDeviceError": "devplug.core.errors",
    "WandbLogger": "devplug.core.observe.wandb",
}
#: The public submodules, importable as attributes too.
_SUBMODULES = ("toolkit", "testing")


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it here."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"devplug.{name}")
    else:
        raise AttributeError(f"module 'devplug' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (imported or not yet)."""
    return sorted({*globals(), *__all__, *_SUBMODULES})


__all__ = [
    "CONTRACT_VERSION",
    "DECAYS",
    "LR_SCALING_RULES",
    "Availability",
    "CSVLogger",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointPolicy",
    "CheckpointPositionError",
    "CollectiveSetup",
    "CompilePlan",
    "ConfigError",
    "ConfigParser",
    "DataError",
    "Device",
    "DeviceSpec",
    "DeviceUnavailableError",
    "DevplugError",
    "DoctorReport",
    "EarlyStopping",
    "Flag",
    "ImageFolderSource",
    "JSONLinesLogger",
    "LRSchedule",
    "LaunchInfo",
    "LoaderChoice",
    "LoaderOptions",
    "LogPoint",
    "Logger",
    "MLflowLogger",
    "MemoryStats",
    "NonFiniteLossError",
    "OptimizerChoice",
    "OptimizerError",
    "PeakFlops",
    "Phase",
    "PluginError",
    "PrecisionError",
    "PrecisionPlan",
    "Resumed",
    "RunFolder",
    "RunSummary",
    "ShardingPlan",
    "StepMarks",
    "TensorBoardLogger",
    "ThroughputMeter",
    "Trainer",
    "TrainerConfig",
    "UnknownDeviceError",
    "WandbLogger",
    "__version__",
    "create_plugin_manager",
    "detect_launch",
    "hookimpl",
    "reset_plugin_manager",
    "scale_lr",
]

"""devplug: write a PyTorch training loop once; device plugins make it fast on CPU, CUDA, Gaudi and more.

Public API: :class:`Trainer` and its :class:`TrainerConfig`, the ``hookimpl`` marker for plugins, the
records hooks exchange, and the errors devplug raises. Importing this package imports torch but no
vendor stack and not TensorBoard.
"""

from devplug._version import __version__
from devplug.core.config import TrainerConfig
from devplug.core.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DeviceUnavailableError,
    DevplugError,
    NonFiniteLossError,
    OptimizerError,
    PluginConflictError,
    PrecisionError,
    UnknownDeviceError,
)
from devplug.core.hookimpl import hookimpl
from devplug.core.records import (
    CONTRACT_VERSION,
    Availability,
    CollectiveSetup,
    Device,
    DeviceSpec,
    ImageFolderSource,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    MemoryStats,
    OptimizerChoice,
    Phase,
    PrecisionPlan,
)
from devplug.core.schedules import LRSchedule, scale_lr
from devplug.core.trainer import Trainer

__all__ = [
    "CONTRACT_VERSION",
    "Availability",
    "CheckpointError",
    "CollectiveSetup",
    "ConfigError",
    "DataError",
    "Device",
    "DeviceSpec",
    "DeviceUnavailableError",
    "DevplugError",
    "ImageFolderSource",
    "LRSchedule",
    "LaunchInfo",
    "LoaderChoice",
    "LoaderOptions",
    "MemoryStats",
    "NonFiniteLossError",
    "OptimizerChoice",
    "OptimizerError",
    "Phase",
    "PluginConflictError",
    "PrecisionError",
    "PrecisionPlan",
    "Trainer",
    "TrainerConfig",
    "UnknownDeviceError",
    "__version__",
    "hookimpl",
    "scale_lr",
]

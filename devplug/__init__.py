"""devplug: write a PyTorch training loop once; device plugins make it fast on CPU, CUDA, Gaudi and more.

Public API: `Trainer` and its `TrainerConfig`, the ``hookimpl`` marker for plugins, the
records hooks exchange, the built-in loggers, the errors devplug raises, and `create_plugin_manager` /
`reset_plugin_manager` to choose plugins in code. Importing this package imports torch but no
vendor stack and not TensorBoard.
"""

from devplug._version import __version__
from devplug.core.checkpoint.policy import CheckpointPolicy
from devplug.core.checkpoint.resume import Resumed
from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import (
    CONTRACT_VERSION,
    Availability,
    CollectiveSetup,
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
)
from devplug.core.distributed.launch import detect_launch
from devplug.core.errors import (
    CheckpointError,
    CheckpointMismatchError,
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
from devplug.core.loop.config import TrainerConfig
from devplug.core.loop.early_stopping import EarlyStopping
from devplug.core.loop.trainer import Trainer
from devplug.core.observe.loggers import CSVLogger, JSONLinesLogger, Logger
from devplug.core.observe.mlflow import MLflowLogger
from devplug.core.observe.summary import RunSummary
from devplug.core.observe.tensorboard import TensorBoardLogger
from devplug.core.observe.wandb import WandbLogger
from devplug.core.optim.schedules import DECAYS, LR_SCALING_RULES, LRSchedule, scale_lr
from devplug.core.registry.manager import create_plugin_manager, reset_plugin_manager

__all__ = [
    "CONTRACT_VERSION",
    "DECAYS",
    "LR_SCALING_RULES",
    "Availability",
    "CSVLogger",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointPolicy",
    "CollectiveSetup",
    "ConfigError",
    "DataError",
    "Device",
    "DeviceSpec",
    "DeviceUnavailableError",
    "DevplugError",
    "DoctorReport",
    "EarlyStopping",
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
    "RunSummary",
    "ShardingPlan",
    "TensorBoardLogger",
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

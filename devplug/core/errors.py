"""Errors devplug raises for bad input. Each message says what was wrong and what to do."""

from __future__ import annotations


class DevplugError(Exception):
    """Base of every error devplug raises on purpose (the CLI prints these as one line)."""


class ConfigError(DevplugError, ValueError):
    """A configuration value is invalid; the message names the field."""


class UnknownDeviceError(DevplugError, ValueError):
    """No plugin serves the requested device name."""


class DeviceUnavailableError(DevplugError, RuntimeError):
    """A plugin serves the device, but it cannot be used on this machine."""


class PluginError(DevplugError, RuntimeError):
    """A plugin broke the hook contract: a wrong answer, or an exception raised inside one of its hooks.

    The message names the plugin, its distribution, the hook and what was expected; the plugin's own
    exception, if any, is chained as ``__cause__``.
    """


class PrecisionError(DevplugError, ValueError):
    """The device cannot run the requested precision."""


class OptimizerError(DevplugError, ValueError):
    """No plugin can build the requested optimizer."""


class CheckpointError(DevplugError, RuntimeError):
    """A checkpoint is missing, corrupt, or does not match what is being restored."""


class CheckpointMismatchError(CheckpointError):
    """A readable checkpoint that belongs to another training setup (other modules, optimizers or shapes)."""


class CheckpointPositionError(CheckpointMismatchError):
    """An intact checkpoint saved inside an epoch whose position in the data this run cannot continue at the same
    sample: another world size or batch size that does not divide the samples read, or a loader that does not
    read devplug's sharded order."""


class NonFiniteLossError(DevplugError, FloatingPointError):
    """A logged value became NaN or infinite."""


class DataError(DevplugError, ValueError):
    """A data source is missing, empty or unreadable."""

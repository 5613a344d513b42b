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


class PluginConflictError(DevplugError, RuntimeError):
    """Two plugins claim the same device name."""


class PrecisionError(DevplugError, ValueError):
    """The device cannot run the requested precision."""


class OptimizerError(DevplugError, ValueError):
    """No plugin can build the requested optimizer."""


class CheckpointError(DevplugError, RuntimeError):
    """A checkpoint is missing, corrupt, or does not match what is being restored."""


class NonFiniteLossError(DevplugError, FloatingPointError):
    """A logged value became NaN or infinite."""


class DataError(DevplugError, ValueError):
    """A data source is missing, empty or unreadable."""

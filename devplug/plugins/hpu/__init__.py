"""Built-in Gaudi (HPU) device plugin (placeholder registration; the full plugin is issue 5)."""

import importlib.util

from devplug.core.hookimpl import hookimpl
from devplug.core.records import Availability, DeviceSpec

DEVPLUG_CONTRACT = "1.0"


def _probe() -> Availability:
    if importlib.util.find_spec("habana_frameworks") is None:
        return Availability.no("habana_frameworks is not installed", "install the Intel Gaudi software stack")
    import habana_frameworks.torch.hpu as hpu

    return Availability.yes() if hpu.is_available() else Availability.no("no Gaudi device found")


@hookimpl
def devplug_register_devices() -> DeviceSpec:
    """Intel Gaudi accelerators."""
    return DeviceSpec(name="hpu", description="Intel Gaudi (HPU)", priority=100, probe=_probe)

"""Built-in CUDA device plugin (placeholder registration; the full plugin is issue 4)."""

import torch

from devplug.core.hookimpl import hookimpl
from devplug.core.records import Availability, DeviceSpec

DEVPLUG_CONTRACT = "1.0"


def _probe() -> Availability:
    if torch.version.cuda is None:
        return Availability.no("this torch build has no CUDA support", "install a CUDA build of torch")
    if not torch.cuda.is_available():
        return Availability.no("no CUDA device or driver found", "install the NVIDIA driver on a machine with a GPU")
    return Availability.yes()


@hookimpl
def devplug_register_devices() -> DeviceSpec:
    """NVIDIA GPUs through CUDA."""
    return DeviceSpec(name="cuda", description="NVIDIA GPU (CUDA)", priority=50, probe=_probe,
                      count=torch.cuda.device_count)

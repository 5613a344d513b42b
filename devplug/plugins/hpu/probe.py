"""Is a Gaudi usable here? The availability probe and the device count.

Nothing from the Intel Gaudi stack is imported when this module is imported or when the device is
registered; the probe imports ``habana_frameworks.torch.hpu`` only when availability is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from devplug import Availability

#: The torch device type HPU tensors live on. The shipped value is "hpu"; the plugin's tests run the
#: plugin on a CPU-backed stand-in of the Intel packages and set it to "cpu" for that purpose only.
TORCH_DEVICE_TYPE = "hpu"

INSTALL_GUIDE = "https://docs.habana.ai/en/latest/Installation_Guide/index.html"
INSTALL_FIX = (
    "install the Intel Gaudi software stack (driver and firmware, then its PyTorch packages, e.g. "
    "`./habanalabs-installer.sh install --type pytorch`) or run in an Intel Gaudi PyTorch container; "
    f"see {INSTALL_GUIDE}"
)
LOAD_FIX = (
    "install the PyTorch build that matches your Intel Gaudi software release (see Intel's support matrix; "
    "lazy mode, PT_HPU_LAZY_MODE=1, needs Intel's own PyTorch build)"
)
NO_DEVICE_FIX = (
    "check that the habanalabs driver is loaded and `hl-smi` lists the cards, that HABANA_VISIBLE_DEVICES or "
    "HABANA_VISIBLE_MODULES do not hide them, and that a container runs with the Habana runtime "
    "(docker run --runtime=habana)"
)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def hpu_module() -> ModuleType:
    """``habana_frameworks.torch.hpu``: the module the bridge also registers as ``torch.hpu``."""
    return importlib.import_module("habana_frameworks.torch.hpu")


def _clean(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().rstrip('.')}"


def probe() -> Availability:
    """Available when ``habana_frameworks.torch`` loads and ``habana_frameworks.torch.hpu.is_available()``.

    Otherwise the reason says which of the three steps failed (not installed, installed but failing
    to load, loaded but no device visible) and the fix says what to do. Never raises.
    """
    if not _installed("habana_frameworks"):
        return Availability.no("habana_frameworks (the Intel Gaudi PyTorch bridge) is not installed", INSTALL_FIX)
    if not _installed("habana_frameworks.torch"):
        return Availability.no(
            "habana_frameworks is installed but not its PyTorch bridge (habana_frameworks.torch)", INSTALL_FIX
        )
    try:
        hpu = hpu_module()
    except Exception as exc:  # the bridge raises AssertionError for a torch it was not built for
        return Availability.no(f"habana_frameworks.torch is installed but failed to load ({_clean(exc)})", LOAD_FIX)
    try:
        available = bool(hpu.is_available())
    except Exception as exc:
        return Availability.no(f"habana_frameworks.torch.hpu.is_available() failed ({_clean(exc)})", NO_DEVICE_FIX)
    if not available:
        return Availability.no("the Intel Gaudi software is installed but no Gaudi device is visible", NO_DEVICE_FIX)
    return Availability.yes()


def device_count() -> int:
    """How many Gaudi devices this process can see (``habana_frameworks.torch.hpu.device_count()``)."""
    return int(hpu_module().device_count())

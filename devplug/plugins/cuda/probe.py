"""Is a CUDA GPU usable here, and if not, why: a CPU-only torch build, no NVIDIA driver, or no device.

Nothing here initialises CUDA when torch already reports a usable GPU; the driver is only asked
directly (``cuInit``) after torch said no, to tell the user which of the reasons applies.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from typing import Any

import torch

from devplug import Availability
from devplug.toolkit import environment_changes

#: Driver API results worth naming (``CUresult`` values from ``cuda.h``).
_CU_ERRORS = {
    3: "the CUDA driver is not initialised",
    34: "only the CUDA stub library (libcuda stub) was found, not a real driver",
    35: "the NVIDIA driver is older than the CUDA runtime torch was built with",
    100: "the NVIDIA driver is installed but sees no CUDA-capable GPU",
    101: "the CUDA device ordinal is invalid",
    803: "the NVIDIA driver and the user-mode CUDA driver do not match (system driver mismatch)",
    804: "this GPU is not supported by the forward-compatibility driver in use",
}

_HIDDEN_VALUES = ("", "-1", "none", "void", "nodevfiles")


def _driver_library_names() -> tuple[str, ...]:
    if sys.platform.startswith("win"):
        return ("nvcuda.dll",)
    if sys.platform == "darwin":
        return ()
    return ("libcuda.so.1", "libcuda.so")


def _load_driver() -> Any:
    """The NVIDIA driver library (``libcuda``) loaded with ctypes, or ``None`` when there is none."""
    for name in _driver_library_names():
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _driver_reason() -> tuple[str, str]:
    """Why the driver offers no GPU, as ``(reason, fix)``; asks ``cuInit`` and ``cuDeviceGetCount``."""
    driver = _load_driver()
    if driver is None:
        return (
            "no NVIDIA driver found (libcuda could not be loaded)",
            "install the NVIDIA driver on a machine with an NVIDIA GPU; `nvidia-smi` should list the GPU",
        )
    try:
        code = int(driver.cuInit(0))
        if code == 0:
            count = ctypes.c_int(0)
            code = int(driver.cuDeviceGetCount(ctypes.byref(count)))
            if code == 0 and count.value == 0:
                code = 100
    except Exception as exc:  # a broken driver library must not break the probe
        return (f"the NVIDIA driver could not be queried ({type(exc).__name__}: {exc})",
                "check the driver installation with `nvidia-smi`")
    if code == 0:
        return ("the NVIDIA driver reports GPUs but torch cannot use them",
                "check that the driver supports the CUDA version of this torch build "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    reason = _CU_ERRORS.get(code, f"the CUDA driver failed to initialise (CUresult {code})")
    fix = "check `nvidia-smi`; update the NVIDIA driver if it is older than the CUDA version of torch"
    if code == 100:
        fix = "run on a machine with an NVIDIA GPU, or check that the container was started with GPU access"
    return reason, fix


def probe() -> Availability:
    """Whether CUDA is usable, and if not the reason and how to fix it. Never raises."""
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return Availability.no(
            f"this torch build ({torch.__version__}) is CPU-only: it has no CUDA support",
            "install a CUDA build of torch (the default Linux x86_64 wheel of torch is one)",
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if available:
        return Availability.yes()
    if visible is not None and visible.strip().lower() in _HIDDEN_VALUES:
        return _hidden(visible)
    reason, fix = _driver_reason()
    torch_says = next((str(w.message).strip() for w in caught if "CUDA" in str(w.message)), "")
    if torch_says:
        reason = f"{reason}; torch says: {torch_says.splitlines()[0]}"
    return Availability.no(reason, fix)


def _hidden(visible: str) -> Availability:
    """GPUs hidden by ``CUDA_VISIBLE_DEVICES``: the user's setting, or a plugin's (then named, not the user)."""
    reason = f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from this process"
    change = environment_changes().get("CUDA_VISIBLE_DEVICES")
    if change is None:
        return Availability.no(reason, "unset CUDA_VISIBLE_DEVICES or list the GPU indices to use")
    was = "it was unset before" if change.before is None else f"it was {change.before!r} before"
    return Availability.no(
        f"{reason}; plugin {change.plugin!r} ({change.distribution}) set it while loading ({was})",
        f"report this to the maintainers of {change.distribution}, or skip that plugin with "
        f"DEVPLUG_BLOCK_PLUGINS={change.plugin}",
    )


def device_count() -> int:
    """How many CUDA devices this process can see (0 when none or when CUDA cannot be used)."""
    try:
        return int(torch.cuda.device_count())
    except Exception:
        return 0


def compute_capability(index: int | None = None) -> tuple[int, int]:
    """Compute capability ``(major, minor)`` of device ``index`` (the current device when ``None``)."""
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)

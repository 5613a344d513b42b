"""What the CUDA plugin tells ``devplug doctor``: its stack, the variables that change CUDA and NCCL, pitfalls.

Read from package metadata and the environment only: no GPU is initialised and no vendor module imported.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os

import torch

from devplug import DoctorReport

#: DALI wheels, one per CUDA major version.
DALI_WHEELS = {"nvidia-dali-cuda110": 11, "nvidia-dali-cuda120": 12, "nvidia-dali-cuda130": 13}
ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE",
       "PYTORCH_CUDA_ALLOC_CONF", "NCCL_*", "TORCH_NCCL_*")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def dali_mismatch() -> list[str]:
    """A DALI wheel built for another CUDA major than torch (it needs a driver for both; one wheel matches)."""
    cuda = torch.version.cuda
    major = int(cuda.split(".")[0]) if cuda else None
    return [f"{wheel} is built for CUDA {wheel_major} and torch for CUDA {cuda}: the driver must serve both; "
            f"nvidia-dali-cuda{major}0 matches torch"
            for wheel, wheel_major in DALI_WHEELS.items()
            if _version(wheel) is not None and major is not None and wheel_major != major]


def incompatible() -> list[str]:
    """Pairs known not to work together, found here: PyPI's ``apex`` where NVIDIA apex is meant."""
    problems = []
    apex = _version("apex")
    if apex is not None and apex.startswith("0.9"):
        problems.append(f"apex {apex} from PyPI is an unrelated package, not NVIDIA apex: pip uninstall apex, "
                        "then build NVIDIA's (README, Vendor extras)")
    return problems


def warnings(environ: dict[str, str] | None = None) -> list[str]:
    """Settings that commonly cost speed or hide GPUs."""
    environ = dict(os.environ) if environ is None else environ
    found = []
    if environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"):
        found.append("CUDA_LAUNCH_BLOCKING is set: every kernel launch waits for the GPU (debugging only, slow)")
    if environ.get("CUDA_VISIBLE_DEVICES") == "":
        found.append("CUDA_VISIBLE_DEVICES is empty: no GPU is visible to this process")
    return found + dali_mismatch()


def report() -> DoctorReport:
    """The CUDA plugin's contribution to ``devplug doctor``."""
    return DoctorReport(
        packages=("apex", *DALI_WHEELS),
        versions={"torch CUDA build": torch.version.cuda or "none (CPU-only torch)"},
        env=ENV, incompatible=incompatible(), warnings=warnings(),
    )

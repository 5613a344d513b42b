"""Which device types the generic plugin declares, and the per-type facts PyTorch documents.

The list depends on the installed torch only, never on the machine's hardware or drivers: the
accelerator types torch has built-in support for (those ``torch.accelerator`` documents: CUDA, XPU,
MPS, MTIA, HPU), every device type in ``torch.distributed.Backend.default_device_backend_map``
(where out-of-tree backends register theirs), the PrivateUse1 backend under its new name when an
out-of-tree extension renamed it (``torch_npu`` renames it ``npu``), and the host CPU. Each is declared
``generic``: a plugin that declares the same name serves it instead, without a conflict.
"""

from __future__ import annotations

import re

import attrs
import torch

#: Accelerator types with built-in support in torch (the types ``torch.accelerator`` documents, besides PrivateUse1).
BUILTIN_ACCELERATORS: tuple[str, ...] = ("cuda", "xpu", "mps", "mtia", "hpu")
#: The host's device type: served generically when the cpu plugin is blocked.
HOST = "cpu"
#: The PrivateUse1 backend's name until an out-of-tree extension renames it.
UNRENAMED_PRIVATEUSE1 = "privateuseone"
#: Priority of a generic accelerator: below every dedicated built-in (cuda 50, hpu 100), above the CPU (0).
ACCELERATOR_PRIORITY = 10
#: Priority of the host CPU served generically (the cpu plugin's own).
HOST_PRIORITY = 0

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@attrs.frozen
class TypeFacts:
    """What devplug knows about a device type from PyTorch's documentation.

    ``label`` names the hardware; ``install`` says how to get a torch that supports it; ``pin_memory``
    is the data loader's default for pinned host memory (PyTorch documents pinning as unsupported on
    MPS, whose memory the CPU and GPU share).
    """

    label: str
    install: str
    pin_memory: bool = True


FACTS: dict[str, TypeFacts] = {
    "cuda": TypeFacts("NVIDIA or AMD GPU (CUDA/ROCm)",
                      "install a CUDA or ROCm build of torch (https://pytorch.org/get-started/locally/)"),
    "xpu": TypeFacts("Intel GPU (XPU)",
                     "install torch's XPU build: pip install torch --index-url https://download.pytorch.org/whl/xpu"),
    "mps": TypeFacts("Apple GPU (Metal Performance Shaders)",
                     "use torch's macOS wheel on Apple silicon with macOS 12.3 or newer", pin_memory=False),
    "mtia": TypeFacts("Meta MTIA accelerator", "install a torch build with MTIA support"),
    "hpu": TypeFacts("Intel Gaudi (HPU)",
                     "install the Intel Gaudi software stack (habana_frameworks), which registers torch.hpu"),
    HOST: TypeFacts("host CPU", "", pin_memory=False),
}


def facts(device_type: str) -> TypeFacts:
    """The facts for ``device_type``; an out-of-tree backend's are generic."""
    return FACTS.get(device_type) or TypeFacts(
        f"{device_type} accelerator (out-of-tree PyTorch backend)",
        f"install the PyTorch extension that provides the {device_type!r} device type (torch_npu for npu, ...)",
    )


def privateuse1_name() -> str | None:
    """The PrivateUse1 backend's name when an extension renamed it (``"npu"``), else ``None``."""
    getter = getattr(torch._C, "_get_privateuse1_backend_name", None)
    if getter is None:
        return None
    name = str(getter())
    return None if name == UNRENAMED_PRIVATEUSE1 else name


def backend_map_types() -> tuple[str, ...]:
    """Device types in ``torch.distributed.Backend.default_device_backend_map`` (none without torch.distributed)."""
    try:
        import torch.distributed as dist

        return tuple(dist.Backend.default_device_backend_map) if dist.is_available() else ()
    except (ImportError, AttributeError):
        return ()


def declared_types() -> tuple[str, ...]:
    """The device types the generic plugin declares, accelerators first, each once, valid device names only."""
    candidates = [*BUILTIN_ACCELERATORS, *backend_map_types(), privateuse1_name() or "", HOST]
    accelerators = [t for t in dict.fromkeys(candidates) if t and t != HOST and _NAME.match(t)]
    return (*accelerators, HOST)


def priority(device_type: str) -> int:
    """``"auto"`` priority of a generic device type: accelerators above the host CPU."""
    return HOST_PRIORITY if device_type == HOST else ACCELERATOR_PRIORITY

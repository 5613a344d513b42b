"""Stand-in for ``habana_frameworks.torch.utils.experimental``: which Gaudi generation is present.

Mirrors HabanaAI/gaudi-pytorch-bridge 1.19, ``python_packages/habana_frameworks/torch/utils/experimental/
__init__.py`` line 42 (``_get_device_type()``) and ``.../experimental/csrc/bindings.cpp`` lines 121-124
(the ``synDeviceType`` enum: ``synDeviceGaudi``, ``synDeviceGaudi2``, ``synDeviceGaudi3``). The
generation comes from ``$HPU_STANDIN_DEVICE_TYPE`` (``gaudi``, ``gaudi2`` or ``gaudi3``; default ``gaudi2``).
"""

from __future__ import annotations

import enum
import os


class synDeviceType(enum.IntEnum):  # the bridge's own name
    """The Gaudi generations the bridge knows (bindings.cpp lines 121-124)."""

    synDeviceGaudi = 1
    synDeviceGaudi2 = 2
    synDeviceGaudi3 = 3


def _get_device_type() -> synDeviceType:
    """The generation of the Gaudi in use (experimental/__init__.py line 42)."""
    name = os.environ.get("HPU_STANDIN_DEVICE_TYPE", "gaudi2")
    return {"gaudi": synDeviceType.synDeviceGaudi, "gaudi2": synDeviceType.synDeviceGaudi2,
            "gaudi3": synDeviceType.synDeviceGaudi3}[name]

"""The devplug conformance kit: checks a device plugin's hooks the way devplug's core uses them.

Plugin authors run it in their own test suite:

    from devplug.testing import DeviceConformance

    class TestMyDevice(DeviceConformance):
        device_name = "mydev"

or without pytest:

    from devplug.testing import run_checks
    for result in iter_checks("mydev"):   # each result as its check finishes (run_checks: all at once)
        print(result)

or from the shell: ``devplug check mydev``.

Inside, ``kit`` holds the machinery (the check registry, the device under test), ``checks`` the checks
(one module per area of the hook contract); ``runner`` runs them (`run_checks`) and
``conformance`` turns them into pytest tests (`DeviceConformance`).

Only test suites import this package (``import devplug`` does not); `DeviceConformance` needs
pytest and is imported on first use, so `run_checks` works without pytest installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devplug.testing.kit import STANDARD_OPTIMIZERS, ConformanceError, DeviceUnderTest, NotApplicable, open_device
from devplug.testing.runner import CheckResult, all_checks, iter_checks, run_checks

if TYPE_CHECKING:
    from devplug.testing.conformance import DeviceConformance

__all__ = [
    "STANDARD_OPTIMIZERS",
    "CheckResult",
    "ConformanceError",
    "DeviceConformance",
    "DeviceUnderTest",
    "NotApplicable",
    "all_checks",
    "iter_checks",
    "open_device",
    "run_checks",
]


def __getattr__(name: str) -> Any:
    if name == "DeviceConformance":
        from devplug.testing.conformance import DeviceConformance

        return DeviceConformance
    raise AttributeError(f"module 'devplug.testing' has no attribute {name!r}")

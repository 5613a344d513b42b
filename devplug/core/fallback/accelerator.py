"""What PyTorch's device-generic API can tell and do for any device type, without naming one.

``torch.accelerator`` (torch 2.6 and newer; memory statistics from 2.8) speaks for the *current*
accelerator, the one torch was built for or an out-of-tree backend registered; for any other device
type the device's own module (``torch.get_device_module(type)``: ``torch.xpu``, ``torch.mps``,
``torch.cpu``, …) answers where it has the function. Collective backends come from
``torch.distributed.Backend.default_device_backend_map``. Each function degrades to "not known" on a
torch that lacks the API: the core fallback uses these, and plugins reach them through
``devplug.toolkit``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import platform
from collections.abc import Callable
from typing import Any

import torch

from devplug.core.contract.records import MemoryStats

log = logging.getLogger("devplug")

#: The backend torch.distributed runs everywhere, for device types its backend map does not list.
PORTABLE_BACKEND = "gloo"


def device_module(device_type: str) -> Any:
    """torch's module for a device type (``torch.xpu`` for ``"xpu"``), or ``None`` when torch has none."""
    try:
        return torch.get_device_module(device_type)
    except (RuntimeError, AttributeError, ValueError):
        return None


def accelerator_api(name: str) -> Callable[..., Any] | None:
    """``torch.accelerator.<name>`` when the installed torch has it, else ``None``."""
    return getattr(getattr(torch, "accelerator", None), name, None)


def current_accelerator_type() -> str | None:
    """The device type of torch's current accelerator (``torch.accelerator.current_accelerator``), or ``None``.

    Answers what torch was built for even where no device is present; availability is the probe's
    business.
    """
    current = accelerator_api("current_accelerator")
    if current is None:
        return None
    try:
        device = current()
    except RuntimeError:
        return None
    return None if device is None else str(device.type)


def is_current_accelerator(device_type: str) -> bool:
    """True when ``device_type`` is torch's current accelerator, so ``torch.accelerator`` speaks for it."""
    return current_accelerator_type() == device_type


def _call_with_device(fn: Callable[..., Any], device: torch.device) -> Any:
    """Call a device-module function with ``device`` where it takes one (``torch.mps.synchronize()`` does not)."""
    return fn(device) if _takes_argument(fn) else fn()


@functools.lru_cache(maxsize=64)
def _takes_argument(fn: Callable[..., Any]) -> bool:
    # asked at every log point (synchronize): a signature is read once per function
    try:
        return bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return True


def synchronize(device: torch.device) -> bool:
    """Wait for the work queued on ``device``; True when torch had a way to wait, False when it had none.

    ``torch.accelerator.synchronize`` for the current accelerator, else the device module's
    ``synchronize`` (``torch.cpu.synchronize`` for host devices).
    """
    if is_current_accelerator(device.type):
        wait = accelerator_api("synchronize")
        if wait is not None:
            wait(device)
            return True
    wait = getattr(device_module(device.type), "synchronize", None)
    if wait is None:
        return False
    _call_with_device(wait, device)
    return True


def _bytes(read: Callable[[], Any]) -> int | None:
    """A memory figure, or ``None`` where the device or this torch cannot report it."""
    try:
        value = read()
    except (RuntimeError, NotImplementedError, AttributeError, TypeError, ValueError, AssertionError) as exc:
        log.debug("memory figure not reported: %s", exc)
        return None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def memory_stats(device: torch.device) -> MemoryStats | None:
    """Allocated, reserved, peak and total bytes of ``device`` from torch's generic API; ``None`` if it has none.

    ``torch.accelerator.memory_allocated`` / ``memory_reserved`` / ``max_memory_allocated`` /
    ``get_memory_info`` for the current accelerator, else the device module's functions of the same
    names (``mem_get_info`` for the total). A figure the device cannot give is ``None``.
    """
    if is_current_accelerator(device.type) and accelerator_api("memory_allocated") is not None:
        source: Any = torch.accelerator
        info = accelerator_api("get_memory_info")
    else:
        source = device_module(device.type)
        info = getattr(source, "mem_get_info", None)
    readers = {
        field: getattr(source, name, None)
        for field, name in (("allocated", "memory_allocated"), ("reserved", "memory_reserved"),
                            ("peak_allocated", "max_memory_allocated"))
    }
    figures = {field: _bytes(functools.partial(fn, device)) if fn is not None else None
               for field, fn in readers.items()}
    total = _bytes(lambda: info(device)[1]) if info is not None else None
    if total is None and not any(v is not None for v in figures.values()):
        return None
    return MemoryStats(total=total, **figures)


def device_available(device_type: str) -> bool | None:
    """Whether torch sees a usable ``device_type`` device; ``None`` where torch cannot say.

    ``torch.accelerator.is_available()`` for the current accelerator, else the device module's
    ``is_available()``.
    """
    if is_current_accelerator(device_type):
        ask = accelerator_api("is_available")
        if ask is not None:
            return bool(ask())
    ask = getattr(device_module(device_type), "is_available", None)
    return bool(ask()) if ask is not None else None


def device_count(device_type: str) -> int:
    """Devices of ``device_type`` this process sees: ``torch.accelerator.device_count`` or the module's count."""
    if is_current_accelerator(device_type) and accelerator_api("device_count") is not None:
        count = accelerator_api("device_count")
    else:
        count = getattr(device_module(device_type), "device_count", None)
    if count is None:
        return 0
    try:
        return int(count())
    except (RuntimeError, AssertionError, ValueError):
        return 0


def select_device(device_type: str, index: int) -> bool:
    """Make device ``index`` of ``device_type`` the current one; True when torch has a way to do it.

    ``torch.accelerator.set_device_index`` for the current accelerator, else the module's ``set_device``.
    """
    if is_current_accelerator(device_type):
        select = accelerator_api("set_device_index")
        if select is not None:
            select(index)
            return True
    select = getattr(device_module(device_type), "set_device", None)
    if select is None:
        return False
    select(index)
    return True


def current_index_carrier(device_type: str) -> Callable[[], None] | None:
    """A function that makes this thread's current device of ``device_type`` current in the thread that calls it.

    The current device is per thread; work done for this thread in another (a bounded hook call) asks it
    first. ``None`` when ``device_type`` is not torch's current accelerator or torch cannot tell its index.
    """
    current = accelerator_api("current_device_index")
    if current is None or not is_current_accelerator(device_type):
        return None
    try:
        index = int(current())
    except (RuntimeError, AssertionError, ValueError):
        return None

    def carry() -> None:
        try:
            if int(current()) != index:
                select_device(device_type, index)
        except (RuntimeError, AssertionError, ValueError):
            pass  # the call itself will say what is wrong with the device

    return carry


def collective_backend(device_type: str) -> str:
    """The torch.distributed backend torch pairs with ``device_type`` (``Backend.default_device_backend_map``).

    gloo for a device type the map does not list, or where torch has no ``torch.distributed``.
    """
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return PORTABLE_BACKEND
        backends = dist.Backend.default_device_backend_map
    except (ImportError, AttributeError):
        return PORTABLE_BACKEND
    return str(backends.get(device_type, PORTABLE_BACKEND))


def native_bf16(device_type: str) -> tuple[bool, str]:
    """Whether ``device_type`` computes bf16 natively, as its torch module reports it, and how that was known.

    Asks ``torch.get_device_module(type).is_bf16_supported`` (with ``including_emulation=False`` where
    the function takes it); a module without it, or one that cannot answer, counts as no.
    """
    module = device_module(device_type)
    ask = getattr(module, "is_bf16_supported", None)
    where = f"torch.{device_type}.is_bf16_supported"
    if ask is None:
        return False, f"torch has no {where}()"
    try:
        emulation = "including_emulation" in inspect.signature(ask).parameters
    except (TypeError, ValueError):
        emulation = False
    try:
        answer = bool(ask(including_emulation=False) if emulation else ask())
    except (RuntimeError, AssertionError) as exc:
        return False, f"{where}() failed ({exc})"
    call = f"{where}({'including_emulation=False' if emulation else ''})"
    return answer, f"{call} is {answer}"


def process_memory_stats() -> MemoryStats:
    """Peak resident memory of this process as the OS reports it (the host's figure for CPU-resident devices)."""
    try:
        import resource

        scale = 1 if platform.system() == "Darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    except (ImportError, OSError):
        peak = None
    return MemoryStats(peak_allocated=peak)

"""Lazy or eager: how the Gaudi bridge executes, and what that means for step marking and compiling.

The bridge picks its mode when it loads, from ``PT_HPU_LAZY_MODE``: ``1`` is lazy mode (ops accumulate
into a graph that ``htcore.mark_step()`` hands to the graph compiler), ``0`` is eager mode, where
``torch.compile(backend="hpu_backend")`` builds the graphs. Lazy was the default before release 1.21;
eager (with torch.compile) is the default since. devplug does not guess: it asks the installed bridge
(``habana_frameworks.torch.utils.internal.is_lazy()``, which applies that release's default), and only
if that function is missing falls back to the variable itself, read with the default of the release
installed. Set the variable before the process starts; the bridge ignores later changes.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
from typing import Any

import torch

from devplug import CompilePlan, Device, Phase
from devplug.plugins.hpu import runtime

ENV_LAZY = "PT_HPU_LAZY_MODE"
#: First release whose bridge defaults to eager mode.
EAGER_DEFAULT_SINCE = (1, 21)


#: The distribution that installs the bridge (``habana_frameworks.torch`` itself has no ``__version__``).
BRIDGE_DISTRIBUTION = "habana-torch-plugin"


def bridge_release() -> tuple[int, int] | None:
    """(major, minor) of the installed bridge from its package metadata, or ``None`` when it is not there."""
    try:
        major, minor = metadata.version(BRIDGE_DISTRIBUTION).split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def lazy_mode() -> bool:
    """True when the bridge in this process runs in lazy mode."""
    try:
        from habana_frameworks.torch.utils.internal import is_lazy
    except ImportError:
        release = bridge_release()
        default = "0" if release is not None and release >= EAGER_DEFAULT_SINCE else "1"
        return os.environ.get(ENV_LAZY, default).strip() != "0"
    return bool(is_lazy())


def activate(device: Device) -> runtime.HpuRuntime:
    """Import ``habana_frameworks.torch.core`` and settle the execution mode (once per process)."""
    rt = runtime.state()
    if rt.htcore is None:
        rt.htcore = importlib.import_module("habana_frameworks.torch.core")
        rt.lazy = lazy_mode()
        runtime.log_once(
            f"Gaudi {device}: {'lazy' if rt.lazy else 'eager'} mode ({ENV_LAZY}="
            f"{os.environ.get(ENV_LAZY, 'unset')})"
        )
    return rt


def mark_step(device: Device, phase: Phase) -> None:
    """``htcore.mark_step()`` in lazy mode (after backward and after each optimizer step); nothing in eager."""
    rt = activate(device)
    if rt.lazy:
        rt.htcore.mark_step()


def compile_plan(device: Device) -> CompilePlan:
    """``hpu_backend`` in eager mode; no compile in lazy mode, whose bridge builds graphs between mark_steps.

    Intel documents eager mode with ``torch.compile(backend="hpu_backend")`` as the default execution path
    and lazy mode as the legacy one (https://docs.habana.ai/en/latest/PyTorch/PyTorch_Gaudi_Theory_of_Operations.html,
    "Execution Modes").
    """
    if activate(device).lazy:
        return CompilePlan(backend=None, reason=(
            f"lazy mode compiles graphs between mark_step calls itself; start with {ENV_LAZY}=0 for eager mode "
            "and torch.compile(backend='hpu_backend')"))
    return CompilePlan(backend="hpu_backend", reason="eager mode: the Gaudi graph compiler through torch.compile")


def compile_module(device: Device, module: torch.nn.Module, options: dict[str, Any]) -> Any:
    """``torch.compile(module, backend="hpu_backend")`` in eager mode; the module unchanged in lazy mode.

    Lazy mode already compiles whole graphs between ``mark_step`` calls, and ``hpu_backend`` is an
    eager-mode feature, so compiling is skipped there with a note saying how to switch.
    """
    if activate(device).lazy:
        runtime.log_once(
            f"torch.compile skipped: the Gaudi bridge runs in lazy mode, which compiles graphs itself; "
            f"start the process with {ENV_LAZY}=0 to use eager mode with torch.compile(backend='hpu_backend')"
        )
        return module
    options = dict(options)
    backend = options.pop("backend", "hpu_backend")
    return torch.compile(module, backend=backend, **options)

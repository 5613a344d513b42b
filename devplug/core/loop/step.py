"""The step's route to the hooks: which per-step hooks a Trainer calls, resolved once.

A CPU step should cost what plain PyTorch costs: hooks that only the core fallback answers (no region, no
``mark_step``) are not called at all, and no context manager is entered for them. `StepRoute`
decides this once per Trainer from who implements each hook.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from devplug.core.contract import hookspecs as spec
from devplug.core.contract.records import Phase
from devplug.core.observe.profiling import StepProfiler
from devplug.core.registry.devices import DeviceHooks

#: Entered where nothing is marked; a nullcontext keeps no state, so one serves every ``with``.
NO_REGION = contextlib.nullcontext()


def parameters_with_grad(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


class StepRoute:
    """The per-step hooks of one Trainer, resolved once: what only the core fallback answers is left out.

    ``region`` and ``mark_step`` run several times per step. Where no device plugin implements them (the
    fallback marks no region; an eager device marks no step), the step neither calls them nor enters a
    context manager for them, so a step costs no more than the author's own loop would.
    """

    def __init__(self, hooks: DeviceHooks, profiler: StepProfiler, fallback: str) -> None:
        self.hooks, self.profiler = hooks, profiler
        # the fallback's region is a nullcontext (no mark); the fallback implements no mark_step
        self.marks_regions = hooks.answered_by(spec.devplug_region) not in ((), (fallback,))
        self.marks_steps = bool(hooks.answered_by(spec.devplug_mark_step))

    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """The device plugin's mark for region ``name``, inside a ``record_function`` range while profiling."""
        if not self.marks_regions:
            return NO_REGION if not self.profiler.active else self.profiler.region(name, NO_REGION)
        mark = self.hooks(spec.devplug_region, name=name)
        return self.profiler.region(name, mark or NO_REGION)

    def region_or_none(self, name: str) -> contextlib.AbstractContextManager[Any] | None:
        """`region` ``name``, or ``None`` when nothing is marked now (the caller then enters no context)."""
        if not self.marks_regions and not self.profiler.active:
            return None
        return self.region(name)

    def may_mark(self) -> bool:
        """False when no region is ever marked: no device plugin marks one and no profiler window is set."""
        return self.marks_regions or self.profiler.window is not None

    def plain(self) -> bool:
        """True when no region is marked now: the step enters no context manager of its own."""
        return not self.marks_regions and not self.profiler.active

    def mark_step(self, phase: Phase) -> None:
        """The lazy-mode step boundary, where the device marks one."""
        if self.marks_steps:
            self.hooks(spec.devplug_mark_step, phase=phase)


class Regioned(contextlib.AbstractContextManager):
    """``region`` around ``inner``, without a generator frame."""

    def __init__(self, region: contextlib.AbstractContextManager[Any], inner: Any) -> None:
        self.region, self.inner = region, inner

    def __enter__(self) -> Any:
        self.region.__enter__()
        try:
            return self.inner.__enter__()
        except BaseException:
            self.region.__exit__(*sys.exc_info())
            raise

    def __exit__(self, *exc: Any) -> bool:
        try:
            suppressed = bool(self.inner.__exit__(*exc))
        finally:
            self.region.__exit__(*exc)
        return suppressed

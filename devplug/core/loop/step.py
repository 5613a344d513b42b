"""The step's route to the hooks: which per-step hooks a Trainer calls, resolved once.

A step should cost what plain PyTorch costs: hooks that mark nothing on this device (the core fallback's
region, the CUDA plugin's region without profiling and its ``mark_step``) are not called at all, and no
context manager is entered for them. `StepRoute` decides this once per Trainer from what each plugin
states it marks (``devplug_step_marks``).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from devplug.core.contract import hookspecs as spec
from devplug.core.contract.records import Phase, StepMarks
from devplug.core.observe.profiling import StepProfiler
from devplug.core.registry.devices import DeviceHooks

#: Entered where nothing is marked; a nullcontext keeps no state, so one serves every ``with``.
NO_REGION = contextlib.nullcontext()
#: What a plugin that does not state its marks is taken to mark: everything it implements.
MARKS_ALL = StepMarks(regions=True, steps=True)


def parameters_with_grad(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


class StepRoute:
    """The per-step hooks of one Trainer, resolved once: what no plugin marks is left out.

    ``region`` and ``mark_step`` run several times per step. Each plugin implementing them states once, through
    ``devplug_step_marks``, whether it marks anything on this device with its options (the core fallback and
    the CUDA plugin without profiling mark nothing); where no plugin does, the step neither calls the hook nor
    enters a context manager for it, so a step costs no more than the author's own loop would. A plugin that
    does not answer ``devplug_step_marks`` is taken to mark what it implements.
    """

    def __init__(self, hooks: DeviceHooks, profiler: StepProfiler, fallback: str) -> None:
        self.hooks, self.profiler = hooks, profiler
        stated = hooks.each_answer(spec.devplug_step_marks)
        stated.setdefault(fallback, StepMarks(regions=False, steps=False))  # its region is a nullcontext

        def marks(hook: Any, what: str) -> bool:
            return any(getattr(stated.get(name) or MARKS_ALL, what) for name in hooks.answered_by(hook))

        self.marks_regions = marks(spec.devplug_region, "regions")
        self.marks_steps = marks(spec.devplug_mark_step, "steps")

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

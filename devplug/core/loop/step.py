"""The training step's pieces on a Trainer: autocast, backward, gradient accumulation, clipping, optimizer step.

With ``accumulate_grad_batches=N`` a step spans N micro-batches: ``backward`` scales the loss by 1/N and
marks a step boundary only on the last micro-batch, ``accumulate(model)`` skips DDP's gradient
all-reduce on the others, ``clip_grad_norm`` and ``step`` act only on the last one. The position of the
current micro-batch comes from the training loader (:class:`~devplug.core.data.position.LoopPosition`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from devplug.core.contract import hookspecs as spec
from devplug.core.contract.records import Phase, PrecisionPlan
from devplug.core.data.position import LoopPosition
from devplug.core.observe.profiling import StepProfiler
from devplug.core.registry.devices import DeviceHooks

#: Entered where nothing is marked; a nullcontext keeps no state, so one serves every ``with``.
NO_REGION = contextlib.nullcontext()


def _parameters_with_grad(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


class StepRoute:
    """The per-step hooks of one Trainer, resolved once: what only the core fallback answers is left out.

    ``region`` and ``mark_step`` run several times per step. Where no device plugin implements them (the
    fallback marks no region; an eager device marks no step), the step neither calls them nor enters a
    context manager for them, so a step costs what the author's own loop would (issue 15's floor).
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
        return self.profiler.region(name, self.hooks(spec.devplug_region, name=name) or NO_REGION)

    def plain(self) -> bool:
        """True when no region is marked now: the step enters no context manager of its own."""
        return not self.marks_regions and not self.profiler.active

    def mark_step(self, phase: Phase) -> None:
        """The lazy-mode step boundary, where the device marks one."""
        if self.marks_steps:
            self.hooks(spec.devplug_mark_step, phase=phase)


class _Regioned(contextlib.AbstractContextManager):
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


class StepMethods:
    """The step methods of :class:`~devplug.Trainer` (a mixin: it uses the Trainer's hooks, plan and position)."""

    hooks: DeviceHooks
    route: StepRoute
    precision: PrecisionPlan
    position: LoopPosition
    profiler: StepProfiler
    scaler: Any

    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A profiler region named ``name`` as the device plugin marks it (NVTX on CUDA when profiling), inside a
        ``record_function`` range in a profiler window (``profile=``)."""
        return self.route.region(name)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for forward and loss: the precision plan's autocast inside a ``"forward"`` region."""
        if self.route.plain():
            return self.precision.autocast()
        return _Regioned(self.route.region("forward"), self.precision.autocast())

    @property
    def sync_gradients(self) -> bool:
        """True on the micro-batch that completes a step (always, without gradient accumulation)."""
        return self.position.sync_now

    def backward(self, loss: torch.Tensor) -> None:
        """Backward (loss scaled by 1/N when accumulating, through the grad scaler), then step marking.

        On a micro-batch that does not complete a step, the lazy-mode step boundary is not marked, so
        a lazy device keeps accumulating one graph until the step's last micro-batch.
        """
        accumulation = self.position.accumulation
        if accumulation > 1:
            loss = loss / accumulation
        scaler = self.scaler
        with self.route.region("backward"):
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if self.position.sync_now:
            self.route.mark_step(Phase.BACKWARD)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Optimizer step (through the scaler), step marking, ``zero_grad(set_to_none=True)``; True if it stepped.

        On a micro-batch that does not complete a step it does nothing and returns False: the gradients
        keep accumulating.
        """
        if not self.position.sync_now:
            return False
        step_context, scaler = self.precision.optimizer_step_context, self.scaler
        with self.route.region("optimizer_step"), (step_context() if step_context else NO_REGION):
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        self.route.mark_step(Phase.OPTIMIZER_STEP)
        optimizer.zero_grad(set_to_none=True)
        return True

    def _unscale(self, optimizer: torch.optim.Optimizer) -> None:
        # torch's GradScaler remembers that this optimizer's gradients are unscaled; its step() then skips
        # unscaling, and a second unscale_ before update() is refused: exactly once per step.
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def clip_grad_norm(self, optimizer: torch.optim.Optimizer, max_norm: float,
                       norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients to a total norm of ``max_norm``; the norm before clipping, on the device.

        Call between ``backward`` and ``step``. With a grad scaler the gradients are unscaled first (once;
        ``step`` does not unscale again), so ``max_norm`` is in the units of the true gradients, and a
        step the scaler skips for inf/NaN gradients is still skipped. The device plugin supplies the
        kernel (Gaudi's fused clip norm). On a micro-batch that does not complete a step (gradient
        accumulation) nothing is clipped and ``None`` is returned. Nothing is read back to the host.
        """
        if not self.position.sync_now:
            return None
        self._unscale(optimizer)
        parameters = _parameters_with_grad(optimizer)
        return self.hooks(spec.devplug_clip_grad_norm, parameters=parameters, max_norm=float(max_norm),
                          norm_type=float(norm_type))

    def clip_grad_value(self, optimizer: torch.optim.Optimizer, clip_value: float) -> bool:
        """Clamp ``optimizer``'s gradients to ``[-clip_value, clip_value]`` (after unscaling); True if it clipped.

        Like :meth:`clip_grad_norm`, it acts only on the micro-batch that completes a step.
        """
        if not self.position.sync_now:
            return False
        self._unscale(optimizer)
        torch.nn.utils.clip_grad_value_(_parameters_with_grad(optimizer), float(clip_value))
        return True

    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module) -> Iterator[None]:
        """Skip DDP's gradient all-reduce inside; a no-op without DDP (prefer :meth:`accumulate`)."""
        sync_off = getattr(module, "no_sync", None)
        with sync_off() if callable(sync_off) else contextlib.nullcontext():
            yield

    @contextlib.contextmanager
    def accumulate(self, *modules: torch.nn.Module) -> Iterator[None]:
        """Gradient accumulation over ``accumulate_grad_batches`` micro-batches, around one micro-batch's work.

        ::

            for x, y in loader:
                with trainer.accumulate(model):
                    with trainer.autocast():
                        loss = criterion(model(x), y)
                    trainer.backward(loss)          # loss / N; marks the step only on the last micro-batch
                    trainer.clip_grad_norm(opt, 1.0)
                    trainer.step(opt)               # steps only on the last micro-batch

        Skips DDP's gradient all-reduce for ``modules`` on the micro-batches that do not complete a step.
        """
        with contextlib.ExitStack() as stack:
            if not self.position.sync_now:
                for module in modules:
                    stack.enter_context(self.no_sync(module))
            yield

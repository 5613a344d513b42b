"""Checks of the hooks the step itself goes through: step marking, gradient clipping, compilation."""

from __future__ import annotations

import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import CompilePlan, Phase, StepMarks
from devplug.testing.kit import DeviceUnderTest, conformance_check


@conformance_check("devplug_mark_step", over="phases")
def check_mark_step(dut: DeviceUnderTest, phase: Phase) -> str:
    """``devplug_mark_step`` accepts ``phase`` (called after backward and after each optimizer step)."""
    hooks = dut.hooks
    model = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(2, 1))
    model(hooks(hookspecs.devplug_to_device, obj=torch.ones(1, 2))).sum().backward()
    try:
        hooks(hookspecs.devplug_mark_step, phase=phase)
    except Exception as exc:
        raise dut.fail(f"devplug_mark_step(phase={phase}) raised {type(exc).__name__}: {exc}") from exc
    return f"mark_step({phase.value}) ok"


@conformance_check("devplug_step_marks", since="1.6")
def check_step_marks(dut: DeviceUnderTest) -> str:
    """``devplug_step_marks`` answers `StepMarks` (or ``None``), the same each time it is asked."""
    ask = dut.hooks.each_answer
    first, again = ask(hookspecs.devplug_step_marks), ask(hookspecs.devplug_step_marks)
    for plugin, marks in first.items():
        if marks is not None and not isinstance(marks, StepMarks):
            raise dut.fail(f"devplug_step_marks of plugin {plugin!r} returned {marks!r}, not devplug.StepMarks")
        if again[plugin] != marks:
            raise dut.fail(f"devplug_step_marks of plugin {plugin!r} answered {marks!r}, then {again[plugin]!r}: "
                           "state what is marked once and for all")
    shown = [f"{plugin}: regions={m.regions}, steps={m.steps}" for plugin, m in first.items() if m is not None]
    return "; ".join(shown) or "nothing stated"


@conformance_check("devplug_clip_grad_norm")
def check_clip_grad_norm(dut: DeviceUnderTest) -> str:
    """``devplug_clip_grad_norm`` clips gradients to ``max_norm`` in place and returns the norm before clipping."""
    hooks = dut.hooks
    model = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(4, 3))
    x = hooks(hookspecs.devplug_to_device, obj=torch.full((2, 4), 10.0))
    model(x).pow(2).sum().backward()
    params = [p for p in model.parameters() if p.grad is not None]
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float().cpu()) for p in params]))
    norm = hooks(hookspecs.devplug_clip_grad_norm, parameters=params, max_norm=1.0, norm_type=2.0)
    if not isinstance(norm, torch.Tensor):
        raise dut.fail(f"devplug_clip_grad_norm returned {norm!r}, not the total norm as a tensor")
    if not torch.allclose(norm.float().cpu().reshape(()), expected, rtol=1e-2):
        raise dut.fail(f"devplug_clip_grad_norm returned norm {float(norm):.4g}, the gradients' norm was "
                       f"{float(expected):.4g}")
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float().cpu()) for p in params]))
    if not clipped <= 1.0 + 1e-2:
        raise dut.fail(f"after devplug_clip_grad_norm(max_norm=1.0) the gradients' norm is {float(clipped):.4g}")
    return f"norm {float(expected):.4g} clipped to {float(clipped):.3g}"


@conformance_check("devplug_compile", options={"run": "run_compiled"})
def check_compile(dut: DeviceUnderTest, *, run: bool = False) -> str:
    """``devplug_compile`` returns a callable module (or ``None``); with ``run=True`` the result is called."""
    hooks = dut.hooks
    module = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(4, 2))
    compiled = hooks(hookspecs.devplug_compile, module=module, options={})
    if compiled is None:
        return "compile: deferred (module used as is)"
    if not callable(compiled):
        raise dut.fail(f"devplug_compile returned {compiled!r}, which cannot be called")
    if run:
        x = hooks(hookspecs.devplug_to_device, obj=torch.ones(3, 4))
        with torch.no_grad():
            expected = module(x)
            got = compiled(x)
        if not torch.allclose(got.float().cpu(), expected.float().cpu(), atol=1e-4, rtol=1e-3):
            raise dut.fail("the compiled module computes something else than the module")
    return f"compile: {type(compiled).__name__}"


@conformance_check("devplug_compile_plan", since="1.7")
def check_compile_plan(dut: DeviceUnderTest) -> str:
    """``devplug_compile_plan`` names a ``torch.compile`` backend torch knows, or says why the device compiles none."""
    plan = dut.hooks(hookspecs.devplug_compile_plan)
    if plan is None:
        return "compile plan: deferred (the core fallback's inductor)"
    if not isinstance(plan, CompilePlan):
        raise dut.fail(f"devplug_compile_plan returned {plan!r}, not a devplug.CompilePlan")
    if plan.backend is None:
        return f"compile plan: no compile ({plan.reason})"
    known = torch._dynamo.list_backends(exclude_tags=())
    if plan.backend not in known:
        raise dut.fail(f"devplug_compile_plan names backend {plan.backend!r}, which torch.compile does not know "
                       f"(registered: {', '.join(sorted(known))}); register it before the plan names it")
    return f"compile plan: {plan.backend}" + (f" {plan.options}" if plan.options else "")

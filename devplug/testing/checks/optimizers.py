"""Check of ``devplug_optimizer``: each standard optimizer builds, honours the author's options and trains.

Whether its state survives a checkpoint is `devplug.testing.checks.state`'s check.
"""

from __future__ import annotations

import math

import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import OptimizerChoice
from devplug.testing.kit import DeviceUnderTest, author_options, conformance_check, toy_regression


@conformance_check("devplug_optimizer", over="optimizer_names")
def check_optimizer(dut: DeviceUnderTest, name: str) -> str:
    """``devplug_optimizer`` builds a working ``torch.optim.Optimizer`` for ``name`` honouring the options."""
    hooks = dut.hooks
    torch.manual_seed(0)
    model = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(4, 1))
    params = list(model.parameters())
    options = author_options(name)
    choice = hooks(hookspecs.devplug_optimizer, name=name, params=params, options=dict(options))
    if not isinstance(choice, OptimizerChoice):
        raise dut.fail(f"devplug_optimizer({name!r}) returned {choice!r}, not a devplug.OptimizerChoice")
    optimizer = choice.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise dut.fail(f"devplug_optimizer({name!r}) built a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    if not isinstance(choice.implementation, str) or not choice.implementation.strip():
        raise dut.fail(f"devplug_optimizer({name!r}) did not name its implementation (OptimizerChoice.implementation)")
    managed = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if managed != {id(p) for p in params}:
        raise dut.fail(f"{choice.implementation} does not optimize exactly the parameters it was given")
    group = optimizer.param_groups[0]
    for key, value in options.items():
        got = group.get(key)
        if got is None or (tuple(got) if isinstance(value, tuple) else got) != value:
            raise dut.fail(f"{choice.implementation} ignored option {key}={value!r} (param group has {got!r})")
    x, y = (hooks(hookspecs.devplug_to_device, obj=t) for t in toy_regression(32))
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(float(loss.detach().cpu()))
        torch.autograd.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0]:
        raise dut.fail(f"{choice.implementation} did not lower a convex toy loss in 5 steps: {losses}")
    return choice.implementation + (f" ({choice.reason})" if choice.reason else "")

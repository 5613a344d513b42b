"""Check of ``devplug_optimizer``'s state: it goes to the canonical form and back, so checkpoints move.

The canonical form is torch.optim's own layout; a vendor optimizer's ``OptimizerChoice`` carries converters
to and from it.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import OptimizerChoice
from devplug.core.errors import CheckpointError
from devplug.core.optim.canonical import canonical_class, export_state, import_state, normalize
from devplug.core.tree import map_tensors
from devplug.testing.kit import DeviceUnderTest, DoesNotApply, author_options, conformance_check, toy_regression

_STEPS = 3


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: tuple[Any, Any], steps: int) -> None:
    x, y = data
    for _ in range(steps):
        torch.autograd.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _torch_reference(name: str, model: torch.nn.Module, options: dict[str, Any]) -> dict[str, Any]:
    """The canonical state torch.optim itself has after the same steps on the CPU."""
    cls = canonical_class(name)
    assert cls is not None
    reference = copy.deepcopy(model).cpu()
    optimizer = cls(reference.parameters(), **options)
    _train(reference, optimizer, toy_regression(32), _STEPS)
    return normalize(optimizer.state_dict(), cls)


def _layout_problem(got: dict[str, Any], want: dict[str, Any]) -> str:
    if got["state"].keys() != want["state"].keys():
        return f"state for parameters {sorted(got['state'])}, torch has {sorted(want['state'])}"
    for index, entry in want["state"].items():
        mine = got["state"][index]
        if mine.keys() != entry.keys():
            return f"parameter {index} has {sorted(mine)}, torch.optim has {sorted(entry)}"
        for key, value in entry.items():
            value_got = mine[key]
            if not isinstance(value_got, torch.Tensor) or value_got.shape != value.shape:
                return f"parameter {index}'s {key} is {value_got!r:.60}, torch.optim's has shape {tuple(value.shape)}"
            if not torch.allclose(value_got.float(), value.float(), rtol=1e-3, atol=1e-5):
                return f"parameter {index}'s {key} differs from torch.optim's after the same {_STEPS} steps"
    return ""


@conformance_check("devplug_optimizer", over="optimizer_names", since="1.1")
def check_optimizer_state(dut: DeviceUnderTest, name: str) -> str:
    """The optimizer's state converts to the canonical form (torch.optim's layout) and back, losing nothing.

    After a few steps, its canonical state has torch.optim's entries for the algorithm, shapes and step
    counts (values close to torch's after the same steps); loaded through the plugin's
    ``from_canonical`` into a fresh optimizer of the same plugin, further steps give the same weights
    as the original's. This is what lets a checkpoint move between devices.
    """
    hooks, options = dut.hooks, author_options(name)
    if canonical_class(name) is None:
        raise DoesNotApply(f"torch.optim has no {name!r}, so there is no canonical layout to convert its state to; "
                            f"checkpoints keep the optimizer's own layout and resume where {name!r} is built the same "
                            "way")

    def build(model: torch.nn.Module) -> OptimizerChoice:
        params = list(model.parameters())
        choice = hooks(hookspecs.devplug_optimizer, name=name, params=params, options=dict(options))
        if not isinstance(choice, OptimizerChoice):
            raise dut.fail(f"devplug_optimizer({name!r}) returned {choice!r}, not a devplug.OptimizerChoice")
        return attrs.evolve(choice, algorithm=name)

    torch.manual_seed(0)
    model = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(4, 1))
    want = _torch_reference(name, model, options)
    data = tuple(hooks(hookspecs.devplug_to_device, obj=t) for t in toy_regression(32))
    choice = build(model)
    _train(model, choice.optimizer, data, _STEPS)
    entry = map_tensors(export_state(choice), lambda t: t.detach().to("cpu", copy=True))  # as a file would
    if entry["layout"] != "canonical":
        raise dut.fail(f"{choice.implementation} ({name}) saves its state in its own layout ({entry['reason']}), so "
                       "checkpoints cannot move to another device; give its OptimizerChoice to_canonical and "
                       "from_canonical converters (docs/plugins.md)")
    problem = _layout_problem(entry["state"], want)
    if problem:
        raise dut.fail(f"{choice.implementation} ({name}): its canonical state is not torch.optim's layout: {problem}")
    twin_model = copy.deepcopy(model)
    twin = build(twin_model)
    try:
        twin.optimizer.load_state_dict(import_state(twin, entry, "conformance"))
    except (CheckpointError, ValueError, KeyError, RuntimeError) as exc:
        raise dut.fail(f"{choice.implementation} ({name}) cannot load its own canonical state: {exc}") from exc
    _train(model, choice.optimizer, data, 2)
    _train(twin_model, twin.optimizer, data, 2)
    for (pname, a), b in zip(model.named_parameters(), twin_model.parameters(), strict=True):
        if not torch.allclose(a.detach().float().cpu(), b.detach().float().cpu(), rtol=1e-6, atol=1e-7):
            raise dut.fail(f"{choice.implementation} ({name}): after a round trip through the canonical state, "
                           f"{pname} differs from the original optimizer's after the same steps")
    return f"{choice.implementation}: canonical state round trip"

"""Counting devplug's own cost per step in Python function calls (deterministic; no clock is read).

The loop an author writes with a Trainer (its loader inside ``epochs()``, ``autocast``, ``backward``,
``step``, ``log`` every step) against the same plain PyTorch loop, both over the same ready batches.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

import devplug
from devplug.core.registry.manager import DevplugPluginManager

STEPS = 60
#: Python calls per step devplug may add to the plain loop (autocast, backward, step, log: one each, plus
#: the loader's batch: drawing, moving through the plugin, counting). It was over 70 before they were trimmed.
BUDGET = 30


class Batches:
    """Ready (inputs, targets) batches: an iterable the Trainer uses as the author's own loader."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def python_calls(run: Callable[[], None]) -> int:
    """Python function calls (and generator resumptions) made while ``run`` runs."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def added_calls_per_step(log_every: int, plugin_manager: DevplugPluginManager | None = None, *, device: str = "cpu",
                         optimizer: dict[str, Any] | None = None,
                         measured: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
                         ) -> float:
    """Python calls per step the devplug loop adds to the same plain PyTorch loop (same batches, same work).

    ``optimizer``: the options of torch's Adam in both loops (the plugin must pick that implementation);
    ``measured``: a context entered around the counted devplug epoch alone (after the warm-up epoch).
    """
    optimizer = {"foreach": False} if optimizer is None else optimizer
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)) for _ in range(STEPS)]
    torch.manual_seed(0)
    plain_model = torch.nn.Linear(8, 8)
    plain_opt = torch.optim.Adam(plain_model.parameters(), lr=0.1, **optimizer)
    kept: list[torch.Tensor] = []

    def plain() -> None:
        for x, y in batches:
            x, y = x.to("cpu"), y.to("cpu")
            loss = torch.nn.functional.mse_loss(plain_model(x), y)
            loss.backward()
            plain_opt.step()
            plain_opt.zero_grad(set_to_none=True)
            kept.append(loss.detach())

    trainer = devplug.Trainer(device=device, precision="32-true", progress=False, log_every=log_every,
                              stop_signals=(), count_flops=False, plugin_manager=plugin_manager)
    torch.manual_seed(0)
    model = trainer.setup(torch.nn.Linear(8, 8))
    opt = trainer.optimizer("adam", model.parameters(), lr=0.1, **optimizer)  # the plain loop's implementation
    loader = trainer.dataloader(Batches(batches))
    epochs = trainer.epochs(10)

    def with_devplug() -> None:
        next(epochs)
        for x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)

    plain(), with_devplug()  # warmed up: one-time work (first optimizer step, first epoch) is not counted
    with measured():
        devplug_calls = python_calls(with_devplug)
    added = (devplug_calls - python_calls(plain)) / STEPS
    epochs.close()
    trainer.close()
    assert torch.equal(model.weight, plain_model.weight)  # the same work was done
    return added

"""The conformance checks, one module per area of the hook contract (plain functions, no pytest needed).

- :mod:`~devplug.testing.checks.registration`: the plugin loads, probes, sets its device up, reports to the doctor;
- :mod:`~devplug.testing.checks.movement`: ``devplug_to_device``;
- :mod:`~devplug.testing.checks.optimizers` and :mod:`~devplug.testing.checks.state`: ``devplug_optimizer``,
  the optimizer and its state's round trip through the canonical form;
- :mod:`~devplug.testing.checks.precision`: ``devplug_precision``;
- :mod:`~devplug.testing.checks.observing`: regions, profiler activities, peak FLOP/s, memory, logging;
- :mod:`~devplug.testing.checks.steps`: step marking, gradient clipping, compilation;
- :mod:`~devplug.testing.checks.collectives`: ``devplug_collective_setup``;
- :mod:`~devplug.testing.checks.data`: ``devplug_dataloader``;
- :mod:`~devplug.testing.checks.sharding`: ``devplug_sharding`` (the plan's fields agree);
- :mod:`~devplug.testing.checks.training`: a Trainer end to end, and its checkpoint.

Importing this package registers every check (:mod:`devplug.testing.kit` holds the registry). The kit
runs them in the contract's order of hooks; checks of the same hook in the order their modules are
imported below (the optimizer builds before its state is checked).
"""

from __future__ import annotations

from devplug.testing.checks import (
    collectives,
    data,
    movement,
    observing,
    optimizers,
    precision,
    registration,
    sharding,
    state,
    steps,
    training,
)
from devplug.testing.kit import registered_checks, uncovered_hooks

__all__ = [
    "collectives",
    "data",
    "movement",
    "observing",
    "optimizers",
    "precision",
    "registered_checks",
    "registration",
    "sharding",
    "state",
    "steps",
    "training",
    "uncovered_hooks",
]

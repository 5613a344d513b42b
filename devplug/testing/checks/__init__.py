"""The conformance checks, one module per area of the hook contract (plain functions, no pytest needed).

- `registration`: the plugin loads, probes, sets its device up, reports to the doctor;
- `movement`: ``devplug_to_device``;
- `optimizers` and `state`: ``devplug_optimizer``,
  the optimizer and its state's round trip through the canonical form;
- `precision`: ``devplug_precision``;
- `observing`: regions, profiler activities, peak FLOP/s, memory, logging;
- `steps`: step marking, gradient clipping, compilation;
- `collectives`: ``devplug_collective_setup``;
- `data`: ``devplug_dataloader``;
- `sharding`: ``devplug_sharding`` (the plan's fields agree);
- `training`: a Trainer end to end, and its checkpoint.

Importing this package registers every check (`devplug.testing.kit` holds the registry). The kit
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

"""devplug's own cost per step, counted in Python function calls (deterministic; no clock is read).

Each call is a few tenths of a µs on a CPU, so a budget in calls keeps the per-step overhead at its floor
without timing anything (``benchmarks/step_overhead.py`` gives the µs). The counting loop is in
``tests/step_cost.py``.
"""

from __future__ import annotations

import contextlib

import pytest
from step_cost import BUDGET, STEPS, added_calls_per_step

import devplug
from devplug.core.registry.manager import create_plugin_manager


class MarksNothing:
    """A device-neutral plugin that answers region and mark_step as no-ops (as the CUDA plugin does without
    profiling), counting the calls; ``stated``: whether it says so through ``devplug_step_marks``."""

    def __init__(self, stated: bool) -> None:
        self.calls = 0
        if stated:
            self.devplug_step_marks = devplug.hookimpl(lambda device: devplug.StepMarks(regions=False, steps=False))

    @devplug.hookimpl
    def devplug_region(self, device: devplug.Device, name: str) -> contextlib.AbstractContextManager[None]:
        self.calls += 1
        return contextlib.nullcontext()

    @devplug.hookimpl
    def devplug_mark_step(self, device: devplug.Device, phase: devplug.Phase) -> None:
        self.calls += 1


@pytest.mark.parametrize("log_every", [10**9, 20], ids=["between-log-points", "with-log-points"])
def test_the_devplug_loop_adds_few_python_calls_per_step_to_the_plain_loop(log_every):
    added = added_calls_per_step(log_every)
    assert added <= BUDGET, f"the devplug loop adds {added:.1f} Python calls per step (budget {BUDGET})"


def test_a_plugin_that_states_it_marks_nothing_costs_nothing_per_step():
    plugin = MarksNothing(stated=True)
    pm = create_plugin_manager(autoload=False, extra_plugins=[("marks-nothing", plugin)])
    added = added_calls_per_step(10**9, pm)
    assert plugin.calls == 0  # neither hook is called in a step
    assert added <= BUDGET, f"with a plugin that marks nothing, {added:.1f} Python calls per step (budget {BUDGET})"


def test_a_plugin_that_does_not_state_its_marks_is_still_called_every_step():
    plugin = MarksNothing(stated=False)  # written before devplug_step_marks: taken to mark what it implements
    added_calls_per_step(10**9, create_plugin_manager(autoload=False, extra_plugins=[("marks-unstated", plugin)]))
    # regions forward, backward, optimizer_step and data_wait, and two step marks, in each step of both epochs
    assert plugin.calls >= 6 * STEPS * 2

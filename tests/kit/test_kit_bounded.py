"""The conformance kit is bounded and streaming: a hanging probe or hook fails its check within the limit
(never PASSED), results come out as each check finishes, and ``--json`` is complete even when a check
raises something other than an ``Exception``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

import devplug
from devplug import cli
from devplug.core.registry import manager
from devplug.testing import all_checks, iter_checks

RELEASE = threading.Event()  # set at teardown: the stuck plugin threads of these tests then end


@pytest.fixture(autouse=True)
def _release_stuck_threads() -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()


class HangingProbe:
    DEVPLUG_CONTRACT = "1.5"

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="hangs", description="a card whose driver query never returns", priority=5,
                                  probe=self.probe, torch_type="cpu")

    def probe(self):
        RELEASE.wait(600)
        raise RuntimeError("released at teardown")


class HangingHook:
    DEVPLUG_CONTRACT = "1.5"

    def __init__(self) -> None:
        self.optimizer_calls = 0

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="stuck", description="moves nothing", priority=5,
                                  probe=devplug.Availability.yes, torch_type="cpu")

    @devplug.hookimpl
    def devplug_to_device(self, device, obj):
        RELEASE.wait(600)
        raise RuntimeError("released at teardown")  # the stuck check's thread ends at once

    @devplug.hookimpl
    def devplug_optimizer(self, device, name, params, options):
        self.optimizer_calls += 1


class Interrupting(BaseException):
    """Not an Exception: what a plugin's runtime may raise (a vendor's abort, a GeneratorExit out of place)."""


class RaisingBase:
    DEVPLUG_CONTRACT = "1.5"

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="aborts", description="aborts on peak queries", priority=5,
                                  probe=devplug.Availability.yes, torch_type="cpu")

    @devplug.hookimpl
    def devplug_peak_flops(self, device, precision):
        raise Interrupting("vendor runtime aborted")


def register(plugin: object, name: str) -> None:
    manager.get_plugin_manager().register(plugin, name)


def test_a_hanging_probe_fails_devplug_check_within_the_limit(monkeypatch, capsys):
    monkeypatch.setenv("DEVPLUG_PROBE_TIMEOUT", "1")
    register(HangingProbe(), "hanging_probe")
    started = time.monotonic()
    code = cli.main(["check", "hangs"])
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == cli.EXIT_FAILED
    assert elapsed < 1 + 8, elapsed  # the probe limit plus a few seconds, not the probe's 600 s
    probe_line = next(line for line in out.splitlines() if line.split()[1:2] == ["probe:"])
    assert probe_line.startswith("FAILED") and "did not answer within 1 s" in probe_line
    assert "PASSED          probe" not in out


def test_a_hook_that_hangs_fails_its_check_naming_the_hook_and_the_run_goes_on(monkeypatch):
    plugin = HangingHook()
    register(plugin, "hanging_hook")
    results = {r.name: r for r in iter_checks("stuck", manager.get_plugin_manager(), time_limit=1,
                                               optimizer_names=["sgd"], precisions=["32-true"])}
    moved = results["to_device"]
    assert moved.outcome == "failed"
    assert "did not finish within 1 s" in moved.detail
    assert "devplug_to_device of plugin 'hanging_hook'" in moved.detail
    assert results["doctor"].outcome == "passed"  # the checks after it ran
    assert len(results) == len(all_checks(optimizer_names=["sgd"], precisions=["32-true"]))


def test_results_come_as_each_check_finishes():
    plugin = HangingHook()
    register(plugin, "hanging_hook")
    checks = iter_checks("stuck", manager.get_plugin_manager(), time_limit=1)
    first = next(checks)
    assert first.name == "plugin_loaded" and first.outcome == "passed"
    assert plugin.optimizer_calls == 0  # the later checks have not run yet
    checks.close()


def test_devplug_check_prints_each_result_before_the_next_check_runs(monkeypatch, capsys):
    printed_before_optimizer: list[str] = []

    class Watching(HangingHook):
        @devplug.hookimpl
        def devplug_to_device(self, device, obj):
            return obj

        @devplug.hookimpl
        def devplug_optimizer(self, device, name, params, options):
            printed_before_optimizer.append(capsys.readouterr().out)

    register(Watching(), "watching")
    cli.main(["check", "stuck"])
    assert printed_before_optimizer and "PASSED          to_device" in printed_before_optimizer[0]


def test_json_is_complete_when_a_check_raises_a_base_exception(capsys):
    register(RaisingBase(), "raising_base")
    code = cli.main(["check", "aborts", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == cli.EXIT_FAILED
    by_name = {r["name"]: r for r in data["results"]}
    assert by_name["peak_flops"]["outcome"] == "failed" and "vendor runtime aborted" in by_name["peak_flops"]["detail"]
    assert by_name["collective_setup"]["outcome"] == "passed"  # checks after the one that raised still ran
    assert len(data["results"]) == len(all_checks())

"""Plugins that hang: probes in priority order, each under a time limit; doctor and the precision plan bounded too."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from paths import REPO

import devplug
from devplug import cli
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager

LIMIT = 0.5


@pytest.fixture
def release():
    """An event every hanging hook of these tests waits on (at most 10 s); set at teardown so no thread lingers."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setenv("DEVPLUG_PROBE_TIMEOUT", str(LIMIT))


def _device_plugin(name: str, priority: int, probe, *, precision=None):
    class Plugin:
        DEVPLUG_CONTRACT = "1.3"

        @devplug.hookimpl
        def devplug_register_devices(self):
            return devplug.DeviceSpec(name=name, description=f"{name} on the CPU", priority=priority, probe=probe,
                                      torch_type="cpu")

    if precision is not None:
        Plugin.devplug_precision = staticmethod(devplug.hookimpl(precision))
    return (name, Plugin())


def _recording_probe(probed: list[str], name: str, available: bool = True):
    def probe():
        probed.append(name)
        return devplug.Availability.yes() if available else devplug.Availability.no(f"no {name} here")

    return probe


def _hanging_probe(release: threading.Event, probed: list[str] | None = None):
    def probe():
        if probed is not None:
            probed.append("sleepy")
        release.wait(10)
        return devplug.Availability.yes()

    return probe


def test_auto_stops_at_the_first_available_device_and_a_named_device_probes_only_itself():
    probed: list[str] = []
    pm = create_plugin_manager(autoload=False, extra_plugins=[
        _device_plugin("top", 300, _recording_probe(probed, "top", available=False)),
        _device_plugin("middle", 200, _recording_probe(probed, "middle")),
        _device_plugin("lower", 150, _recording_probe(probed, "lower")),
    ])
    assert DeviceRegistry(pm).resolve("auto").name == "middle"
    assert probed == ["top", "middle"]  # "lower" (and every built-in) ranks below an available device
    probed.clear()
    assert DeviceRegistry(pm).resolve("lower").name == "lower"
    assert probed == ["lower"]


def test_a_hanging_probe_times_out_naming_the_plugin_and_auto_takes_the_next_device(short_limit, release, caplog):
    pm = create_plugin_manager(autoload=False, extra_plugins=[_device_plugin("sleepy", 500, _hanging_probe(release))])
    start = time.monotonic()
    trainer = devplug.Trainer(device="auto", precision="32-true", progress=False, stop_signals=(), plugin_manager=pm)
    assert time.monotonic() - start < LIMIT + 2
    assert trainer.device.name != "sleepy"
    availability = trainer._registry.devices["sleepy"].availability()
    assert not availability.available
    assert availability.reason == "probe timed out after 0.5 s (plugin 'sleepy' (registered at run time))"
    assert "DEVPLUG_PROBE_TIMEOUT" in availability.fix and "DEVPLUG_BLOCK_PLUGINS=sleepy" in availability.fix
    assert "device 'sleepy' of plugin 'sleepy'" in caplog.text and "did not answer within 0.5 s" in caplog.text


def test_a_named_device_never_probes_a_hanging_one(short_limit, release):
    probed: list[str] = []
    pm = create_plugin_manager(autoload=False,
                               extra_plugins=[_device_plugin("sleepy", 500, _hanging_probe(release, probed))])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=(), plugin_manager=pm)
    assert trainer.device.name == "cpu" and probed == []


def test_a_probe_that_hangs_holds_one_thread_however_many_trainers_ask(short_limit, release):
    probed: list[str] = []
    pm = create_plugin_manager(autoload=False,
                               extra_plugins=[_device_plugin("sleepy", 500, _hanging_probe(release, probed))])
    assert DeviceRegistry(pm).resolve("auto").name == "cpu"
    for _ in range(3):
        registry = DeviceRegistry(pm)
        start = time.monotonic()
        availability = registry.devices["sleepy"].availability()
        assert time.monotonic() - start < LIMIT / 2  # it has been running longer than the limit already
        assert availability.reason.startswith("probe timed out after 0.5 s")
        assert registry.resolve("auto").name == "cpu"
    assert probed == ["sleepy"]


def test_the_time_limit_comes_from_the_environment(monkeypatch):
    from devplug.core.registry.bounded import DEFAULT_TIME_LIMIT, time_limit

    assert time_limit({}) == DEFAULT_TIME_LIMIT
    assert time_limit({"DEVPLUG_PROBE_TIMEOUT": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(devplug.ConfigError, match="DEVPLUG_PROBE_TIMEOUT"):
            time_limit({"DEVPLUG_PROBE_TIMEOUT": bad})


def test_devices_prints_what_finished_and_names_the_probes_that_did_not_within_one_limit(short_limit, release):
    pm = create_plugin_manager(autoload=False, extra_plugins=[
        _device_plugin("sleepy", 500, _hanging_probe(release)),
        _device_plugin("drowsy", 400, _hanging_probe(release)),
    ])
    start = time.monotonic()
    out = cli.devices_report(pm, verbose=True)
    assert time.monotonic() - start < LIMIT + 1.5  # the probes run at once: two hanging ones cost one limit
    lines = out.splitlines()
    assert any(line.split()[:3] == ["cpu", "0", "available"] for line in lines)
    assert any(line.split()[:3] == ["sleepy", "500", "unavailable"] for line in lines)
    for name in ("sleepy", "drowsy"):  # verbose: the device's description, then why it is unavailable
        at = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}: "))
        assert lines[at] == f"  {name}: {name} on the CPU"
        assert lines[at + 1].startswith(
            f"      unavailable: probe timed out after 0.5 s (plugin {name!r} (registered at run time)). Fix: ")
    assert "'auto' selects: cpu" in out


def test_doctor_names_a_doctor_hook_that_hangs_and_reports_the_rest(short_limit, release):
    class Stuck:
        DEVPLUG_CONTRACT = "1.3"

        @devplug.hookimpl
        def devplug_doctor(self):
            release.wait(10)
            return devplug.DoctorReport(warnings=("too late",))

    pm = create_plugin_manager(autoload=False, extra_plugins=[("stuck", Stuck()),
                                                              _device_plugin("sleepy", 500, _hanging_probe(release))])
    start = time.monotonic()
    out = cli.doctor_report(pm)
    assert time.monotonic() - start < LIMIT + 1.5  # probes and doctor hooks share one limit
    assert ("[stuck] its doctor hook did not answer within 0.5 s and was left out (plugin 'stuck' from registered "
            "at run time; DEVPLUG_PROBE_TIMEOUT sets the limit)") in out
    assert "too late" not in out
    assert "  sleepy: unavailable: probe timed out after 0.5 s" in out
    assert "  cpu: available" in out and "torch" in out


def test_a_precision_hook_that_hangs_fails_the_trainer_naming_the_plugin(short_limit, release):
    def hanging_precision(device, precision):
        release.wait(10)

    pm = create_plugin_manager(autoload=False, extra_plugins=[
        _device_plugin("slowprec", -5, devplug.Availability.yes, precision=hanging_precision)])
    start = time.monotonic()
    with pytest.raises(devplug.PluginError) as caught:
        devplug.Trainer(device="slowprec", precision="32-true", progress=False, stop_signals=(), plugin_manager=pm)
    assert time.monotonic() - start < LIMIT + 2
    assert str(caught.value).startswith("devplug_precision of plugin 'slowprec' (registered at run time) did not "
                                        "answer within 0.5 s (DEVPLUG_PROBE_TIMEOUT sets the limit)")


def test_a_precision_hook_that_answers_in_time_is_used_as_before(short_limit):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=(),
                              plugin_manager=create_plugin_manager(autoload=False))
    assert trainer.precision.name == "32-true"

    def refusing_precision(device, precision):
        raise devplug.PrecisionError("fp16 is not for this device")

    pm = create_plugin_manager(autoload=False, extra_plugins=[
        _device_plugin("refuses", -5, devplug.Availability.yes, precision=refusing_precision)])
    with pytest.raises(devplug.PrecisionError, match="not for this device"):  # the contract's own errors pass
        devplug.Trainer(device="refuses", precision="16-mixed", progress=False, stop_signals=(), plugin_manager=pm)


SLEEPY_DISTRIBUTION = """
import time

import devplug

DEVPLUG_CONTRACT = "1.3"


def probe():
    time.sleep(60)
    return devplug.Availability.yes()


@devplug.hookimpl
def devplug_register_devices():
    return devplug.DeviceSpec(name="sleepy", description="a device whose probe hangs", priority=500, probe=probe,
                              torch_type="cpu")
"""

DEVICES_THEN_AUTO = """
import logging, time
import devplug
from devplug import cli
logging.basicConfig(level=logging.WARNING, format="devplug: %(message)s")
start = time.monotonic()
cli.main(["devices"])
print("devices took", round(time.monotonic() - start, 2))
start = time.monotonic()
trainer = devplug.Trainer(device="auto", precision="32-true", progress=False, stop_signals=())
print("auto chose", trainer.device.name, "after", round(time.monotonic() - start, 2))
"""


@pytest.fixture(scope="module")
def sleepy_site(tmp_path_factory):
    from distributions import pip_install, write_project

    root = tmp_path_factory.mktemp("sleepy")
    source = write_project(root / "src", "sleepy-probe", "0.3.1", {"__init__.py": SLEEPY_DISTRIBUTION},
                           {"sleepy": "sleepy_probe"})
    return pip_install(source, root / "site")


def test_with_a_probe_that_sleeps_a_minute_devices_and_auto_finish_within_the_limit_and_exit(sleepy_site):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    environ.update(PYTHONPATH=os.pathsep.join([str(sleepy_site), str(REPO)]), DEVPLUG_PROBE_TIMEOUT="1")
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", DEVICES_THEN_AUTO], capture_output=True, text=True, env=environ,
                            timeout=50)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("  sleepy: probe timed out after 1 s (plugin 'sleepy' (sleepy-probe 0.3.1)).")
               for line in lines)
    devices_took = float(next(line for line in lines if line.startswith("devices took")).split()[-1])
    _, _, name, _, auto_took = lines[-1].split()
    assert devices_took < 1 + 3 and name == "cpu" and float(auto_took) < 1 + 3
    assert "device 'sleepy' of plugin 'sleepy' (sleepy-probe 0.3.1)" in result.stderr
    assert elapsed < 40  # the probes' threads, still asleep, did not hold up the interpreter's exit


def test_hook_docs_say_step_hooks_must_return_promptly():
    from devplug.core.contract import hookspecs

    for hook in (hookspecs.devplug_compile, hookspecs.devplug_dataloader, hookspecs.devplug_precision):
        assert "return promptly" in (hook.__doc__ or ""), hook.__name__
    assert "DEVPLUG_PROBE_TIMEOUT" in (REPO / "docs" / "plugins.md").read_text()


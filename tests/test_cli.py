"""The ``devplug`` command: ``devices`` (plain, verbose, JSON), ``check`` and ``doctor``, exit codes, ``python -m``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from paths import REPO

import devplug
from devplug import cli
from devplug.core.registry import manager
from devplug.core.registry.manager import create_plugin_manager


class Toy:
    """A device plugin whose optimizer ignores the author's learning rate (the kit must catch it)."""

    DEVPLUG_CONTRACT = "1.0"

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="toy", description="toy", priority=-1, probe=devplug.Availability.yes,
                                  torch_type="cpu")

    @devplug.hookimpl
    def devplug_optimizer(self, device, name, params, options):
        return devplug.OptimizerChoice(torch.optim.SGD(params, lr=1e-3), "torch.optim.SGD(lr=1e-3)")


class Neutral:
    DEVPLUG_CONTRACT = "1.0"
    __version__ = "2.5"

    @devplug.hookimpl(wrapper=True)
    def devplug_region(self, device, name):
        return (yield)

    @devplug.hookimpl(tryfirst=True)
    def devplug_synchronize(self, device):
        return None


@pytest.fixture
def process_manager(monkeypatch):
    """Install a plugin manager as the process-wide one the command uses."""

    def _install(pm):
        monkeypatch.setattr(manager, "_default", pm)
        return pm

    return _install


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 0
    assert "devices" in capsys.readouterr().out


def test_devices_lists_builtins_with_origin_and_auto_choice(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False))
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["DEVICE", "PRIORITY", "STATUS", "COUNT", "PLUGIN", "FROM"]
    assert any(line.split()[:3] == ["cpu", "0", "available"] and line.endswith("devplug (built-in)")
               for line in out.splitlines())
    assert "'auto' selects: cpu" in out
    assert "Plugins (load order" not in out


def test_verbose_shows_kind_distribution_version_contract_and_hook_options(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False, extra_plugins=[("toy", Toy()), ("neutral", Neutral())],
                                          blocked=["hpu"]))
    assert cli.main(["devices", "--verbose"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def row(name: str) -> list[str]:
        index = next(i for i, line in enumerate(lines) if line.startswith(f"  {name} "))
        return [*lines[index].split(), lines[index + 1].strip()]

    assert row("devplug.fallback")[:6] == ["devplug.fallback", "core", "fallback", "devplug", devplug.__version__,
                                           "(built-in)"]
    assert "devplug_to_device [trylast]" in row("devplug.fallback")[-1]
    assert row("cpu")[:7] == ["cpu", "device", "plugin", "(cpu)", "devplug", devplug.__version__, "(built-in)"]
    assert row("toy")[:-1] == ["toy", "device", "plugin", "(toy)", "registered", "at", "run", "time", "-", "1.0", "-"]
    assert row("toy")[-1] == "hooks: devplug_optimizer, devplug_register_devices"
    assert row("neutral")[1:-1] == ["device-neutral", "registered", "at", "run", "time", "2.5", "1.0", "-"]
    assert row("neutral")[-1] == "hooks: devplug_region [wrapper], devplug_synchronize [tryfirst]"
    assert not any(line.startswith("  hpu ") for line in lines)
    assert "Blocked plugins (DEVPLUG_BLOCK_PLUGINS or blocked=): hpu" in lines


def test_verbose_lists_load_failures(capsys, process_manager):
    class Future:
        DEVPLUG_CONTRACT = "2.1"

    process_manager(create_plugin_manager(autoload=False, extra_plugins=[("future", Future())]))
    assert cli.main(["devices", "-v"]) == 0
    out = capsys.readouterr().out
    assert "Plugins that failed to load (skipped):\n  plugin 'future' from registered at run time was skipped: " \
           f"it needs hook contract '2.1' but devplug {devplug.__version__} speaks {devplug.CONTRACT_VERSION}: " \
           "upgrade devplug" in out


def test_a_device_name_conflict_is_reported_and_every_device_still_listed(capsys, process_manager):
    class Clone(Toy):
        @devplug.hookimpl
        def devplug_register_devices(self):
            return [devplug.DeviceSpec(name="cpu", description="", priority=1, probe=devplug.Availability.yes),
                    devplug.DeviceSpec(name="clonedev", description="", priority=-5, probe=devplug.Availability.yes)]

    process_manager(create_plugin_manager(autoload=False, blocked=["generic"], extra_plugins=[("clone", Clone())]))
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "cpu       0         available    1      cpu     devplug (built-in)" in out
    assert "clonedev  -5        available    1      clone   registered at run time" in out
    conflicts = out.split("Device name conflicts (the other plugin's device was skipped):\n", 1)[1]
    assert conflicts.startswith(
        "  device 'cpu' is declared by plugin 'cpu' (devplug (built-in)) and by plugin 'clone' (registered at run "
        "time); 'cpu' keeps it (a built-in keeps its names). To use the other: DEVPLUG_PREFER_PLUGINS=clone, or "
        "DEVPLUG_BLOCK_PLUGINS=cpu")


def test_check_reports_each_check_and_fails_for_a_nonconformant_plugin(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False, extra_plugins=[("toy", Toy())]))
    assert cli.main(["check", "toy"]) == 1
    out = capsys.readouterr().out
    assert "PASSED          probe: available, count 1, priority -1" in out
    assert "FAILED          optimizer[adam]: device 'toy' (plugin 'toy' from registered at run time): " \
           "torch.optim.SGD(lr=1e-3) ignored option lr=0.05" in out
    assert out.rstrip().endswith("failed, 0 not applicable on this machine")


def test_check_of_an_unknown_device_is_an_error(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False, blocked=["generic"]))
    assert cli.main(["check", "nosuch"]) == 2
    assert "no loaded plugin registers device 'nosuch'. Registered devices: hpu, cuda, cpu" in capsys.readouterr().err


# ---- scripting: --json, exit codes, python -m devplug ------------------------------------------------------
class Absent:
    """A device plugin whose device is not on this machine."""

    DEVPLUG_CONTRACT = "1.0"

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="absent", description="a card this machine lacks", priority=1,
                                  torch_type="cpu", probe=lambda: devplug.Availability.no("no absent card", "buy one"))


def test_verbose_details_name_each_device_once(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False, extra_plugins=[("absent", Absent())]))
    assert cli.main(["devices", "--verbose"]) == 0
    details = capsys.readouterr().out.split("Details:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    names = [line.split(":", 1)[0].strip() for line in details if not line.startswith("      ")]
    assert len(names) == len(set(names)), details
    at = details.index("  absent: a card this machine lacks")
    assert details[at + 1] == "      unavailable: no absent card. Fix: buy one"


def test_devices_json_has_stable_keys(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False, extra_plugins=[("absent", Absent())], blocked=["hpu"]))
    assert cli.main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"devplug", "contract", "auto", "devices", "plugins", "blocked", "autoload", "conflicts",
                         "failures", "warnings"}
    assert data["auto"] == "cpu" and data["contract"] == devplug.CONTRACT_VERSION and data["blocked"] == ["hpu"]
    devices = {d["name"]: d for d in data["devices"]}
    assert devices["absent"] == {"name": "absent", "priority": 1, "available": False, "count": 0, "plugin": "absent",
                                 "distribution": "registered at run time", "description": "a card this machine lacks",
                                 "reason": "no absent card", "fix": "buy one"}
    assert devices["cpu"]["available"] is True and devices["cpu"]["count"] == 1
    plugin = next(p for p in data["plugins"] if p["name"] == "absent")
    assert set(plugin) == {"name", "kind", "distribution", "version", "contract", "devices", "hooks", "import_seconds"}
    assert plugin["contract"] == "1.0" and plugin["devices"] == ["absent"]


def test_doctor_json_has_stable_keys(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False))
    assert cli.main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"devplug", "contract", "versions", "plugins", "devices", "environment", "unset_patterns",
                         "incompatible", "warnings", "plugin_loading"}
    assert data["versions"]["devplug"] == devplug.__version__ and "torch" in data["versions"]
    assert {"name": "cpu", "available": True, "reason": "", "fix": ""} in data["devices"]
    assert all(set(f) == {"plugin", "text"} for f in data["incompatible"] + data["warnings"])


def test_check_json_reports_each_result_and_exits_1_on_a_failure(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False, extra_plugins=[("toy", Toy())]))
    assert cli.main(["check", "toy", "--json"]) == cli.EXIT_FAILED == 1
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"device", "plugin", "distribution", "contract", "available", "reason", "results", "counts",
                         "exit_code"}
    assert (data["device"], data["plugin"], data["contract"], data["available"]) == ("toy", "toy", "1.0", True)
    results = {r["name"]: r for r in data["results"]}
    assert results["optimizer[adam]"]["outcome"] == "failed"
    assert set(results["probe"]) == {"name", "outcome", "detail", "since"}
    assert data["counts"]["failed"] >= 1 and data["exit_code"] == 1
    assert set(data["counts"]) == {"passed", "failed", "not_applicable", "advisory"}


def test_check_of_an_unavailable_device_exits_3_unless_allowed(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False, extra_plugins=[("absent", Absent())]))
    assert cli.main(["check", "absent"]) == cli.EXIT_UNAVAILABLE == 3
    out = capsys.readouterr().out
    assert "0 failed" in out
    assert "device 'absent' is not available here (exit code 3; --allow-unavailable accepts it): no absent card" in out
    assert cli.main(["check", "absent", "--allow-unavailable", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["available"], data["reason"], data["exit_code"]) == (False, "no absent card", 0)
    assert data["counts"]["not_applicable"] > 0 and data["counts"]["failed"] == 0


def test_check_json_of_an_unknown_device_is_an_error_object(capsys, process_manager):
    process_manager(create_plugin_manager(autoload=False))
    assert cli.main(["check", "nosuch", "--json"]) == cli.EXIT_ERROR == 2
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 2 and "no loaded plugin registers device 'nosuch'" in data["error"]


def test_python_m_devplug_runs_the_command():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["DEVPLUG_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    result = subprocess.run([sys.executable, "-m", "devplug", "devices", "--json"], capture_output=True, text=True,
                            env=env, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["auto"] == "cpu"


# ---- a passing check prints only its results ---------------------------------------------------------------
PROFILE_CHECK = """
from devplug.core.registry.manager import create_plugin_manager
from devplug.testing import open_device
from devplug.testing.checks.observing import check_profiler_activities
print(check_profiler_activities(open_device("cpu", create_plugin_manager(autoload=False))))
"""


def test_a_passing_profiler_check_prints_no_profiler_lines():
    """The profiler's native library prints start/stop lines (and "ERROR: ... gpuGetDeviceCount failed" on a
    machine without the GPU torch was built for) on the process's stderr: a passing check holds them back."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", PROFILE_CHECK], capture_output=True, text=True, env=env,
                            timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "activities: CPU"
    assert result.stderr == ""


def test_a_failing_profile_shows_what_the_profiler_printed(monkeypatch):
    from devplug.testing import ConformanceError, open_device
    from devplug.testing.checks.observing import check_profiler_activities

    class BrokenProfile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            os.write(2, b"ERROR: the profiler could not start its session\n")
            raise RuntimeError("no profiler session")

        def __exit__(self, *exc_info):
            return False

    monkeypatch.setattr(torch.profiler, "profile", BrokenProfile)
    with pytest.raises(ConformanceError) as info:
        check_profiler_activities(open_device("cpu", create_plugin_manager(autoload=False)))
    assert "raised RuntimeError: no profiler session; the profiler printed: ERROR: the profiler could not start " \
           "its session" in str(info.value)

"""The ``devplug`` command: ``devices`` (plain and verbose) and ``check``."""

from __future__ import annotations

import pytest
import torch

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

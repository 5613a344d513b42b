"""What loading a plugin costs the process: its import time, shown and warned about; environment changes, reported."""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch

from devplug import cli, toolkit
from devplug.core.registry import manager
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cuda import probe as cuda_probe

SLOW_IMPORT = """
import time

import devplug

DEVPLUG_CONTRACT = "1.3"
time.sleep(0.3)


@devplug.hookimpl
def devplug_log(device, point):
    pass
"""

SETS_ENVIRONMENT = """
import os

import devplug

DEVPLUG_CONTRACT = "1.3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["ENVGRAB_TOKEN"] = "mine"


@devplug.hookimpl
def devplug_log(device, point):
    pass
"""


@pytest.fixture
def installed(tmp_path, monkeypatch, install_distribution):
    """Install a one-module distribution and put it on sys.path, its module not yet imported."""

    def _install(name: str, source: str, entry_points: dict[str, str]):
        target = install_distribution(tmp_path / f"site-{name}", name, source, entry_points)
        monkeypatch.syspath_prepend(str(target))
        module = name.replace("-", "_")
        for mod in [m for m in sys.modules if m.startswith(module)]:
            monkeypatch.delitem(sys.modules, mod)
        return module

    return _install


@pytest.fixture
def environment_restored(monkeypatch):
    """Whatever a plugin sets in these tests is undone afterwards (monkeypatch records each variable first)."""
    for name in ("CUDA_VISIBLE_DEVICES", "ENVGRAB_TOKEN"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)


def test_each_plugins_import_time_is_kept_and_shown_by_devices_verbose(installed, monkeypatch, capsys):
    installed("slow-import", SLOW_IMPORT, {"slowimp": "slow_import"})
    pm = create_plugin_manager()
    assert pm.import_seconds["slowimp"] >= 0.3
    assert 0 <= pm.import_seconds["cpu"] < 0.3 and "devplug.fallback" not in pm.import_seconds
    [info] = [i for i in cli.plugin_infos(pm) if i.name == "slowimp"]
    assert info.import_seconds == pm.import_seconds["slowimp"] and info.import_time.endswith(" ms")
    monkeypatch.setattr(manager, "_default", pm)
    assert cli.main(["devices", "--verbose"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.strip().startswith("PLUGIN"))
    assert header.split() == ["PLUGIN", "KIND", "DISTRIBUTION", "VERSION", "CONTRACT", "IMPORT"]
    row = next(line for line in lines if line.startswith("  slowimp "))
    assert row.split()[-2:] == [info.import_time.split()[0], "ms"]


def test_a_slow_import_is_warned_about_once_naming_the_plugin(installed, monkeypatch, caplog):
    monkeypatch.setattr(manager, "SLOW_IMPORT_SECONDS", 0.1)
    monkeypatch.setattr(manager, "_warned_slow", set())
    module = installed("slow-import", SLOW_IMPORT, {"slowimp": "slow_import"})
    with caplog.at_level(logging.WARNING, logger="devplug"):
        pm = create_plugin_manager()
        monkeypatch.delitem(sys.modules, module)  # imported (and slow) again by the second manager
        create_plugin_manager()
    warned = [r.getMessage() for r in caplog.records if "to import" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("plugin 'slowimp' (slow-import 0.3.1) took 0.")
    assert "DEVPLUG_BLOCK_PLUGINS=slowimp" in warned[0]
    assert any("slowimp" in w for w in pm.warnings)  # devplug devices lists it under Warnings
    assert not any("'cpu'" in w for w in pm.warnings)  # built-ins are measured, not warned about


def test_environment_changed_by_a_plugin_while_loading_is_reported(installed, environment_restored, caplog):
    installed("env-grab", SETS_ENVIRONMENT, {"envgrab": "env_grab"})
    pm = create_plugin_manager()
    expected = ("plugin 'envgrab' (env-grab 0.3.1) changed the environment of this process while loading: "
                "CUDA_VISIBLE_DEVICES='' (was unset); ENVGRAB_TOKEN='mine' (was unset)")
    assert expected in caplog.text
    assert expected in pm.warnings
    assert [(c.variable, c.plugin, c.distribution) for c in pm.environment_changes] == [
        ("CUDA_VISIBLE_DEVICES", "envgrab", "env-grab 0.3.1"), ("ENVGRAB_TOKEN", "envgrab", "env-grab 0.3.1")]
    assert "  " + expected in cli.devices_report(pm)


def test_toolkit_names_the_plugin_behind_a_variable_while_its_value_stands(installed, environment_restored):
    installed("env-grab", SETS_ENVIRONMENT, {"envgrab": "env_grab"})
    create_plugin_manager()
    change = toolkit.environment_changes()["ENVGRAB_TOKEN"]
    assert (change.before, change.after, change.plugin, change.distribution) == (None, "mine", "envgrab",
                                                                                 "env-grab 0.3.1")
    os.environ["ENVGRAB_TOKEN"] = "the user's own"
    assert "ENVGRAB_TOKEN" not in toolkit.environment_changes()


def test_cuda_probe_blames_the_plugin_not_the_user_for_cuda_visible_devices(installed, environment_restored,
                                                                            monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    installed("env-grab", SETS_ENVIRONMENT, {"envgrab": "env_grab"})
    create_plugin_manager()
    answer = cuda_probe.probe()
    assert answer.reason == ("CUDA_VISIBLE_DEVICES='' hides every GPU from this process; plugin 'envgrab' "
                             "(env-grab 0.3.1) set it while loading (it was unset before)")
    assert "unset" not in answer.fix and "env-grab 0.3.1" in answer.fix
    assert "DEVPLUG_BLOCK_PLUGINS=envgrab" in answer.fix


def test_cuda_probe_still_tells_the_user_about_their_own_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    answer = cuda_probe.probe()
    assert answer.fix == "unset CUDA_VISIBLE_DEVICES or list the GPU indices to use"

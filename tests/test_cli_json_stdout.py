"""``devplug ... --json`` prints one JSON object on stdout even when a plugin prints while it is probed or checked:
what plugins print goes to stderr."""

from __future__ import annotations

import json

import pytest

import devplug
from devplug import cli
from devplug.core.registry import manager
from devplug.core.registry.manager import create_plugin_manager


class Chatty:
    """A device plugin that prints a banner on stdout whenever its probe runs (as some vendor stacks do)."""

    DEVPLUG_CONTRACT = "1.0"

    @devplug.hookimpl
    def devplug_register_devices(self):
        def probe():
            print("chatty: probing the card")
            return devplug.Availability.yes()

        return devplug.DeviceSpec(name="chatty", description="prints", priority=-1, probe=probe, torch_type="cpu")


@pytest.mark.parametrize("argv", [["devices", "--json"], ["doctor", "--json"], ["check", "chatty", "--json"]])
def test_json_stays_json_when_a_plugin_prints(monkeypatch, capsys, argv):
    pm = create_plugin_manager(autoload=False, extra_plugins=[("chatty", Chatty())])
    monkeypatch.setattr(manager, "_default", pm)
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert "chatty: probing the card" in err
    assert "chatty" in json.dumps(data)

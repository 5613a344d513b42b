"""Device declarations a plugin author gets wrong, reported naming the plugin instead of a wrong count, a torch
traceback or a device nobody can ask for: a count that raises or is not a number, a torch device type torch does
not know, the reserved name ``auto``."""

from __future__ import annotations

import pytest

import devplug
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager


def declaring(name: str = "acme", **fields):
    """A plugin manager with one plugin, ``acme``, declaring one CPU-typed device with ``fields`` changed."""
    spec = {"name": name, "description": "a test device", "priority": 1, "probe": devplug.Availability.yes,
            "torch_type": "cpu", **fields}

    class Declares:
        DEVPLUG_CONTRACT = "1.9"

        @devplug.hookimpl
        def devplug_register_devices(self):
            return devplug.DeviceSpec(**spec)

    return create_plugin_manager(autoload=False, extra_plugins=[("acme", Declares())])


def _fails_to_count(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "DeviceSpec.count of device 'acme'" in r.getMessage()]


@pytest.mark.parametrize(("count", "what"), [
    (lambda: 1 // 0, "raised ZeroDivisionError: integer division or modulo by zero"),
    (lambda: -1, "returned -1, not a number of devices"),
    (lambda: "2", "returned '2', not a number of devices"),
    (lambda: 1.5, "returned 1.5, not a number of devices"),
])
def test_a_count_that_fails_is_named_with_its_plugin_not_taken_as_no_device(count, what, caplog):
    pm = declaring(count=count)
    with pytest.raises(devplug.DeviceUnavailableError) as caught:
        devplug.Trainer(device="acme:0", precision="32-true", progress=False, plugin_manager=pm)
    message = str(caught.value)
    assert f"DeviceSpec.count of device 'acme' (plugin 'acme', registered at run time) {what}" in message
    assert "indices 0..-" not in message
    assert len(_fails_to_count(caplog)) == 1  # logged once, however often the count is asked
    assert DeviceRegistry(pm).devices["acme"].count() == 0


def test_a_good_count_is_kept_and_an_index_past_it_says_how_many_there_are(caplog):
    pm = declaring(count=lambda: 2)
    registry = DeviceRegistry(pm)
    assert registry.devices["acme"].count() == 2 and registry.devices["acme"].count_problem is None
    assert registry.resolve("acme:1").index == 1
    with pytest.raises(devplug.DeviceUnavailableError, match=r"2 acme device\(s\) visible \(indices 0..1\)"):
        registry.resolve("acme:2")
    assert not _fails_to_count(caplog)


def test_a_torch_device_type_torch_does_not_know_is_the_plugins_error_not_a_torch_traceback():
    pm = declaring(torch_type="acme_backend_not_registered")
    with pytest.raises(devplug.PluginError) as caught:
        devplug.Trainer(device="acme", precision="32-true", progress=False, plugin_manager=pm)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("device 'acme' of plugin 'acme' (registered at run time) places tensors on torch "
                              "device type 'acme_backend_not_registered', which torch does not know here")


def test_a_device_named_auto_is_refused_at_load_and_auto_still_chooses():
    pm = declaring(name="auto")
    [failure] = pm.failures
    assert failure.name == "acme" and "invalid device name 'auto': it is reserved" in failure.error
    assert DeviceRegistry(pm).resolve("auto").name == "cpu"


class DriverAbort(BaseException):
    """A vendor runtime's exception that is not an ``Exception`` (test stand-in)."""


def _aborts():
    raise DriverAbort("firmware abort")


def test_a_probe_raising_a_base_exception_makes_only_its_device_unavailable():
    pm = declaring(probe=_aborts)
    with pytest.raises(devplug.DeviceUnavailableError,
                       match=r"its availability probe raised DriverAbort: firmware abort\. To fix: report this"):
        devplug.Trainer(device="acme", precision="32-true", progress=False, plugin_manager=pm)
    assert DeviceRegistry(pm).available_names() == ["cpu"]


def test_a_count_raising_a_base_exception_is_named_like_any_failed_count(caplog):
    registry = DeviceRegistry(declaring(count=_aborts))
    assert registry.devices["acme"].count() == 0
    assert "raised DriverAbort: firmware abort" in (registry.devices["acme"].count_problem or "")


def test_an_unavailable_device_whose_probe_gives_no_reason_says_so_naming_the_plugin():
    pm = declaring(probe=lambda: devplug.Availability.no(""))
    with pytest.raises(devplug.DeviceUnavailableError) as caught:
        devplug.Trainer(device="acme", precision="32-true", progress=False, plugin_manager=pm)
    assert str(caught.value).startswith(
        "device 'acme' is not available: its availability probe said so without a reason (plugin 'acme', registered "
        "at run time). To fix: report this to the maintainers of registered at run time: a probe says why with "
        "Availability.no(reason, fix). Available devices: cpu")

"""A device-neutral plugin takes part in every device's hooks, so its author checks it with any device's kit
(``devplug check cpu``): the kit's first check covers it too, and a third-party plugin that failed to load (so
the device was checked without it) fails that check instead of leaving every check green."""

from __future__ import annotations

import pytest

import devplug
from devplug.core.registry.manager import create_plugin_manager
from devplug.testing import ConformanceError, open_device
from devplug.testing.checks.registration import check_plugin_loaded


class Tracker:
    """A device-neutral plugin (a tracker), as a third party ships it."""

    DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION

    @devplug.hookimpl
    def devplug_log(self, point):
        return None


class ForgotTheMarker:
    DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION

    def devplug_log(self, point):  # no @devplug.hookimpl: pluggy never calls it
        return None


class Misspelt:
    DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION

    @devplug.hookimpl
    def devplug_lgo(self, point):
        return None


def _check_cpu_with(name: str, plugin: object) -> str:
    pm = create_plugin_manager(autoload=False, extra_plugins=[(name, plugin)])
    return check_plugin_loaded(open_device("cpu", pm))


def test_a_loaded_neutral_plugin_is_part_of_the_check():
    assert _check_cpu_with("tracker", Tracker()) == (f"loaded: cpu (contract {devplug.CONTRACT_VERSION}), "
                                                      f"tracker (contract {devplug.CONTRACT_VERSION})")


def test_a_neutral_plugins_unmarked_hook_fails_the_check():
    with pytest.raises(ConformanceError, match=r"plugin 'forgot' defines devplug_log without @devplug\.hookimpl"):
        _check_cpu_with("forgot", ForgotTheMarker())


def test_a_plugin_that_failed_to_load_fails_the_check_naming_it_and_the_way_out():
    with pytest.raises(ConformanceError) as caught:
        _check_cpu_with("misspelt", Misspelt())
    message = str(caught.value)
    assert "plugin 'misspelt' from registered at run time was skipped: it implements devplug_lgo" in message
    assert "the device was checked without it" in message and "DEVPLUG_BLOCK_PLUGINS" in message

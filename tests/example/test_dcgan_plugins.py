"""The example with a third-party plugin that fails in its device setup or exits at import."""

from __future__ import annotations

import pytest

import devplug

from dcgan import train as example  # examples/dcgan/train.py

FLAKY = """
import devplug

@devplug.hookimpl
def devplug_register_devices():
    return devplug.DeviceSpec(name="flakydev", description="fails to set up", priority=70,
                              probe=devplug.Availability.yes, torch_type="cpu")

@devplug.hookimpl
def devplug_device_setup(device):
    raise RuntimeError("firmware handshake failed")
"""
TINY = ["--precision", "32-true", "--no-progress", "--workers", "0", "--nz", "8", "--ngf", "4", "--ndf", "4",
        "--image-size", "16", "--batch-size", "4", "--data", "shapes", "--steps", "2"]


@pytest.fixture
def plugins(tmp_path, monkeypatch, install_distribution):
    for name, source in (("flaky-device", FLAKY), ("exits-at-import", "import sys\nsys.exit(5)\n")):
        site = install_distribution(tmp_path / f"site-{name}", name, source, {name.replace("-", "_"): name.replace(
            "-", "_")})
        monkeypatch.syspath_prepend(str(site))
    devplug.reset_plugin_manager()
    yield
    devplug.reset_plugin_manager()


def test_auto_trains_on_the_next_device_and_says_which_plugin_failed(plugins, tmp_path, capsys):
    assert example.main([*TINY, "--device", "auto", "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "device cpu (plugin cpu)" in captured.out


def test_a_device_asked_for_by_name_is_one_line_naming_the_plugin(plugins, tmp_path, capsys):
    assert example.main([*TINY, "--device", "flakydev", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("dcgan: error: devplug_device_setup of plugin 'flaky_device' (flaky-device 0.3.1) raised "
                          "RuntimeError: firmware handshake failed")

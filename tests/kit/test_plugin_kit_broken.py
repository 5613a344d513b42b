"""Deliberately broken third-party plugins, pip-installed with real entry points: each is reported clearly,
with its distribution, and the rest of devplug keeps working."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from distributions import pip_install, write_project
from test_plugin_kit import devplug_command, run

import devplug
from devplug.cli import devices_report
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager

BROKEN_DIST = "devplug-broken-examples 0.2.0"
BROKEN_MODULES = {
    "__init__.py": '"""Plugins that break devplug\'s contract in one way each."""\n',
    # pluggy rejects the hookimpl: an argument the hookspec does not have
    "badsig.py": """
        import devplug

        DEVPLUG_CONTRACT = "1.0"

        @devplug.hookimpl
        def devplug_optimizer(device, name, params, options, learning_rate):
            return None
        """,
    # the vendor runtime it imports at module level is not installed
    "needs_sdk.py": """
        import acme_accelerator_sdk  # noqa: F401

        DEVPLUG_CONTRACT = "1.0"
        """,
    # registers a device whose probe raises instead of answering Availability.no(...)
    "raising_probe.py": """
        import devplug

        DEVPLUG_CONTRACT = "1.0"

        def probe():
            raise RuntimeError("driver query failed: /dev/flaky0 busy")

        @devplug.hookimpl
        def devplug_register_devices():
            return devplug.DeviceSpec(name="flaky", description="flaky card", priority=70, probe=probe,
                                      torch_type="cpu")
        """,
    # written for a future major version of the hook contract
    "future.py": """
        import devplug

        DEVPLUG_CONTRACT = "2.0"

        @devplug.hookimpl
        def devplug_register_devices():
            return devplug.DeviceSpec(name="future", description="", priority=90, probe=devplug.Availability.yes,
                                      torch_type="cpu")
        """,
    # a misspelt hook name
    "typo.py": """
        import devplug

        DEVPLUG_CONTRACT = "1.0"

        @devplug.hookimpl
        def devplug_mark_stpe(device, phase):
            pass
        """,
}
BROKEN_ENTRY_POINTS = {name.removesuffix(".py"): f"devplug_broken_examples.{name.removesuffix('.py')}"
                       for name in BROKEN_MODULES if name != "__init__.py"}

CLONE_MODULES = {
    "__init__.py": """
        import devplug

        DEVPLUG_CONTRACT = "1.0"

        @devplug.hookimpl
        def devplug_register_devices():
            return devplug.DeviceSpec(name="cpu", description="another cpu", priority=1, probe=devplug.Availability.yes)
        """,
}


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """devplug-broken-examples installed into a temporary target."""
    root = tmp_path_factory.mktemp("broken")
    src = write_project(root / "src", "devplug-broken-examples", "0.2.0", BROKEN_MODULES, BROKEN_ENTRY_POINTS)
    return pip_install(src, root / "site")


@pytest.fixture(scope="module")
def clone_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """devplug-cpu-clone (registers a second device named "cpu") installed into a temporary target."""
    root = tmp_path_factory.mktemp("clone")
    src = write_project(root / "src", "devplug-cpu-clone", "1.4.0", CLONE_MODULES, {"cpuclone": "devplug_cpu_clone"})
    return pip_install(src, root / "site")


def _forget(package: str) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == package]:
        del sys.modules[name]


@pytest.fixture
def broken(broken_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(broken_site))
    yield broken_site
    _forget("devplug_broken_examples")


def train_a_few_steps(pm, device: str = "cpu") -> float:
    trainer = devplug.Trainer(device=device, precision="32-true", progress=False, plugin_manager=pm, seed=0)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("adam", model.parameters(), lr=0.05)
    x, y = trainer.to_device(torch.randn(16, 3)), trainer.to_device(torch.randn(16, 1))
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        trainer.backward(loss)
        trainer.step(opt)
    assert losses[-1] < losses[0]
    return losses[-1]


def test_each_broken_plugin_is_reported_with_its_distribution_and_skipped(broken, caplog):
    pm = create_plugin_manager()
    failures = {f.name: f for f in pm.failures}
    assert set(failures) == {"badsig", "needs_sdk", "future", "typo"}
    assert all(f.distribution == BROKEN_DIST for f in failures.values())
    assert "learning_rate" in failures["badsig"].error and "devplug_optimizer" in failures["badsig"].error
    assert "No module named 'acme_accelerator_sdk'" in failures["needs_sdk"].error
    assert "needs hook contract '2.0'" in failures["future"].error and "upgrade devplug" in failures["future"].error
    assert "devplug_mark_stpe" in failures["typo"].error
    for name in failures:
        assert pm.get_plugin(name) is None
        assert f"plugin {name!r} from {BROKEN_DIST} was skipped" in caplog.text
    registry = DeviceRegistry(pm)
    assert "future" not in registry.names()
    # the probe that raises only makes its own device unavailable, with the exception as the reason
    flaky = registry.devices["flaky"].availability()
    assert not flaky.available
    assert flaky.reason == "its availability probe raised RuntimeError: driver query failed: /dev/flaky0 busy"
    assert BROKEN_DIST in flaky.fix
    assert registry.resolve("auto").name == "cpu"  # flaky's priority 70 does not matter: it is unavailable
    with pytest.raises(devplug.DeviceUnavailableError, match="'flaky' is not available: its availability probe"):
        registry.resolve("flaky")
    train_a_few_steps(pm)  # the rest keeps working


def test_devplug_devices_reports_every_broken_plugin_and_still_lists_devices(broken_site):
    result = run([*devplug_command(), "devices", "--verbose"], pythonpath=broken_site)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "cpu     0         available" in out
    assert "flaky: flaky card\n      unavailable: its availability probe raised RuntimeError: driver query failed: " \
           f"/dev/flaky0 busy. Fix: report this to the maintainers of {BROKEN_DIST}" in out
    skipped = out.split("Plugins that failed to load (skipped):", 1)[1]
    for name in ("badsig", "needs_sdk", "future", "typo"):
        assert f"plugin '{name}' from {BROKEN_DIST} was skipped:" in skipped
    assert "'auto' selects: cpu" in out
    # each failure is also logged once, as a warning on stderr
    assert result.stderr.count("was skipped") == 4


def test_a_trainer_on_the_broken_plugins_device_fails_with_the_reason_not_a_traceback(broken_site):
    code = "import devplug; devplug.Trainer(device='flaky', progress=False)"
    result = run([sys.executable, "-c", code], pythonpath=broken_site)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("devplug.core.errors.DeviceUnavailableError: device 'flaky' is not available: its")
    assert "Available devices: cpu" in last


def test_blocking_the_broken_plugins_silences_them(broken, monkeypatch):
    monkeypatch.setenv("DEVPLUG_BLOCK_PLUGINS", "badsig,needs_sdk,future,typo,raising_probe")
    pm = create_plugin_manager()
    assert pm.failures == []
    assert "flaky" not in DeviceRegistry(pm).names()


def test_a_device_name_conflict_names_both_distributions_and_the_fix(clone_site):
    result = run([*devplug_command(), "devices"], pythonpath=clone_site)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^cpu +0 +available +1 +cpu +devplug \(built-in\)$", result.stdout, re.M)
    message = ("device 'cpu' is declared by plugin 'cpu' (devplug (built-in)) and by plugin 'cpuclone' "
               "(devplug-cpu-clone 1.4.0); 'cpu' keeps it (a built-in keeps its names). To use the other: "
               "DEVPLUG_PREFER_PLUGINS=cpuclone, or DEVPLUG_BLOCK_PLUGINS=cpu")
    assert f"Device name conflicts (the other plugin's device was skipped):\n  {message}" in result.stdout
    assert message in result.stderr  # also logged once as a warning


def test_the_blocked_side_of_a_conflict_keeps_the_other_working(clone_site, monkeypatch):
    monkeypatch.syspath_prepend(str(clone_site))
    try:
        train_a_few_steps(create_plugin_manager(blocked=["cpuclone"]))
        report = devices_report(create_plugin_manager(blocked=["cpu"]), verbose=True)
        assert "devplug-cpu-clone" in report and "Blocked plugins (DEVPLUG_BLOCK_PLUGINS or blocked=): cpu" in report
    finally:
        _forget("devplug_cpu_clone")

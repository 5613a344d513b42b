"""Plugin loading: built-ins and entry points, broken plugins, conflicts, blocking, autoload."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import torch

import devplug
from devplug.core.contract.records import Availability, DeviceSpec
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager

GOOD_PLUGIN = """
import devplug

@devplug.hookimpl
def devplug_register_devices():
    return devplug.DeviceSpec(name="toyaccel", description="toy accelerator on the CPU", priority=5,
                              probe=devplug.Availability.yes, torch_type="cpu")
"""


@pytest.fixture
def installed(tmp_path, monkeypatch, install_distribution):
    """Install a distribution into a temporary target and put it on sys.path."""

    def _install(name: str, source: str, entry_points: dict[str, str]):
        target = install_distribution(tmp_path / f"site-{name}", name, source, entry_points)
        monkeypatch.syspath_prepend(str(target))
        for mod in [m for m in sys.modules if m.startswith(name.replace("-", "_"))]:
            monkeypatch.delitem(sys.modules, mod)
        return target

    return _install


def test_builtin_plugins_register_their_devices():
    registry = DeviceRegistry(create_plugin_manager(autoload=False))
    assert set(registry.names()) >= {"cpu", "cuda", "hpu"}
    assert registry.devices["cpu"].distribution == "devplug (built-in)"
    assert registry.names().index("hpu") < registry.names().index("cuda") < registry.names().index("cpu")


def test_installed_entry_point_is_discovered_with_its_distribution(installed):
    installed("toy-accel-plugin", GOOD_PLUGIN, {"toyaccel": "toy_accel_plugin"})
    pm = create_plugin_manager()
    registry = DeviceRegistry(pm)
    entry = registry.devices["toyaccel"]
    assert entry.distribution == "toy-accel-plugin 0.3.1"
    assert registry.resolve("auto").name == "toyaccel"  # priority 5 beats cpu (0); cuda/hpu unavailable here
    trainer = devplug.Trainer(device="toyaccel", precision="32-true", progress=False, plugin_manager=pm)
    assert trainer.torch_device.type == "cpu"


def test_autoload_disabled_skips_entry_points(installed, monkeypatch):
    installed("toy-accel-plugin", GOOD_PLUGIN, {"toyaccel": "toy_accel_plugin"})
    monkeypatch.setenv("DEVPLUG_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = DeviceRegistry(create_plugin_manager())
    assert "toyaccel" not in registry.names()
    assert "cpu" in registry.names()


def test_plugin_that_fails_to_import_is_reported_and_skipped(installed, caplog):
    installed("broken-import", "raise ImportError('needs libfoo.so')\n", {"broken": "broken_import"})
    pm = create_plugin_manager()
    [failure] = pm.failures
    assert failure.name == "broken"
    assert failure.distribution == "broken-import 0.3.1"
    assert "needs libfoo.so" in failure.error
    assert "broken-import 0.3.1" in caplog.text
    assert DeviceRegistry(pm).resolve("cpu").name == "cpu"


def test_plugin_with_bad_hook_signature_is_reported_and_skipped(installed):
    source = """
import devplug

@devplug.hookimpl
def devplug_mark_step(device, phase, unexpected_argument):
    pass
"""
    installed("bad-signature", source, {"badsig": "bad_signature"})
    pm = create_plugin_manager()
    assert [f.name for f in pm.failures] == ["badsig"]
    assert "unexpected_argument" in pm.failures[0].error
    assert pm.get_plugin("badsig") is None


def test_plugin_with_unknown_hook_is_reported_and_skipped():
    class Typo:
        @devplug.hookimpl
        def devplug_mark_stpe(self, device):  # misspelt hook name
            pass

    pm = create_plugin_manager(autoload=False, extra_plugins=[("typo", Typo())])
    assert [f.name for f in pm.failures] == ["typo"]
    assert "devplug_mark_stpe" in pm.failures[0].error
    assert DeviceRegistry(pm).resolve("cpu").name == "cpu"


def test_incompatible_contract_version_is_reported_and_skipped():
    class Future:
        DEVPLUG_CONTRACT = "2.0"

        @devplug.hookimpl
        def devplug_register_devices(self):
            return DeviceSpec(name="future", description="", priority=1, probe=Availability.yes)

    pm = create_plugin_manager(autoload=False, extra_plugins=[("future", Future())])
    assert "needs hook contract '2.0'" in pm.failures[0].error and "upgrade devplug" in pm.failures[0].error
    assert "future" not in DeviceRegistry(pm).names()


def test_registration_that_raises_is_reported_and_skipped():
    class Raises:
        @devplug.hookimpl
        def devplug_register_devices(self):
            raise RuntimeError("driver query failed")

    pm = create_plugin_manager(autoload=False, extra_plugins=[("raises", Raises())])
    registry = DeviceRegistry(pm)
    assert "driver query failed" in pm.failures[0].error
    assert registry.resolve("cpu").name == "cpu"


def test_two_plugins_claiming_one_device_conflict_names_both_distributions(installed, monkeypatch):
    installed("cpu-turbo", GOOD_PLUGIN.replace('"toyaccel"', '"cpu"'), {"cputurbo": "cpu_turbo"})
    registry = DeviceRegistry(create_plugin_manager())
    assert registry.devices["cpu"].plugin_name == "cpu"  # the built-in keeps its name; nothing raises
    [conflict] = registry.conflicts
    message = str(conflict)
    assert "devplug (built-in)" in message and "cpu-turbo 0.3.1" in message
    assert "DEVPLUG_PREFER_PLUGINS=cputurbo" in message and "DEVPLUG_BLOCK_PLUGINS=cpu" in message
    monkeypatch.setenv("DEVPLUG_PREFER_PLUGINS", "CPUTurbo")  # names match in any case
    preferred = DeviceRegistry(create_plugin_manager())
    assert preferred.devices["cpu"].plugin_name == "cputurbo"
    assert preferred.conflicts[0].skipped.plugin_name == "cpu"


def test_blocking_one_side_resolves_the_conflict(installed, monkeypatch):
    installed("cpu-turbo", GOOD_PLUGIN.replace('"toyaccel"', '"cpu"'), {"cputurbo": "cpu_turbo"})
    monkeypatch.setenv("DEVPLUG_BLOCK_PLUGINS", "cpu, hpu")
    registry = DeviceRegistry(create_plugin_manager())
    assert registry.devices["cpu"].distribution == "cpu-turbo 0.3.1"
    assert registry.devices["hpu"].plugin_name == "generic"  # the hpu plugin is blocked: torch's generic path


def test_operational_hooks_reach_only_the_resolved_device_plugin_and_neutral_plugins():
    calls = []

    class OtherDevice:
        @devplug.hookimpl
        def devplug_register_devices(self):
            return DeviceSpec(name="other", description="", priority=1, probe=Availability.yes, torch_type="cpu")

        @devplug.hookimpl
        def devplug_mark_step(self, device, phase):
            calls.append(("other", phase))

    class Counter:
        @devplug.hookimpl
        def devplug_mark_step(self, device, phase):
            calls.append(("neutral", device.name, phase))

    pm = create_plugin_manager(autoload=False, extra_plugins=[("other", OtherDevice()), ("counter", Counter())])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    model = trainer.setup(__import__("torch").nn.Linear(2, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    trainer.backward(model(__import__("torch").ones(1, 2)).sum())
    trainer.step(opt)
    assert calls == [("neutral", "cpu", devplug.Phase.BACKWARD), ("neutral", "cpu", devplug.Phase.OPTIMIZER_STEP)]


def test_neutral_wrapper_can_change_one_behaviour_of_a_builtin_device():
    class PlainOptimizerPolicy:
        @devplug.hookimpl(wrapper=True)
        def devplug_optimizer(self, device, name, params, options):
            choice = yield
            return devplug.OptimizerChoice(choice.optimizer, choice.implementation + " [audited]")

    pm = create_plugin_manager(autoload=False, extra_plugins=[("policy", PlainOptimizerPolicy())])
    trainer = devplug.Trainer(device="cpu", progress=False, plugin_manager=pm)
    opt = trainer.optimizer("adam", trainer.setup(__import__("torch").nn.Linear(2, 1)).parameters(), lr=1e-3)
    assert trainer.optimizer_implementation(opt).endswith("[audited]")


class MovesModulesInto:
    """A neutral plugin whose ``devplug_to_device`` returns ``answer(module)`` for a module (tensors: a copy)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    @devplug.hookimpl(tryfirst=True)
    def devplug_to_device(self, device: devplug.Device, obj: Any) -> Any:
        return self.answer(obj) if isinstance(obj, torch.nn.Module) else obj.clone()


@pytest.mark.parametrize(("answer", "what"), [
    (copy.deepcopy, "another module (Linear)"),
    (lambda module: torch.nn.Sequential(module), "another module (Sequential)"),
    (lambda module: "moved", "another object"),
], ids=["copy", "wrapper", "unrelated"])
def test_to_device_returning_another_object_for_a_module_is_refused_naming_the_plugin(answer, what):
    pm = create_plugin_manager(autoload=False, extra_plugins=[("mover", MovesModulesInto(answer))])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    assert torch.equal(trainer.to_device(torch.ones(2)), torch.ones(2))  # a tensor may be a copy
    with pytest.raises(devplug.PluginError) as caught:
        trainer.setup(torch.nn.Linear(2, 1))
    message = str(caught.value)
    assert message.startswith(f"devplug_to_device of plugin 'mover' (registered at run time) returned {what} for the "
                              "Linear it was asked to move; a module must be moved in place and returned itself")
    assert "\n" not in message


def test_to_device_returning_the_module_itself_is_accepted():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("mover", MovesModulesInto(lambda module: module))])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    module = torch.nn.Linear(2, 1)
    assert trainer.setup(module) is module


class TagsBatches:
    """A neutral plugin that answers ``devplug_to_device`` for tuples only (its arguments in its own order)."""

    @devplug.hookimpl(tryfirst=True)
    def devplug_to_device(self, obj: Any, device: devplug.Device) -> Any:
        return ["tagged", *obj] if isinstance(obj, tuple) else None


def test_each_batch_goes_to_the_first_plugin_that_answers_and_to_the_fallback_when_none_does():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("tagger", TagsBatches())])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    module = torch.nn.Linear(2, 1)
    assert trainer.setup(module) is module  # declined: the fallback moved it
    assert torch.equal(trainer.to_device(torch.ones(2)), torch.ones(2))
    x, y = torch.ones(3, 2), torch.zeros(3, 1)
    loader = trainer.dataloader(iter([(x, y)]))  # the author's own iterable: each batch moved per step
    assert [batch for _ in trainer.epochs(1) for batch in loader] == [["tagged", x, y]]
    assert trainer.throughput.samples_total == 3


def test_plugin_named_like_a_loaded_one_is_skipped_and_the_loaded_one_keeps_working():
    """A third party's plugin that takes a loaded plugin's name is refused in one line; the loaded one stays."""
    import types

    clash = types.ModuleType("clash")

    @devplug.hookimpl
    def devplug_synchronize(device):
        return None

    clash.devplug_synchronize = devplug_synchronize
    pm = create_plugin_manager(autoload=False, extra_plugins=[("cuda", clash)])
    assert pm.get_plugin("cuda") is sys.modules["devplug.plugins.cuda.plugin"]
    assert pm.distribution_of("cuda") == "devplug (built-in)"
    assert "cuda" in DeviceRegistry(pm).devices
    (failure,) = pm.failures
    assert failure.name == "cuda" and failure.distribution == "registered at run time"
    assert "already" in failure.error and "devplug (built-in)" in failure.error
    assert "\n" not in failure.error and "{" not in failure.error  # one line, not pluggy's table of plugins


def test_a_loaded_plugin_passed_again_under_another_name_is_skipped_in_one_line():
    cpu = sys.modules["devplug.plugins.cpu.plugin"]
    pm = create_plugin_manager(autoload=False, extra_plugins=[("cpu-again", cpu)])
    assert pm.get_name(cpu) == "cpu" and pm.distribution_of("cpu") == "devplug (built-in)"
    (failure,) = pm.failures
    assert failure.name == "cpu-again" and "already loaded as 'cpu'" in failure.error and "\n" not in failure.error


def test_a_device_declared_with_a_priority_that_is_not_a_number_skips_its_plugin_and_auto_still_works():
    import types

    bad = types.ModuleType("toyprio")

    @devplug.hookimpl
    def devplug_register_devices():
        return DeviceSpec(name="toyprio", description="toy", priority="5", probe=Availability.yes, torch_type="cpu")

    bad.devplug_register_devices = devplug_register_devices
    pm = create_plugin_manager(autoload=False, extra_plugins=[bad])
    registry = DeviceRegistry(pm)
    assert "toyprio" not in registry.names()
    assert registry.resolve("auto").name == "cpu"
    (failure,) = pm.failures
    assert failure.name == "toyprio" and "priority" in failure.error and "'5'" in failure.error

"""The generic plugin: every device type torch knows, declared statically, yielding to dedicated plugins.

Tests with ``standins.fake_accelerator`` make torch's accelerator API report a fake ``mtia`` accelerator
(patched at torch's boundary only) and check that the generic plugin serves it, ``auto`` prefers it to
the CPU, and the Trainer's synchronize, memory statistics, device selection, RNG state, collective
backend and precision go through torch's generic API (the stand-in records the calls).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from standins.fake_accelerator import FAKE_BACKEND, fake_accelerator

import devplug
from devplug import Availability, DeviceSpec, LaunchInfo, MemoryStats
from devplug.cli import devices_report
from devplug.core.contract import hookspecs as spec
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.generic import catalog
from devplug.plugins.generic import plugin as generic_plugin
from devplug.testing import DeviceConformance

DEDICATED = {"cpu", "cuda", "hpu"}


def registry(**options) -> DeviceRegistry:
    """The device registry of the built-in plugins (no entry points), with ``options`` for the manager."""
    return DeviceRegistry(create_plugin_manager(autoload=False, **options))


def declared_names() -> list[str]:
    return [s.name for s in generic_plugin.devplug_register_devices()]


# ---- declarations: static, generic, below the dedicated plugins ------------------------------------------
def test_it_declares_every_accelerator_type_torch_knows_and_the_cpu_as_generic():
    specs = generic_plugin.devplug_register_devices()
    names = [s.name for s in specs]
    assert {"cuda", "xpu", "mps", "mtia", "hpu", "cpu"} <= set(names)
    assert set(torch.distributed.Backend.default_device_backend_map) <= set(names)
    assert len(names) == len(set(names)) and names[-1] == "cpu"
    assert all(s.generic and s.torch_type == s.name for s in specs)
    priorities = {s.name: s.priority for s in specs}
    assert priorities.pop("cpu") == 0
    assert set(priorities.values()) == {catalog.ACCELERATOR_PRIORITY}
    assert 0 < catalog.ACCELERATOR_PRIORITY < 50  # above the CPU, below the cuda (50) and hpu (100) plugins


def test_the_declarations_do_not_depend_on_the_machine(monkeypatch):
    without = declared_names()
    fake_accelerator(monkeypatch, "mtia")  # an accelerator appears: the same declarations, now one is available
    assert declared_names() == without
    assert registry().devices["mtia"].availability().available


def test_a_renamed_privateuse1_backend_is_declared_under_its_name(monkeypatch):
    assert "fakenpu" not in declared_names()
    fake = fake_accelerator(monkeypatch, privateuse1="fakenpu")
    assert "fakenpu" in declared_names()
    entry = registry().devices["fakenpu"]
    assert entry.plugin_name == "generic" and entry.availability() == Availability.yes() and entry.count() == 2
    assert "torch.accelerator.is_available" in fake.calls.names()  # probed through torch's generic API


def test_generic_must_be_a_bool():
    with pytest.raises(TypeError, match="generic"):
        DeviceSpec(name="x", description="", priority=0, probe=Availability.yes, generic="yes")


# ---- names: dedicated plugins win without a conflict; blocked ones leave their type to the generic plugin --
def test_dedicated_built_ins_keep_their_names_without_a_conflict():
    reg = registry()
    assert {name: reg.devices[name].plugin_name for name in DEDICATED} == {n: n for n in DEDICATED}
    assert reg.conflicts == []


@pytest.mark.parametrize("blocked", ["cuda", "hpu", "cpu"])
def test_a_blocked_dedicated_plugin_leaves_its_type_to_the_generic_plugin(blocked):
    reg = registry(blocked=[blocked])
    entry = reg.devices[blocked]
    assert entry.plugin_name == "generic" and entry.spec.generic and reg.conflicts == []
    assert entry.spec.priority == (0 if blocked == "cpu" else catalog.ACCELERATOR_PRIORITY)


def test_a_third_party_device_of_a_generic_name_takes_it_without_a_conflict():
    class Xpu:
        DEVPLUG_CONTRACT = "1.1"

        @devplug.hookimpl
        def devplug_register_devices(self):
            return DeviceSpec(name="xpu", description="vendor xpu", priority=60, probe=Availability.yes,
                              torch_type="cpu")

    reg = registry(extra_plugins=[("vendor_xpu", Xpu())])
    assert reg.devices["xpu"].plugin_name == "vendor_xpu" and reg.conflicts == []
    assert reg.devices["mps"].plugin_name == "generic"  # its other declarations stand


def test_two_generic_declarations_of_one_name_are_an_ordinary_conflict():
    class OtherGeneric:
        DEVPLUG_CONTRACT = "1.1"

        @devplug.hookimpl
        def devplug_register_devices(self):
            return DeviceSpec(name="mps", description="", priority=1, probe=Availability.yes, generic=True)

    reg = registry(extra_plugins=[("other_generic", OtherGeneric())])
    [conflict] = reg.conflicts
    assert conflict.kept.plugin_name == "generic" and conflict.skipped.plugin_name == "other_generic"


# ---- this machine: torch reports no accelerator ------------------------------------------------------------
@pytest.mark.skipif(torch.accelerator.is_available(), reason="this machine has an accelerator")
def test_without_an_accelerator_the_list_only_gains_unavailable_entries_with_reasons():
    before, after = registry(blocked=["generic"]), registry()
    assert set(before.names()) < set(after.names())
    for name in before.names():
        old, new = before.devices[name], after.devices[name]
        assert (new.plugin_name, new.availability(), new.count(), new.spec.priority, new.spec.description) == (
            old.plugin_name, old.availability(), old.count(), old.spec.priority, old.spec.description)
    added = set(after.names()) - set(before.names())
    assert added == set(declared_names()) - DEDICATED
    for name in added:
        availability = after.devices[name].availability()
        assert not availability.available and availability.reason and availability.fix
    assert after.resolve("auto").name == before.resolve("auto").name == "cpu"


def test_with_torch_reporting_no_accelerator_at_all_auto_is_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: None)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    reg = registry()
    assert reg.resolve("auto").name == "cpu"
    for name in set(declared_names()) - DEDICATED:
        assert reg.devices[name].plugin_name == "generic" and not reg.devices[name].availability().available


@pytest.mark.skipif(torch.accelerator.is_available(), reason="this machine has an accelerator")
def test_devplug_devices_lists_the_generic_devices_with_their_reasons():
    report = devices_report(create_plugin_manager(autoload=False))
    rows = {line.split()[0]: line.split() for line in report.splitlines()[1:] if line and not line.startswith(" ")}
    assert rows["xpu"][1:5] == ["10", "unavailable", "0", "generic"]
    assert rows["cuda"][4] == "cuda" and rows["cpu"][4] == "cpu"
    assert "  mps: this torch build" in report and "was built without mps support. Fix: " in report
    assert "conflict" not in report


def test_import_devplug_loads_no_plugin():
    code = "import sys, devplug; print(sorted(m for m in sys.modules if m.startswith('devplug.plugins.')))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


# ---- a fake accelerator: auto prefers it, the Trainer goes through torch's generic API ---------------------
def test_auto_prefers_the_fake_accelerator_to_the_cpu(monkeypatch):
    fake = fake_accelerator(monkeypatch, "mtia", count=2)
    device = registry().resolve("auto")
    assert (device.name, device.plugin_name, device.torch_device) == ("mtia", "generic", torch.device("mtia"))
    assert registry().devices["mtia"].count() == 2
    assert {"torch.accelerator.is_available", "torch.accelerator.device_count"} <= set(fake.calls.names())


def test_the_trainer_on_the_fake_accelerator_goes_through_torchs_generic_api(monkeypatch, tmp_path):
    fake = fake_accelerator(monkeypatch, "mtia", count=2)
    trainer = devplug.Trainer(device="auto", precision="auto", progress=False,
                              plugin_manager=create_plugin_manager(autoload=False))
    assert (trainer.device.name, trainer.device.plugin_name) == ("mtia", "generic")

    # precision: autocast available for the type, and its module reports native bf16
    assert ("torch.amp.is_autocast_available", ("mtia",)) in fake.calls
    assert ("torch.mtia.is_bf16_supported", (False,)) in fake.calls
    assert trainer.precision.name == "bf16-mixed" and trainer.scaler is None
    assert "(auto: torch.mtia.is_bf16_supported(including_emulation=False) is True)" in trainer.precision.description

    # synchronize and memory statistics
    fake.calls.clear()
    trainer.synchronize()
    assert fake.calls.of("torch.accelerator.synchronize") == [(torch.device("mtia"),)]
    assert "torch.mtia.synchronize" not in fake.calls.names()
    assert trainer.memory_stats() == MemoryStats(allocated=1 << 20, reserved=2 << 20, peak_allocated=3 << 20,
                                                 total=16 << 30)
    assert {"torch.accelerator.memory_allocated", "torch.accelerator.get_memory_info"} <= set(fake.calls.names())

    # RNG state: saved from the device module and restored into it
    saved = [s.clone() for s in fake.module.rng_states]
    path = trainer.save(tmp_path / "ckpt.pt")
    assert "torch.mtia.get_rng_state_all" in fake.calls.names()
    state = torch.load(path, weights_only=False)
    assert all(torch.equal(a, b) for a, b in zip(state["rng"]["device"], saved, strict=True))
    fake.module.rng_states = [torch.zeros(8, dtype=torch.uint8)] * 2
    trainer.load(path)
    assert "torch.mtia.set_rng_state_all" in fake.calls.names()
    assert all(torch.equal(a, b) for a, b in zip(fake.module.rng_states, saved, strict=True))

    # collective backend and the local device, as the Trainer asks before joining a process group
    fake.calls.clear()
    launch = LaunchInfo(rank=3, world_size=4, local_rank=3, local_world_size=4, launcher="torchrun")
    setup = trainer._hooks(spec.devplug_collective_setup, launch=launch)
    assert setup.backend == FAKE_BACKEND
    assert ("Backend.default_device_backend_map.get", ("mtia",)) in fake.calls
    assert ("torch.accelerator.set_device_index", (1,)) in fake.calls  # local rank 3 on 2 devices
    trainer.close()


def test_an_explicit_index_selects_the_device_through_torch_accelerator(monkeypatch):
    fake = fake_accelerator(monkeypatch, "mtia", count=2)
    trainer = devplug.Trainer(device="mtia:1", precision="32-true", progress=False,
                              plugin_manager=create_plugin_manager(autoload=False))
    assert trainer.torch_device == torch.device("mtia", 1)
    assert fake.calls.of("torch.accelerator.set_device_index") == [(1,)] and fake.current_index == 1
    fake.calls.clear()
    trainer.synchronize()
    assert fake.calls.of("torch.accelerator.synchronize") == [(torch.device("mtia", 1),)]
    trainer.close()


def test_a_dedicated_plugin_still_serves_its_type_while_a_fake_accelerator_is_reported(monkeypatch):
    fake_accelerator(monkeypatch, "mtia")
    reg = registry(blocked=[])
    assert reg.devices["cuda"].plugin_name == "cuda" and reg.devices["mtia"].plugin_name == "generic"


# ---- the conformance kit passes for the generic plugin (serving the CPU, for real) -----------------------
class TestGenericConformance(DeviceConformance):
    """The kit against the generic plugin serving ``cpu`` (the cpu plugin blocked): every hook runs for real."""

    device_name = "cpu"
    require_available = True

    def make_plugin_manager(self):
        return create_plugin_manager(autoload=False, blocked=["cpu"])


def test_the_conformance_subject_is_the_generic_plugin():
    assert registry(blocked=["cpu"]).devices["cpu"].plugin_name == "generic"

"""The conformance kit (devplug.testing): it passes for the built-in plugins and catches broken ones."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
import torch.distributed as dist
from paths import REPO
from standins import hpu_fixtures

import devplug
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.core.tree import move_to
from devplug.testing import ConformanceError, DeviceConformance, DeviceUnderTest, open_device, run_checks
from devplug.testing.checks.collectives import check_collective_setup
from devplug.testing.checks.data import check_dataloader
from devplug.testing.checks.movement import check_to_device
from devplug.testing.checks.observing import check_region, check_synchronize_and_memory
from devplug.testing.checks.optimizers import check_optimizer
from devplug.testing.checks.precision import check_precision
from devplug.testing.checks.registration import check_plugin_loaded, check_probe
from devplug.testing.checks.state import check_optimizer_state
from devplug.testing.checks.steps import check_compile, check_mark_step
from devplug.testing.checks.training import check_training
from devplug.toolkit import autocast_plan


# ---- the kit passes for the built-in plugins -------------------------------------------------------------
class TestCpuConformance(DeviceConformance):
    """The built-in CPU plugin keeps the contract (built-ins only, whatever is installed)."""

    device_name = "cpu"
    require_available = True

    def make_plugin_manager(self) -> DevplugPluginManager:
        return create_plugin_manager(autoload=False)


# The HPU plugin's conformance against the stand-in Gaudi stack (lazy and eager) is in test_hpu_conformance.py.
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")  # no accelerator here
def test_hpu_conformance_training_drives_the_plugins_step_marking_on_the_standin(monkeypatch):
    for standin in hpu_fixtures.standin(monkeypatch, lazy=True):
        dut = open_device("hpu", create_plugin_manager(autoload=False))
        check_training(dut)
        assert standin.count("mark_step") > 0  # the kit ran the plugin's real lazy-mode path


def test_import_devplug_imports_neither_the_kit_nor_pytest():
    code = "import sys, devplug; print(any(m == 'pytest' or m.startswith('devplug.testing') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"


def test_run_checks_works_without_pytest_and_reports_each_check():
    results = run_checks("cpu", create_plugin_manager(autoload=False), optimizer_names=("sgd",),
                                precisions=("32-true",))
    assert {r.outcome for r in results} == {"passed"}
    assert [r.name for r in results][:4] == ["plugin_loaded", "probe", "device_setup", "to_device"]
    assert "optimizer[sgd]" in [r.name for r in results]


# ---- the kit catches plugins that break the contract -----------------------------------------------------
class ToyDevice:
    """A conformant device plugin on the CPU; tests break one hook at a time in subclasses."""

    DEVPLUG_CONTRACT = "1.0"

    def probe(self) -> devplug.Availability:
        return devplug.Availability.yes()

    @devplug.hookimpl
    def devplug_register_devices(self) -> devplug.DeviceSpec:
        return devplug.DeviceSpec(name="toy", description="toy device", priority=-5, probe=self.probe,
                                  torch_type="cpu")


def toy(plugin: Any) -> DeviceUnderTest:
    return open_device("toy", create_plugin_manager(autoload=False, extra_plugins=[("toy", plugin)]))


def test_a_conformant_toy_device_passes_every_check():
    results = run_checks("toy", create_plugin_manager(autoload=False, extra_plugins=[("toy", ToyDevice())]))
    assert [str(r) for r in results if r.outcome != "passed"] == []


class RaisingProbe(ToyDevice):
    def probe(self) -> devplug.Availability:
        raise OSError("cannot open /dev/toy0")


class ReasonlessProbe(ToyDevice):
    def probe(self) -> devplug.Availability:
        return devplug.Availability.no("")


class NoContract(ToyDevice):
    DEVPLUG_CONTRACT = None


class UnmarkedHook(ToyDevice):
    def devplug_to_device(self, device: devplug.Device, obj: Any) -> Any:  # forgot @devplug.hookimpl
        return obj


class FlattensBatches(ToyDevice):
    @devplug.hookimpl
    def devplug_to_device(self, device: devplug.Device, obj: Any) -> Any:
        return list(obj.values()) if isinstance(obj, dict) else obj.to(device.torch_device)


class DropsLeaves(ToyDevice):
    @devplug.hookimpl
    def devplug_to_device(self, device: devplug.Device, obj: Any) -> Any:
        moved = move_to(obj, device.torch_device)
        return {**moved, "meta": None} if isinstance(moved, dict) else moved


class BareOptimizer(ToyDevice):
    @devplug.hookimpl
    def devplug_optimizer(self, device: devplug.Device, name: str, params: Any, options: dict[str, Any]) -> Any:
        return torch.optim.SGD(params, **options)


class IgnoresOptions(ToyDevice):
    @devplug.hookimpl
    def devplug_optimizer(self, device: devplug.Device, name: str, params: Any, options: dict[str, Any]) -> Any:
        return devplug.OptimizerChoice(torch.optim.Adam(params, lr=1e-3), "torch.optim.Adam(lr=1e-3)")


class AscendingOptimizer(ToyDevice):
    @devplug.hookimpl
    def devplug_optimizer(self, device: devplug.Device, name: str, params: Any, options: dict[str, Any]) -> Any:
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]
        return devplug.OptimizerChoice(cls(params, maximize=True, **options), f"{cls.__name__}(maximize=True)")


class VendorSGD(torch.optim.SGD):
    """A vendor's optimizer (here torch's, renamed): its state is not known to be torch's layout."""


class VendorLayoutSGD(torch.optim.SGD):
    """A vendor's SGD that keeps an entry of its own in each parameter's state: not torch.optim.SGD's layout.

    (A subclass that keeps torch's layout, such as VendorSGD, is canonical without converters.)
    """

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self.state[param]["vendor_steps"] = self.state[param].get("vendor_steps", 0) + 1
        return loss


class VendorWithoutConverters(ToyDevice):
    @devplug.hookimpl
    def devplug_optimizer(self, device: devplug.Device, name: str, params: Any, options: dict[str, Any]) -> Any:
        return devplug.OptimizerChoice(VendorLayoutSGD(params, **options), "vendor.SGD")


def _drop_second_moment(optimizer: Any, state: Any) -> dict[str, Any]:
    return {"state": {i: {k: v for k, v in s.items() if k != "exp_avg_sq"} for i, s in state["state"].items()},
            "param_groups": state["param_groups"]}


def _zero_momentum(optimizer: Any, state: Any) -> dict[str, Any]:
    zeroed = {i: {"momentum_buffer": torch.zeros_like(s["momentum_buffer"])} for i, s in state["state"].items()}
    return {"state": zeroed, "param_groups": state["param_groups"]}


class LossyConverters(ToyDevice):
    @devplug.hookimpl
    def devplug_optimizer(self, device: devplug.Device, name: str, params: Any, options: dict[str, Any]) -> Any:
        cls = VendorSGD if name == "sgd" else type("VendorAdam", (torch.optim.Adam,), {})
        to_canonical, from_canonical = (lambda o, s: dict(s), _zero_momentum) if name == "sgd" else (
            _drop_second_moment, lambda o, s: dict(s))
        return devplug.OptimizerChoice(cls(params, **options), f"vendor.{name}", to_canonical=to_canonical,
                                       from_canonical=from_canonical)


class ScalerWithBf16(ToyDevice):
    @devplug.hookimpl
    def devplug_precision(self, device: devplug.Device, precision: str) -> devplug.PrecisionPlan:
        return autocast_plan(device, "32-true" if precision == "auto" else precision, scaler=True)


class WrongErrorForFp16(ToyDevice):
    @devplug.hookimpl
    def devplug_precision(self, device: devplug.Device, precision: str) -> devplug.PrecisionPlan | None:
        if precision == "16-mixed":
            raise ValueError("fp16 unsupported")
        return None


class SilentlyDowngrades(ToyDevice):
    @devplug.hookimpl
    def devplug_precision(self, device: devplug.Device, precision: str) -> devplug.PrecisionPlan:
        return autocast_plan(device, "32-true")


class BadRegion(ToyDevice):
    @devplug.hookimpl
    def devplug_region(self, device: devplug.Device, name: str) -> Any:
        return f"range:{name}"


class RejectsOptimizerPhase(ToyDevice):
    @devplug.hookimpl
    def devplug_mark_step(self, device: devplug.Device, phase: devplug.Phase) -> None:
        if phase is not devplug.Phase.BACKWARD:
            raise KeyError(phase)


class UnknownBackend(ToyDevice):
    @devplug.hookimpl
    def devplug_collective_setup(self, device: devplug.Device, launch: devplug.LaunchInfo) -> devplug.CollectiveSetup:
        return devplug.CollectiveSetup(backend="warpdrive")


class MisspeltDdpOption(ToyDevice):
    @devplug.hookimpl
    def devplug_collective_setup(self, device: devplug.Device, launch: devplug.LaunchInfo) -> devplug.CollectiveSetup:
        return devplug.CollectiveSetup(backend="gloo", ddp_kwargs={"bucket_cap": 25})


class LosesSamples(ToyDevice):
    @devplug.hookimpl
    def devplug_dataloader(self, device: devplug.Device, source: Any, options: devplug.LoaderOptions) -> Any:
        first = next(iter(torch.utils.data.DataLoader(source, batch_size=options.batch_size)))
        return devplug.LoaderChoice(loader=[first], implementation="one batch only")


class BadMemoryStats(ToyDevice):
    @devplug.hookimpl
    def devplug_memory_stats(self, device: devplug.Device) -> devplug.MemoryStats:
        return devplug.MemoryStats(allocated=-1)


class NotCallableCompile(ToyDevice):
    @devplug.hookimpl
    def devplug_compile(self, device: devplug.Device, module: torch.nn.Module, options: dict[str, Any]) -> Any:
        return "compiled"


BROKEN = [
    (RaisingProbe, check_probe, "probe raised OSError: cannot open /dev/toy0"),
    (ReasonlessProbe, check_probe, "without a reason"),
    (NoContract, check_plugin_loaded, f'add DEVPLUG_CONTRACT = "{devplug.CONTRACT_VERSION}"'),
    (UnmarkedHook, check_plugin_loaded, "devplug_to_device without @devplug.hookimpl"),
    (FlattensBatches, check_to_device, "did not keep dicts, tuples, lists and namedtuples"),
    (DropsLeaves, check_to_device, "changed non-tensor leaves"),
    (BareOptimizer, lambda d: check_optimizer(d, "sgd"), "not a devplug.OptimizerChoice"),
    (IgnoresOptions, lambda d: check_optimizer(d, "adam"), "ignored option lr=0.05"),
    (AscendingOptimizer, lambda d: check_optimizer(d, "adamw"), "did not lower a convex toy loss"),
    (AscendingOptimizer, check_training, "did not lower a toy loss"),
    (VendorWithoutConverters, lambda d: check_optimizer_state(d, "sgd"),
     "vendor.SGD (sgd) saves its state in its own layout (vendor.SGD gives no converter to torch.optim's layout, and "
     "its state differs from torch.optim.SGD's: parameter 0 has ['momentum_buffer', 'vendor_steps'], "
     "torch.optim.SGD has ['momentum_buffer'])"),
    (LossyConverters, lambda d: check_optimizer_state(d, "adam"), "its canonical state is not torch.optim's "
     "layout: parameter 0 has ['exp_avg', 'step'], torch.optim has ['exp_avg', 'exp_avg_sq', 'step']"),
    (LossyConverters, lambda d: check_optimizer_state(d, "sgd"), "after a round trip through the canonical "
     "state, weight differs from the original optimizer's after the same steps"),
    (ScalerWithBf16, lambda d: check_precision(d, "bf16-mixed"), "a scaler belongs only to 16-mixed"),
    (WrongErrorForFp16, lambda d: check_precision(d, "16-mixed"), "raise devplug.PrecisionError"),
    (SilentlyDowngrades, lambda d: check_precision(d, "bf16-mixed"), "with a plan named '32-true'"),
    (BadRegion, check_region, "not a context manager"),
    (RejectsOptimizerPhase, lambda d: check_mark_step(d, devplug.Phase.OPTIMIZER_STEP), "raised KeyError"),
    (UnknownBackend, check_collective_setup, "'warpdrive' is unknown to torch.distributed"),
    (MisspeltDdpOption, check_collective_setup, "['bucket_cap'] are not DistributedDataParallel"),
    (LosesSamples, check_dataloader, "yielded 4 samples of a dataset of 10"),
    (BadMemoryStats, check_synchronize_and_memory, "MemoryStats.allocated must be a number of bytes"),
    (NotCallableCompile, check_compile, "cannot be called"),
]


@pytest.mark.parametrize(("plugin", "check", "message"), BROKEN, ids=[f"{b[0].__name__}-{i}" for i, b in
                                                                       enumerate(BROKEN)])
def test_the_kit_reports_a_broken_hook_clearly(plugin, check, message):
    with pytest.raises(ConformanceError) as info:
        check(toy(plugin()))
    text = str(info.value)
    assert message in text
    assert text.startswith("device 'toy' (plugin 'toy' from registered at run time)")


def test_a_backend_registered_by_the_plugin_counts_as_known():
    name = "devplugkittest"

    class RegistersBackend(ToyDevice):
        @devplug.hookimpl
        def devplug_collective_setup(self, device, launch):
            if name not in dist.Backend.backend_list:  # what a vendor's collective library does on import
                dist.Backend.register_backend(name, lambda *args: None, devices=["cpu"])
            return devplug.CollectiveSetup(backend=name)

    assert "backend devplugkittest" in check_collective_setup(toy(RegistersBackend()))
    assert "backend" in check_collective_setup(toy(type("Mapped", (UnknownBackend,), {
        "devplug_collective_setup": devplug.hookimpl(lambda self, device, launch: devplug.CollectiveSetup(
            backend="cpu:gloo,cuda:nccl"))})()))


def test_a_device_nobody_registers_names_the_load_failures():
    class Broken:
        DEVPLUG_CONTRACT = "3.0"

    pm = create_plugin_manager(autoload=False, extra_plugins=[("toy", Broken())])
    with pytest.raises(ConformanceError, match=r"no loaded plugin registers device 'toy'.*contract '3.0'"):
        open_device("toy", pm)


def test_unavailable_device_skips_with_the_reason_or_fails_when_required(tmp_path):
    (tmp_path / "test_unavailable.py").write_text(textwrap.dedent("""
        import devplug
        from devplug.core.registry.manager import create_plugin_manager
        from devplug.testing import DeviceConformance

        class Absent:
            DEVPLUG_CONTRACT = "1.0"

            @devplug.hookimpl
            def devplug_register_devices(self):
                return devplug.DeviceSpec(name="absent", description="", priority=1, torch_type="cpu",
                                          probe=lambda: devplug.Availability.no("no absent card", "buy one"))

        class TestSkips(DeviceConformance):
            device_name = "absent"

            def make_plugin_manager(self):
                return create_plugin_manager(autoload=False, extra_plugins=[("absent", Absent())])

        class TestRequired(TestSkips):
            require_available = True
        """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", "test_unavailable.py"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300,
    )
    out = result.stdout
    assert result.returncode == 1, out
    assert "SKIPPED [" in out and "is not available here: no absent card" in out, out
    assert "FAILED test_unavailable.py::TestRequired::test_to_device" in out, out
    assert "35 failed, 6 passed, 35 skipped" in out, out  # the device-dependent checks, once per case

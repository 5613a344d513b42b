"""The plugin contract no plugin can break: static kinds, contained conflicts, checked answers, strict switches,
deterministic precedence, contract versions, building on a built-in device."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

import devplug
from devplug import toolkit
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager


def spec(name: str, priority: int = 5) -> devplug.DeviceSpec:
    return devplug.DeviceSpec(name=name, description=name, priority=priority, probe=devplug.Availability.yes,
                              torch_type="cpu")


def trainer(pm, device: str = "cpu", **options) -> devplug.Trainer:
    return devplug.Trainer(device=device, precision="32-true", progress=False, plugin_manager=pm, **options)


def adam_params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3))]


# ---- a plugin's kind does not depend on the machine ------------------------------------------------------
class VendorWithoutRuntime:
    """A vendor plugin that declares nothing when its runtime is missing, and forces SGD for every optimizer."""

    @devplug.hookimpl
    def devplug_register_devices(self):
        return None  # "no runtime here, so no device"

    @devplug.hookimpl
    def devplug_optimizer(self, device, name, params, options):
        return devplug.OptimizerChoice(torch.optim.SGD(params, lr=options.get("lr", 0.1)), "vendor SGD")


def test_a_device_plugin_that_declares_nothing_is_rejected_and_never_reaches_other_devices():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("vendor", VendorWithoutRuntime())])
    [failure] = pm.failures
    assert failure.name == "vendor"
    assert "returned None" in failure.error and "DeviceSpec.probe" in failure.error
    t = trainer(pm)
    opt = t.optimizer("adam", adam_params(), lr=1e-3)
    assert isinstance(opt, torch.optim.Adam)  # the CPU's Adam, not the vendor's SGD
    assert "vendor" not in t.optimizer_implementation(opt)


def test_an_empty_declaration_is_rejected_like_none():
    class Empty:
        @devplug.hookimpl
        def devplug_register_devices(self):
            return []

    pm = create_plugin_manager(autoload=False, extra_plugins=[("empty", Empty())])
    assert "returned None" in pm.failures[0].error
    assert pm.get_plugin("empty") is None


# ---- one bad plugin never takes the others down -------------------------------------------------------------
class ClaimsCpu:
    @devplug.hookimpl
    def devplug_register_devices(self):
        return [spec("cpu", 1), spec("cpux", -3)]


def test_a_plugin_claiming_the_cpu_name_leaves_every_device_working():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("cpuclaim", ClaimsCpu())])
    registry = DeviceRegistry(pm)
    assert registry.devices["cpu"].plugin_name == "cpu"
    assert registry.devices["cpux"].plugin_name == "cpuclaim"
    assert trainer(pm, "cpux").device.plugin_name == "cpuclaim"
    assert trainer(pm, "auto").device.name == "cpu"
    assert trainer(pm, "cpu").device.plugin_name == "cpu"
    assert "DEVPLUG_BLOCK_PLUGINS=cpu" in str(registry.conflicts[0])


# ---- every answer is checked where the core receives it ------------------------------------------------------
class BareOptimizer:
    @devplug.hookimpl(tryfirst=True)
    def devplug_optimizer(self, device, name, params, options):
        return torch.optim.Adam(params, **options)


class TuplePrecision:
    @devplug.hookimpl(tryfirst=True)
    def devplug_precision(self, device, precision):
        return ("32-true", None)


class ForgetsToReturn:
    @devplug.hookimpl(wrapper=True)
    def devplug_optimizer(self, device, name, params, options):
        yield  # the author meant `return (yield)`


class RaisingWrapper:
    @devplug.hookimpl(wrapper=True)
    def devplug_region(self, device, name):
        raise KeyError(name)
        yield  # pragma: no cover


def test_a_bare_optimizer_is_one_error_naming_plugin_hook_and_record():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("bare", BareOptimizer())])
    with pytest.raises(devplug.PluginError) as info:
        trainer(pm).optimizer("adam", adam_params(), lr=1e-3)
    message = str(info.value)
    assert message.startswith("devplug_optimizer of plugin 'bare' (registered at run time) returned Adam")
    assert "not a devplug.OptimizerChoice" in message


def test_a_tuple_instead_of_a_precision_plan_is_named():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("tuple", TuplePrecision())])
    with pytest.raises(devplug.PluginError, match=r"devplug_precision of plugin 'tuple' .*not a devplug.PrecisionPlan"):
        trainer(pm)


def test_a_wrapper_that_forgets_to_return_is_named():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("forgets", ForgetsToReturn())])
    with pytest.raises(devplug.PluginError, match=r"plugin 'forgets' .*dropped the answer.*return \(yield\)"):
        trainer(pm).optimizer("adam", adam_params(), lr=1e-3)


def test_an_exception_in_a_neutral_wrapper_names_the_plugin_and_chains_the_original():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("raising", RaisingWrapper())])
    t = trainer(pm)
    with pytest.raises(devplug.PluginError, match=r"devplug_region of plugin 'raising' .*raised KeyError") as info:
        with t.autocast():
            pass
    assert isinstance(info.value.__cause__, KeyError)


def test_devplug_errors_raised_on_purpose_pass_through_unchanged():
    class Refuses:
        @devplug.hookimpl(tryfirst=True)
        def devplug_precision(self, device, precision):
            raise devplug.PrecisionError("no fp16 here; use bf16-mixed")

    pm = create_plugin_manager(autoload=False, extra_plugins=[("refuses", Refuses())])
    with pytest.raises(devplug.PrecisionError, match=r"^no fp16 here"):
        trainer(pm)


def test_a_string_registration_is_reported_as_the_string():
    class Named:
        @devplug.hookimpl
        def devplug_register_devices(self):
            return "npu"

    pm = create_plugin_manager(autoload=False, extra_plugins=[("named", Named())])
    assert "returned 'npu' (a str), not a devplug.DeviceSpec" in pm.failures[0].error


def test_an_invalid_device_name_is_one_clear_line():
    class BadName:
        @devplug.hookimpl
        def devplug_register_devices(self):
            return spec("My-NPU")

    pm = create_plugin_manager(autoload=False, extra_plugins=[("badname", BadName())])
    error = pm.failures[0].error
    assert "invalid device name 'My-NPU': use lower-case letters, digits and '_'" in error
    assert "\n" not in error and "<function" not in error


# ---- strict, helpful switches ------------------------------------------------------------------------------
def test_the_core_fallback_cannot_be_blocked(monkeypatch):
    monkeypatch.setenv("DEVPLUG_BLOCK_PLUGINS", "devplug.fallback")
    pm = create_plugin_manager(autoload=False)
    assert any("cannot be blocked" in w for w in pm.warnings)
    t = trainer(pm)
    assert t.setup(torch.nn.Linear(2, 2)) is not None


def test_an_unknown_blocked_name_warns_with_a_suggestion(monkeypatch, caplog):
    monkeypatch.setenv("DEVPLUG_BLOCK_PLUGINS", "cudaa")
    with caplog.at_level(logging.WARNING, logger="devplug"):
        pm = create_plugin_manager(autoload=False)
    assert "DEVPLUG_BLOCK_PLUGINS names 'cudaa', which is no plugin here; did you mean 'cuda'?" in caplog.text
    assert "cuda" in DeviceRegistry(pm).names()


def test_blocked_names_match_in_any_case(monkeypatch):
    monkeypatch.setenv("DEVPLUG_BLOCK_PLUGINS", "CUDA, Hpu")
    devices = DeviceRegistry(create_plugin_manager(autoload=False)).devices
    assert devices["cuda"].plugin_name == devices["hpu"].plugin_name == "generic"  # their plugins are blocked
    assert devices["cpu"].plugin_name == "cpu"


@pytest.mark.parametrize(("value", "autoload"), [("off", True), ("No", True), ("", True), ("ON", False),
                                                 ("1", False), ("yes", False)])
def test_boolean_variables_accept_the_usual_spellings(monkeypatch, value, autoload):
    monkeypatch.setenv("DEVPLUG_DISABLE_PLUGIN_AUTOLOAD", value)
    assert create_plugin_manager().autoload is autoload


def test_boolean_variables_reject_the_rest(monkeypatch):
    monkeypatch.setenv("DEVPLUG_DISABLE_PLUGIN_AUTOLOAD", "maybe")
    with pytest.raises(devplug.ConfigError, match=r"DEVPLUG_DISABLE_PLUGIN_AUTOLOAD='maybe' is not a yes/no value"):
        create_plugin_manager()


# ---- precedence does not depend on sys.path -----------------------------------------------------------------
POLICY = """
import devplug, torch

@devplug.hookimpl
def devplug_optimizer(device, name, params, options):
    return devplug.OptimizerChoice(torch.optim.SGD(params, lr=0.1), "{name}")
"""


def test_precedence_is_the_same_whatever_the_sys_path_order(tmp_path, monkeypatch, install_distribution):
    sites = {name: install_distribution(tmp_path / f"site-{name}", f"policy-{name}", POLICY.format(name=name),
                                        {f"policy_{name}": f"policy_{name}"})
             for name in ("alpha", "beta")}
    answers = []
    for order in (("alpha", "beta"), ("beta", "alpha")):
        with monkeypatch.context() as m:
            m.setattr(sys, "path", [str(sites[n]) for n in order] + sys.path)
            for module in ("policy_alpha", "policy_beta"):
                m.delitem(sys.modules, module, raising=False)
            t = trainer(create_plugin_manager())
            answers.append(t.optimizer_implementation(t.optimizer("sgd", adam_params())))
    assert answers == ["alpha", "alpha"]  # alphabetical by distribution, called first


# ---- contract versions ---------------------------------------------------------------------------------------
def test_a_plugin_needing_a_newer_contract_says_upgrade_devplug():
    class Newer:
        DEVPLUG_CONTRACT = "1.99"

        @devplug.hookimpl
        def devplug_hook_of_the_future(self, device):
            pass

    pm = create_plugin_manager(autoload=False, extra_plugins=[("newer", Newer())])
    error = pm.failures[0].error
    assert error == (f"it needs hook contract '1.99' but devplug {devplug.__version__} speaks "
                     f"{devplug.CONTRACT_VERSION}: upgrade devplug (pip install -U devplug)")


_MAJOR, _MINOR = (int(part) for part in devplug.CONTRACT_VERSION.split("."))
_CURRENT, _NEXT = f"{_MAJOR}.{_MINOR}", f"{_MAJOR}.{_MINOR + 1}"


@pytest.mark.parametrize(("declared", "loads"), [(">=1.0,<3", True), ("~=1.0", True), ("<1.0", False),
                                                 (f">={_CURRENT}", True), (f">={_NEXT}", False), ("1.0", True),
                                                 ("1", True)])
def test_a_plugin_may_declare_a_range(declared, loads):
    plugin = type("Ranged", (), {"DEVPLUG_CONTRACT": declared})()
    pm = create_plugin_manager(autoload=False, extra_plugins=[("ranged", plugin)])
    assert (pm.get_plugin("ranged") is not None) is loads


def test_an_unreadable_contract_is_reported():
    plugin = type("Odd", (), {"DEVPLUG_CONTRACT": "one-ish"})()
    pm = create_plugin_manager(autoload=False, extra_plugins=[("odd", plugin)])
    assert "DEVPLUG_CONTRACT = 'one-ish', which is not a version" in pm.failures[0].error


# ---- building on a device, and the Trainer options a plugin honours --------------------------------------------
def test_a_plugin_can_delegate_to_a_builtin_without_importing_its_internals():
    class OnHost:
        @devplug.hookimpl
        def devplug_register_devices(self):
            return spec("onhost")

        @devplug.hookimpl
        def devplug_memory_stats(self, device):
            return toolkit.builtin_plugin("cpu").devplug_memory_stats(device=device)

    pm = create_plugin_manager(autoload=False, extra_plugins=[("onhost", OnHost())])
    stats = trainer(pm, "onhost").memory_stats()
    assert isinstance(stats, devplug.MemoryStats) and stats.peak_allocated > 0
    with pytest.raises(ValueError, match="no built-in device plugin 'tpu'"):
        toolkit.builtin_plugin("tpu")


def test_channels_last_reaches_the_cpu_device_as_a_typed_field():
    t = devplug.Trainer(device="cpu", precision="32-true", progress=False, channels_last=True)
    assert t.device.channels_last is True and "channels_last" not in t.device.options
    conv = t.setup(torch.nn.Conv2d(3, 4, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert t.to_device(torch.ones(2, 3, 5, 5)).is_contiguous(memory_format=torch.channels_last)


def test_a_device_whose_plugin_failed_to_load_says_so():
    class ImportErr:
        DEVPLUG_CONTRACT = "9.0"

    pm = create_plugin_manager(autoload=False, extra_plugins=[("importerr", ImportErr())])
    with pytest.raises(devplug.UnknownDeviceError) as info:
        trainer(pm, "importerr")
    assert "Note: plugin 'importerr' from registered at run time was skipped: it needs hook contract '9.0'" in str(
        info.value)


# ---- a plugin that raises or exits while loading or setting its device up --------------------------------
class SetupFails:
    def __init__(self, how: str) -> None:
        self.how = how

    @devplug.hookimpl
    def devplug_register_devices(self):
        return spec("flakydev", priority=50)

    @devplug.hookimpl
    def devplug_device_setup(self, device):
        if self.how == "exit":
            sys.exit(4)
        raise RuntimeError("driver handshake failed")


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_auto_passes_over_a_device_whose_setup_fails_and_says_why(how, caplog):
    pm = create_plugin_manager(autoload=False, extra_plugins=[("flaky", SetupFails(how))])
    with caplog.at_level(logging.WARNING, logger="devplug"):
        t = trainer(pm, "auto")
    assert t.device.name == "cpu"
    assert "device flakydev could not be set up" in caplog.text and "plugin 'flaky'" in caplog.text


@pytest.mark.parametrize(("how", "said"), [("raise", "raised RuntimeError: driver handshake failed"),
                                           ("exit", "called sys.exit(4)")])
def test_a_device_asked_for_by_name_whose_setup_fails_is_one_error_naming_the_plugin(how, said):
    pm = create_plugin_manager(autoload=False, extra_plugins=[("flaky", SetupFails(how))])
    with pytest.raises(devplug.PluginError) as info:
        trainer(pm, "flakydev")
    assert str(info.value) == f"devplug_device_setup of plugin 'flaky' (registered at run time) {said}"


def test_a_plugin_that_calls_sys_exit_on_import_is_reported_and_skipped(tmp_path, monkeypatch, install_distribution):
    site = install_distribution(tmp_path / "site", "exits-on-import", "import sys\nsys.exit(3)\n",
                                {"exiter": "exits_on_import"})
    monkeypatch.syspath_prepend(str(site))
    pm = create_plugin_manager()
    [failure] = pm.failures
    assert (failure.name, failure.distribution) == ("exiter", "exits-on-import 0.3.1")
    assert failure.error == "it called sys.exit(3) while loading"
    assert trainer(pm, "auto").device.name == "cpu"


@pytest.mark.parametrize("declared", ["1", "1.0", "1.2", "1.4", "1.4.0", "1.10", "0.9", "2", "2.0", "1.99"])
@pytest.mark.parametrize("speaks", ["1.4", "1.10", "2.0"])
def test_a_plain_contract_version_is_judged_as_packaging_would(declared, speaks):
    from packaging.version import Version

    from devplug.core.contract.versions import contract_problem

    wanted, current = Version(declared), Version(speaks)
    problem = contract_problem(declared, speaks)
    if wanted.major == current.major and wanted <= current:
        assert problem is None
    else:
        assert problem is not None and ("upgrade devplug" in problem) == (wanted > current)

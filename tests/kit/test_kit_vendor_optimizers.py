"""A plugin that builds an optimizer torch.optim does not have (a vendor's LAMB), named in ``optimizer_names``:
the kit checks that it builds, and says the canonical-state check does not apply to it, instead of failing
with a bare ``AssertionError`` (also where the device must be available)."""

from __future__ import annotations

import pytest
import torch

import devplug
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.testing import DeviceConformance, open_device, run_checks
from devplug.testing.checks.state import check_optimizer_state


class Lamb(torch.optim.Adam):
    """Stands in for a vendor's LAMB: an algorithm torch.optim has no class for."""


class BuildsLamb:
    DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION

    @devplug.hookimpl
    def devplug_register_devices(self) -> devplug.DeviceSpec:
        return devplug.DeviceSpec(name="lambdev", description="builds lamb", priority=-5,
                                  probe=devplug.Availability.yes, torch_type="cpu")

    @devplug.hookimpl
    def devplug_optimizer(self, name, params, options):
        return devplug.OptimizerChoice(Lamb(params, **options), "vendor Lamb") if name == "lamb" else None


def _plugins() -> DevplugPluginManager:
    return create_plugin_manager(autoload=False, extra_plugins=[("lambdev", BuildsLamb())])


def test_the_canonical_state_check_does_not_apply_to_an_algorithm_torch_does_not_have():
    results = {r.name: r for r in run_checks("lambdev", _plugins(), optimizer_names=("lamb", "sgd"),
                                             precisions=("32-true",))}
    assert results["optimizer[lamb]"].outcome == "passed"
    assert results["optimizer_state[lamb]"].outcome == "not applicable"
    assert "torch.optim has no 'lamb'" in results["optimizer_state[lamb]"].detail
    assert results["optimizer_state[sgd]"].outcome == "passed"  # a torch algorithm is still checked


class LambRequired(DeviceConformance):
    device_name = "lambdev"
    require_available = True

    def make_plugin_manager(self) -> DevplugPluginManager:
        return _plugins()


def test_with_require_available_it_is_skipped_not_failed():
    dut = open_device("lambdev", _plugins())
    with pytest.raises(pytest.skip.Exception, match=r"torch\.optim has no 'lamb'"):
        LambRequired()._run(check_optimizer_state, dut, "lamb")


def test_one_name_given_as_a_string_is_one_case_not_one_per_character():
    results = run_checks("lambdev", _plugins(), optimizer_names="sgd", precisions="32-true")
    names = [r.name for r in results]
    assert [n for n in names if n.startswith(("optimizer", "precision"))] == [
        "optimizer[sgd]", "optimizer_state[sgd]", "precision[32-true]"]
    assert {r.outcome for r in results} <= {"passed", "not applicable"}


class OneNameEach(DeviceConformance):
    device_name = "lambdev"
    optimizer_names = "lamb"
    precisions = "32-true"


def test_the_pytest_kit_parametrises_one_name_given_as_a_string_as_one_case():
    class Metafunc:
        fixturenames = ("case",)

        def __init__(self, function):
            self.function, self.calls = function, []

        def parametrize(self, name, cases, ids):
            self.calls.append((name, cases, ids))

    for test, expected in (("test_optimizer", ["lamb"]), ("test_precision", ["32-true"])):
        metafunc = Metafunc(getattr(OneNameEach, test))
        OneNameEach().pytest_generate_tests(metafunc)
        assert metafunc.calls == [("case", expected, expected)]

"""``DeviceConformance``: the conformance checks as a pytest base class a plugin's test suite subclasses.

For example:

    from devplug.testing import DeviceConformance

    class TestMyDevice(DeviceConformance):
        device_name = "mydev"

Every check of `devplug.testing.checks` becomes one test, ``test_<check>`` (optimizers,
precisions and phases parametrised), in the order ``devplug check`` runs them, so a check added to
the kit is a test in every plugin's suite.
A check introduced in a contract newer than the one the plugin declares skips, as "advisory", when it
fails (a plugin written for 1.0 keeps working with every later 1.x). Tests that need the device skip,
with the probe's reason, where it is not available, unless ``require_available = True`` (set it on CI
machines that have the hardware).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from devplug.core.contract.records import PRECISIONS, Phase
from devplug.core.errors import DevplugError
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.testing.checks import registered_checks
from devplug.testing.kit import (
    STANDARD_OPTIMIZERS,
    CheckSpec,
    DeviceUnderTest,
    DoesNotApply,
    NotApplicable,
    open_device,
    selection_cases,
)


class DeviceConformance:
    """Base class of a device plugin's conformance tests; subclass it and set ``device_name``.

    Class attributes to adjust:

    - ``device_name``: the device to test (required).
    - ``device_options``: ``Device.options`` for the plugin (as ``Trainer(device_options=...)`` passes them).
    - ``optimizer_names``: optimizer names that must build (default ``adam``, ``adamw``, ``sgd``); a name
      torch.optim does not have (a vendor's ``lamb``) is checked for building only: it has no canonical state.
    - ``precisions``: precision names to plan (default all of ``devplug.records.PRECISIONS``; a device may
      refuse a mixed setting with ``devplug.PrecisionError``, never ``auto`` or ``32-true``).
    - ``training_precision``: precision of the Trainer and checkpoint checks (default ``"auto"``).
    - ``require_available``: fail instead of skip when the device is not available here.
    - ``run_compiled``: also run the module ``devplug_compile`` returned (slow with inductor).

    Override `make_plugin_manager` to test with a particular set of plugins (for example with
    ``create_plugin_manager(autoload=False, extra_plugins=[...])`` to test a plugin not installed yet).
    """

    device_name: ClassVar[str] = ""
    device_options: ClassVar[Mapping[str, Any]] = {}
    optimizer_names: ClassVar[Sequence[str]] = STANDARD_OPTIMIZERS
    precisions: ClassVar[Sequence[str]] = PRECISIONS
    training_precision: ClassVar[str] = "auto"
    require_available: ClassVar[bool] = False
    run_compiled: ClassVar[bool] = False

    def make_plugin_manager(self) -> DevplugPluginManager:
        """The plugin manager the device is looked up in (default: a fresh one, entry points included)."""
        return create_plugin_manager()

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrise each generated test over its check's cases (optimizer names, precisions, phases)."""
        spec = getattr(metafunc.function, "check", None)
        if spec is None or spec.over is None or "case" not in metafunc.fixturenames:
            return
        cases = list(Phase) if spec.over == "phases" else selection_cases(getattr(self, spec.over))
        metafunc.parametrize("case", cases, ids=[str(getattr(c, "value", c)) for c in cases])

    @pytest.fixture
    def device_under_test(self) -> DeviceUnderTest:
        """The device named ``device_name``, looked up in a fresh plugin manager."""
        if not self.device_name:
            pytest.fail(f"{type(self).__name__} must set device_name = '<your device>'")
        return open_device(self.device_name, self.make_plugin_manager(), options=self.device_options)

    @pytest.fixture
    def available(self, device_under_test: DeviceUnderTest) -> DeviceUnderTest:
        """The device under test; skips (fails with ``require_available``) when it is unavailable here."""
        try:
            device_under_test.require_available()
        except NotApplicable as exc:
            if not self.require_available:
                pytest.skip(str(exc))
        return device_under_test

    def _run(self, check: Callable[..., str], dut: DeviceUnderTest, *args: Any, **kwargs: Any) -> str:
        try:
            return check(dut, *args, **kwargs)
        except NotApplicable as exc:
            if self.require_available and not isinstance(exc, DoesNotApply):
                pytest.fail(f"{exc} (require_available is set)")
            pytest.skip(str(exc))

    def _selection(self) -> dict[str, Any]:
        return {"training_precision": self.training_precision, "run_compiled": self.run_compiled}


def _generated_test(spec: CheckSpec) -> Callable[..., None]:
    """The test method of one check: ``test_<name>``, parametrised by ``case`` when the check has cases."""
    fixture = "available" if spec.needs_device else "device_under_test"

    def run(self: DeviceConformance, request: pytest.FixtureRequest, *case: Any) -> None:
        kwargs = {arg: self._selection()[key] for arg, key in spec.options.items()}
        dut = request.getfixturevalue(fixture)
        try:
            self._run(spec.function, dut, *case, **kwargs)
        except (AssertionError, DevplugError) as exc:
            if dut.holds_to(spec.since):
                raise
            pytest.skip(f"advisory (introduced in contract {spec.since}; the plugin declares {dut.contract}): {exc}")

    def plain(self: DeviceConformance, request: pytest.FixtureRequest) -> None:
        run(self, request)

    def over_cases(self: DeviceConformance, request: pytest.FixtureRequest, case: Any) -> None:
        run(self, request, case)

    test: Callable[..., None] = plain if spec.over is None else over_cases
    test.__name__ = f"test_{spec.name}"
    test.__doc__ = (spec.function.__doc__ or "").strip().splitlines()[0]
    test.check = spec  # type: ignore[attr-defined]  # read back by pytest_generate_tests
    return test


for _spec in registered_checks():  # one test per check, derived from the kit (and so from the hook contract)
    setattr(DeviceConformance, f"test_{_spec.name}", _generated_test(_spec))

"""``DeviceConformance``: the conformance checks as a pytest base class a plugin's test suite subclasses.

::

    from devplug.testing import DeviceConformance

    class TestMyDevice(DeviceConformance):
        device_name = "mydev"

Every check of :mod:`devplug.testing.checks` becomes one test (optimizers, precisions and phases
parametrised). Tests that need the device skip, with the probe's reason, where it is not available,
unless ``require_available = True`` (set it on CI machines that have the hardware).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from devplug.core.manager import DevplugPluginManager, create_plugin_manager
from devplug.core.records import PRECISIONS, Phase
from devplug.testing import checks
from devplug.testing.checks import STANDARD_OPTIMIZERS, DeviceUnderTest, NotApplicable


class DeviceConformance:
    """Base class of a device plugin's conformance tests; subclass it and set ``device_name``.

    Class attributes to adjust:

    - ``device_name``: the device to test (required).
    - ``device_options``: ``Device.options`` for the plugin (as ``Trainer(device_options=...)`` passes them).
    - ``optimizer_names``: optimizer names that must build (default ``adam``, ``adamw``, ``sgd``).
    - ``precisions``: precision names to plan (default all of ``devplug.records.PRECISIONS``; a device may
      refuse a mixed setting with ``devplug.PrecisionError``, never ``auto`` or ``32-true``).
    - ``training_precision``: precision of the Trainer and checkpoint checks (default ``"auto"``).
    - ``require_available``: fail instead of skip when the device is not available here.
    - ``run_compiled``: also run the module ``devplug_compile`` returned (slow with inductor).

    Override :meth:`make_plugin_manager` to test with a particular set of plugins (for example with
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
        """Parametrise over the class's optimizer names, precisions and step phases."""
        if "optimizer_name" in metafunc.fixturenames:
            metafunc.parametrize("optimizer_name", list(self.optimizer_names))
        if "precision" in metafunc.fixturenames:
            metafunc.parametrize("precision", list(self.precisions))
        if "phase" in metafunc.fixturenames:
            metafunc.parametrize("phase", list(Phase), ids=[p.value for p in Phase])

    @pytest.fixture
    def device_under_test(self) -> DeviceUnderTest:
        """The device named ``device_name``, looked up in a fresh plugin manager."""
        if not self.device_name:
            pytest.fail(f"{type(self).__name__} must set device_name = '<your device>'")
        return checks.open_device(self.device_name, self.make_plugin_manager(), options=self.device_options)

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
            if self.require_available:
                pytest.fail(f"{exc} (require_available is set)")
            pytest.skip(str(exc))

    # ---- registration ------------------------------------------------------------------------------------
    def test_plugin_loaded(self, device_under_test: DeviceUnderTest) -> None:
        """The plugin loaded cleanly, declares a compatible contract, and has no unmarked hook functions."""
        self._run(checks.check_plugin_loaded, device_under_test)

    def test_probe_returns_availability(self, device_under_test: DeviceUnderTest) -> None:
        """The probe returns an Availability (with a reason when unavailable) and never raises."""
        self._run(checks.check_probe, device_under_test)

    # ---- operational hooks ---------------------------------------------------------------------------------
    def test_device_setup(self, available: DeviceUnderTest) -> None:
        """``devplug_device_setup`` runs (twice, as two Trainers in one process would call it)."""
        self._run(checks.check_device_setup, available)

    def test_to_device(self, available: DeviceUnderTest) -> None:
        """Modules, tensors and nested batches arrive on the device with their structure intact."""
        self._run(checks.check_to_device, available)

    def test_optimizer(self, available: DeviceUnderTest, optimizer_name: str) -> None:
        """Each standard optimizer name builds a working torch optimizer that names its implementation."""
        self._run(checks.check_optimizer, available, optimizer_name)

    def test_precision(self, available: DeviceUnderTest, precision: str) -> None:
        """Each precision yields a consistent plan, or a clear PrecisionError for a mixed setting."""
        self._run(checks.check_precision, available, precision)

    def test_region(self, available: DeviceUnderTest) -> None:
        """Profiler regions are context managers (or None)."""
        self._run(checks.check_region, available)

    def test_mark_step(self, available: DeviceUnderTest, phase: Phase) -> None:
        """Step marking accepts every phase."""
        self._run(checks.check_mark_step, available, phase)

    def test_collective_setup(self, available: DeviceUnderTest) -> None:
        """The collective backend is one torch.distributed knows; DDP and init arguments exist."""
        self._run(checks.check_collective_setup, available)

    def test_dataloader(self, available: DeviceUnderTest) -> None:
        """The data loader yields every sample, and its batches end up on the device."""
        self._run(checks.check_dataloader, available)

    def test_synchronize_and_memory_stats(self, available: DeviceUnderTest) -> None:
        """Synchronize returns; memory statistics are a MemoryStats record or None."""
        self._run(checks.check_synchronize_and_memory, available)

    def test_compile(self, available: DeviceUnderTest) -> None:
        """Compile returns a callable module or defers."""
        self._run(checks.check_compile, available, run=self.run_compiled)

    # ---- end to end ------------------------------------------------------------------------------------------
    def test_training_lowers_loss(self, available: DeviceUnderTest) -> None:
        """A few Trainer steps on the device lower a toy regression loss."""
        self._run(checks.check_training, available, self.training_precision)

    def test_checkpoint_loads_on_cpu(self, available: DeviceUnderTest) -> None:
        """A checkpoint the Trainer saves on the device holds CPU tensors and loads into a CPU model."""
        self._run(checks.check_checkpoint_on_cpu, available, self.training_precision)

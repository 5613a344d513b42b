"""The CUDA plugin's per-step cost without a GPU: Python calls and host-device synchronisations, counted.

The built-in CUDA plugin is loaded as it ships, with only its device declaration replaced by a stand-in whose
tensors live on the CPU (``DeviceSpec(name="cuda", torch_type="cpu")``) and ``torch.cuda``'s device queries
answered by the test. Every other hook (setup, moving, optimizer, precision, region, step marking) is the
plugin's own, so a step that starts calling its hooks, or synchronising, shows here on a machine without one.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Iterator

import pytest
import torch
from step_cost import BUDGET, STEPS, added_calls_per_step

import devplug
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cuda import plugin as cuda_plugin


@devplug.hookimpl
def _cuda_on_the_host() -> devplug.DeviceSpec:
    """Stand-in declaration: the CUDA plugin's device, its tensors on the CPU, always available."""
    return devplug.DeviceSpec(name="cuda", description="CUDA plugin, tensors on the host (test stand-in)",
                              priority=50, probe=devplug.Availability.yes, torch_type="cpu")


class HostSyncs:
    """Counts what makes the host wait for a device: ``torch.cuda.synchronize``, ``Tensor.item``, ``tolist`` and
    ``bool(tensor)`` (a data-dependent branch), while ``counting`` is True."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.counting = False
        monkeypatch.setattr(torch.cuda, "synchronize", self._counted("synchronize", lambda *args, **kwargs: None))
        for name in ("item", "tolist", "__bool__"):
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))

    def _counted(self, name, function):
        def counted(*args, **kwargs):
            if self.counting:
                self.counts[name] += 1
            return function(*args, **kwargs)
        return counted

    @contextlib.contextmanager
    def measured(self) -> Iterator[None]:
        self.counting = True
        try:
            yield
        finally:
            self.counting = False


@pytest.fixture
def cuda_on_the_host(monkeypatch: pytest.MonkeyPatch):
    """A plugin manager with the built-in CUDA plugin serving ``cuda`` on the host; yields the sync counter."""
    monkeypatch.setattr(cuda_plugin, "devplug_register_devices", _cuda_on_the_host)
    monkeypatch.setitem(sys.modules, "apex", None)  # torch's own optimizers, as the plain loop uses
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "stand-in H100")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    yield create_plugin_manager(autoload=False), HostSyncs(monkeypatch)
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_the_stand_in_runs_the_cuda_plugins_own_hooks(cuda_on_the_host):
    pm, _ = cuda_on_the_host
    trainer = devplug.Trainer(device="cuda", precision="32-true", progress=False, plugin_manager=pm, stop_signals=())
    try:
        assert trainer.device.plugin_name == "cuda" and trainer.torch_device.type == "cpu"
        route = trainer._route
        assert not route.marks_regions and not route.marks_steps  # no profiling: nothing marked, nothing called
    finally:
        trainer.close()
    profiled = devplug.Trainer(device="cuda", precision="32-true", progress=False, plugin_manager=pm,
                               stop_signals=(), device_options={"profile": True})
    try:
        assert profiled._route.marks_regions and not profiled._route.marks_steps  # NVTX ranges, still no step mark
    finally:
        profiled.close()


@pytest.mark.parametrize("log_every", [10**9, 20], ids=["between-log-points", "with-log-points"])
def test_the_cuda_plugins_step_adds_few_python_calls_and_no_host_syncs(cuda_on_the_host, log_every):
    pm, syncs = cuda_on_the_host
    added = added_calls_per_step(log_every, pm, device="cuda", optimizer={"fused": True}, measured=syncs.measured)
    assert added <= BUDGET, f"the CUDA plugin's step adds {added:.1f} Python calls per step (budget {BUDGET})"
    log_points = 0 if log_every > STEPS else STEPS // log_every
    # between log points nothing is read back; a log point reads its averaged values back once
    assert sum(syncs.counts.values()) <= 2 * log_points, dict(syncs.counts)

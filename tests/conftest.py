"""Shared fixtures: every test starts with a fresh plugin manager, no DEVPLUG_* environment but a generous probe
time limit, its own cache dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from distributions import pip_install, write_project

from devplug.core.registry import environment, manager
from devplug.plugins.generic.trial import forget_trials

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def _this_machines_peaks(tmp_path_factory: pytest.TempPathFactory) -> str | None:
    """The CPU plugin's cached matmul rates on this machine (fp32 and bf16, one thread and torch's default),
    measured once per test session: where the CPU's clock is not cpufreq's maximum (a virtual machine), the
    plugin checks its computed peak against a measured matmul, which would otherwise run in every test."""
    from devplug.core.observe.peak_cache import PEAKS_FILE
    from devplug.plugins.cpu.peaks import peak_flops

    folder = tmp_path_factory.mktemp("devplug-peaks")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEVPLUG_CACHE_DIR", str(folder))
        try:
            for count in sorted({1, threads}):
                torch.set_num_threads(count)
                for dtype in (torch.float32, torch.bfloat16):
                    peak_flops(dtype)
        finally:
            torch.set_num_threads(threads)
    peaks = folder / PEAKS_FILE
    return peaks.read_text() if peaks.exists() else None


@pytest.fixture(autouse=True)
def _clean_devplug_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, _this_machines_peaks: str | None):
    for name in list(os.environ):
        if name.startswith("DEVPLUG_"):
            monkeypatch.delenv(name, raising=False)
    # a measured peak is cached here, this machine's matmul rates already in it (beside tmp_path: the tests own that)
    cache = tmp_path.with_name(f"{tmp_path.name}-devplug-cache")
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(cache))
    if _this_machines_peaks is not None:
        cache.mkdir()
        (cache / "peaks.json").write_text(_this_machines_peaks)
    # A plugin's probe must answer within the time limit (10 s by default). On a loaded machine the stand-ins'
    # probes (imports in a worker thread) can take longer; the tests of the limit itself set their own.
    monkeypatch.setenv("DEVPLUG_PROBE_TIMEOUT", "120")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    manager.reset_plugin_manager()
    environment.forget_environment_changes()
    forget_trials()
    yield
    manager.reset_plugin_manager()
    environment.forget_environment_changes()
    forget_trials()


@pytest.fixture(autouse=True, scope="module")
def _no_process_group_across_modules():
    """A process group a test module leaves joined (a one-process FSDP Trainer joins one, and close() keeps it,
    as it does for a script) is destroyed when the module ends: the next module the same worker runs starts
    without one, whatever order the workers take the modules in."""
    yield
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def openreg():
    """The openreg test backend (a real PrivateUse1 device built from C++), built once per session, cached."""
    from standins.openreg.harness import build

    built = build()
    if isinstance(built, str):
        pytest.skip(f"the openreg test backend cannot be built here: {built}")
    return built


@pytest.fixture
def install_distribution():
    """A function that pip-installs a tiny plugin distribution into a target folder (no network)."""
    return _install_distribution


def _install_distribution(target: Path, name: str, module_source: str, entry_points: dict[str, str]) -> Path:
    """pip-install a one-module distribution (version 0.3.1) declaring ``devplug`` entry points into ``target``."""
    src = write_project(target.parent / f"src-{name}", name, "0.3.1", {"__init__.py": module_source}, entry_points)
    return pip_install(src, target)


@pytest.fixture
def empty_peak_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A peak cache without this machine's measured matmul rates, for a test that fakes measuring them."""
    folder = tmp_path / "empty-peak-cache"
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(folder))
    return folder

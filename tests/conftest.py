"""Shared fixtures: every test starts with a fresh plugin manager, no DEVPLUG_* environment but a generous probe
time limit, its own cache dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from distributions import pip_install, write_project

from devplug.core.registry import environment, manager
from devplug.plugins.generic.trial import forget_trials

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_devplug_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for name in list(os.environ):
        if name.startswith("DEVPLUG_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path / "devplug-cache"))  # a measured peak is cached here
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

"""Shared fixtures: every test starts with a fresh plugin manager and no DEVPLUG_* environment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devplug.core import manager

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_devplug_state(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith("DEVPLUG_"):
            monkeypatch.delenv(name, raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    manager.reset_plugin_manager()
    yield
    manager.reset_plugin_manager()


@pytest.fixture
def install_distribution():
    """A function that pip-installs a tiny plugin distribution into a target folder (no network)."""
    return _install_distribution


def _install_distribution(target: Path, name: str, module_source: str, entry_points: dict[str, str]) -> Path:
    """pip-install a one-module distribution declaring ``devplug`` entry points into ``target``."""
    src = target.parent / f"src-{name}"
    package = name.replace("-", "_")
    (src / package).mkdir(parents=True)
    (src / package / "__init__.py").write_text(textwrap.dedent(module_source))
    eps = "\n".join(f'{k} = "{v}"' for k, v in entry_points.items())
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["setuptools>=64"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{name}"
            version = "0.3.1"

            [project.entry-points.devplug]
            """
        )
        + eps
        + "\n"
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
         str(target), str(src)],
        check=True,
        capture_output=True,
    )
    return target

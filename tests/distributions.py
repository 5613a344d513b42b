"""Tiny plugin distributions for tests: write a project with ``devplug`` entry points, pip-install it offline."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path


def write_project(root: Path, name: str, version: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """A source tree of a distribution ``name`` whose package holds ``modules``, with ``devplug`` entry points."""
    package = root / name.replace("-", "_")
    package.mkdir(parents=True)
    for filename, source in modules.items():
        (package / filename).write_text(textwrap.dedent(source).lstrip())
    eps = "\n".join(f'{key} = "{value}"' for key, value in entry_points.items())
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "{version}"

        [tool.setuptools]
        packages = ["{name.replace('-', '_')}"]

        [project.entry-points.devplug]
        """) + eps + "\n")
    return root


def pip_install(source: Path, target: Path) -> Path:
    """Install the project at ``source`` into ``target`` with pip, offline, from a copy (no build/ left behind)."""
    build = target.parent / f"build-{source.name}"
    shutil.copytree(source, build, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(build)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"pip install of {source} failed:\n{result.stdout}\n{result.stderr}"
    return target

"""Every package devplug imports is declared: deptry, run by make lint, checks the package against pyproject.toml."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

pytest.importorskip("deptry", reason="deptry is in the dev extra: pip install -e '.[dev]'")


def _deptry(root: Path) -> tuple[int, str]:
    """deptry's exit status and what it printed, without colours."""
    result = subprocess.run([sys.executable, "-m", "deptry", "."], capture_output=True, text=True, cwd=root,
                            timeout=120)
    return result.returncode, re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def _copy(tmp_path: Path) -> Path:
    """The package and its pyproject.toml, alone in a folder (what the check reads)."""
    root = tmp_path / "project"
    shutil.copytree(REPO / "devplug", root / "devplug", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_make_lint_runs_the_dependency_check():
    lint = (REPO / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "-m deptry ." in lint


def test_every_import_of_the_package_is_declared(tmp_path):
    status, output = _deptry(_copy(tmp_path))
    assert status == 0 and "No dependency issues found" in output, output


def test_an_undeclared_import_fails_the_check(tmp_path):
    """The mistake that shipped a wheel that could not import: numpy imported, declared nowhere."""
    root = _copy(tmp_path)
    project = root / "pyproject.toml"
    project.write_text(re.sub(r'"numpy>=[\d.]+",? ?', "", project.read_text()))
    status, output = _deptry(root)
    assert status == 1, output
    # DEP001 where numpy is not installed, DEP003 where another package brought it: either way, not declared
    assert re.search(r"devplug/core/data/images\.py:\d+:\d+: DEP00[13] 'numpy' imported but", output), output

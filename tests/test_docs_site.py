"""`make docs`: the documentation site builds with MkDocs in strict mode (a broken link or reference fails)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

REPO = Path(__file__).resolve().parents[1]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, env=env, cwd=root, timeout=300)


def test_the_site_builds_strict_with_the_api_reference_and_the_hook_reference(tmp_path):
    result = _build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr
    api = (tmp_path / "site" / "reference" / "devplug" / "index.html").read_text()
    assert "TrainerConfig" in api and "Everything a" in api  # rendered from the class docstring
    hooks = (tmp_path / "site" / "hooks" / "index.html").read_text()
    assert 'id="devplug_log"' in hooks


@pytest.mark.parametrize(("page", "broken"), [
    ("index.md", "\nSee [nowhere](missing.md).\n"),
    ("reference/devplug.md", "\n::: devplug.NoSuchThing\n"),
])
def test_a_broken_link_or_reference_fails_the_build(tmp_path, page, broken):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    (root / "docs" / page).write_text((root / "docs" / page).read_text() + broken)
    result = _build(root, tmp_path / "site")
    assert result.returncode != 0

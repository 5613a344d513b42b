"""`make docs`: the documentation site builds with MkDocs in strict mode (a broken link or reference fails)."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")



def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, env=env, cwd=root, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for the tests that read it."""
    site = tmp_path_factory.mktemp("site")
    result = _build(REPO, site)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr
    return site


def test_the_site_builds_strict_with_the_api_reference_and_the_hook_reference(site):
    api = (site / "reference" / "devplug" / "index.html").read_text()
    assert "TrainerConfig" in api and "Everything a" in api  # rendered from the class docstring
    hooks = (site / "hooks" / "index.html").read_text()
    assert 'id="devplug_log"' in hooks


# Each public module, and the reference page that must render every name of its __all__.
REFERENCE_PAGES = {"devplug": "reference/devplug", "devplug.toolkit": "reference/toolkit",
                   "devplug.testing": "reference/testing"}


@pytest.mark.parametrize("module", sorted(REFERENCE_PAGES))
def test_every_public_name_has_an_entry_in_the_rendered_reference(site, module):
    page = (site / REFERENCE_PAGES[module] / "index.html").read_text()
    rendered = set(re.findall(r'id="([\w.]+)"', page))
    missing = [name for name in importlib.import_module(module).__all__ if f"{module}.{name}" not in rendered]
    assert not missing, f"docs/{REFERENCE_PAGES[module]}.md renders no entry for {missing}: add a ::: directive"


def test_the_trainer_reference_shows_the_loop_methods(site):
    page = (site / "reference" / "devplug" / "index.html").read_text()
    for method in ("setup", "optimizer", "dataloader", "autocast", "accumulate", "backward", "clip_grad_norm",
                   "step", "log", "epochs", "save", "resume", "summary"):
        assert f'id="devplug.Trainer.{method}"' in page, f"the Trainer reference lost {method}"


_ROLE = re.compile(r":(?:func|meth|class|data|attr|mod|exc|obj|ref|py:\w+):`")


def test_no_sphinx_role_prints_literally_on_the_site(site):
    """Docstrings are Markdown (`name` in backticks): a Sphinx role would print as `` text."""
    shown = {str(path.relative_to(site)): _ROLE.findall(path.read_text())
             for path in site.rglob("*.html") if _ROLE.search(path.read_text())}
    assert not shown, f"Sphinx roles print literally on {shown}"


def test_docstrings_use_markdown_not_sphinx_roles():
    """The same rule at the source, so a new docstring is caught before the site is built."""
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in (REPO / "devplug").rglob("*.py")
                 if path.name != "docgen.py"  # it converts roles in text it is given
                 for n, line in enumerate(path.read_text().splitlines(), 1) if _ROLE.search(line)]
    assert not offenders, f"write `name`, not a Sphinx role: {offenders}"


def test_no_page_is_an_empty_stub(site):
    for page in site.rglob("index.html"):
        if page.parent == site / "search" or page.parent.name == "404":
            continue
        body = re.search(r'<article[^>]*>(.*?)</article>', page.read_text(), re.S)
        assert body, page
        text = re.sub(r"<[^>]+>|\s+", " ", body.group(1)).strip()
        assert len(text) > 400, f"{page.relative_to(site)} is nearly empty: {text[:200]!r}"


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

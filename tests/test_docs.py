"""The hook reference is generated from the hookspec docstrings and must not drift from them."""

import inspect
from pathlib import Path

from devplug.core import hookspecs
from devplug.core.hookdoc import render_hook_reference

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_hook_reference_matches_hookspec_docstrings():
    assert (DOCS / "hooks.md").read_text() == render_hook_reference(), (
        "docs/hooks.md is stale: run `python -m devplug.core.hookdoc > docs/hooks.md`"
    )


def test_every_hook_documents_when_called_and_what_it_returns():
    for name, fn in vars(hookspecs).items():
        if name.startswith("devplug_") and inspect.isfunction(fn):
            doc = inspect.getdoc(fn) or ""
            assert "first-result" in doc.lower(), f"{name} must say whether it is first-result"
            assert "return" in doc.lower() or "Returns" in doc, f"{name} must say what it returns"


def test_docs_link_to_files_that_exist():
    import re

    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"

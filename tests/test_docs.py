"""The hook reference is generated from the hookspec docstrings and must not drift from them."""

import inspect
from pathlib import Path

from devplug import docgen
from devplug.core import hookspecs

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_generated_docs_match_the_code():
    for path, text in docgen.outputs(DOCS).items():
        assert path.read_text() == text, f"{path} is stale: run `python -m devplug.docgen`"


def test_plugins_page_tables_are_generated_from_the_contract_and_the_kit():
    page = (DOCS / "plugins.md").read_text()
    for fn in hookspecs.HOOKS:
        assert f"| [`{fn.__name__}`](hooks.md#{fn.__name__}) |" in page
    assert "| `test_optimizer[adam/adamw/sgd]` | `devplug_optimizer` |" in page


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

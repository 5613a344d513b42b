"""Every stand-in class and function that models vendor behaviour cites the vendor source it mirrors.

A stand-in is only as good as its fidelity, so each module names the vendor repository and release it
mirrors, and each class, function and public method cites the file lines (``line N`` / ``lines N-M``)
of the behaviour it encodes, or says where the vendor's code is not public.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

STANDINS = Path(__file__).resolve().parents[2] / "standins"
VENDOR_PACKAGES = [STANDINS / "hpu_standin" / "habana_frameworks", STANDINS / "hpu_standin" / "habana_dataloader",
                   STANDINS / "apex_standin" / "apex" / "optimizers"]
MODULES = sorted(p for root in VENDOR_PACKAGES for p in root.rglob("*.py"))
CITATION = re.compile(r"\blines? \d+|not public")
REPOSITORY = re.compile(r"(HabanaAI/gaudi-pytorch-bridge|NVIDIA/apex|Lightning-AI/pytorch-lightning)")


def _documented(path: Path) -> list[tuple[str, str]]:
    """(qualified name, docstring) of every module-level class and function and every public method."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            found.append((node.name, ast.get_docstring(node) or ""))
        if isinstance(node, ast.ClassDef):
            found += [(f"{node.name}.{item.name}", ast.get_docstring(item) or "") for item in node.body
                      if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")]
    return found


def test_the_stand_ins_are_found():
    assert len(MODULES) >= 12


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(STANDINS)))
def test_every_vendor_behaviour_in_a_stand_in_cites_its_source(path):
    definitions = _documented(path)
    if not definitions:  # a package marker with no behaviour of its own
        return
    module_doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    docs = module_doc + " ".join(doc for _, doc in definitions)
    assert REPOSITORY.search(" ".join(docs.split())), f"{path.name} names no vendor repository"
    uncited = [name for name, doc in definitions if not CITATION.search(" ".join(doc.split()))]
    assert uncited == []

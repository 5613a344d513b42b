"""The contract version has one source, ``devplug.CONTRACT_VERSION``: every built-in plugin speaks it by name,
and the template plugin and the docs quote it as written out by ``python -m devplug.docgen``."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from paths import REPO

import devplug
from devplug.core.registry.manager import BUILTIN_PLUGINS

TEMPLATE = REPO / "examples" / "template_plugin"


def _declaration(path: Path) -> ast.expr:
    """The value assigned to ``DEVPLUG_CONTRACT`` at module level in ``path``."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEVPLUG_CONTRACT" for t in node.targets):
            return node.value
    raise AssertionError(f"{path} declares no DEVPLUG_CONTRACT")


@pytest.mark.parametrize(("name", "module"), BUILTIN_PLUGINS)
def test_every_builtin_plugin_speaks_the_contract_by_name(name, module):
    loaded = importlib.import_module(module)
    assert loaded.DEVPLUG_CONTRACT == devplug.CONTRACT_VERSION, name
    value = _declaration(Path(loaded.__file__))
    assert isinstance(value, ast.Name) and value.id == "CONTRACT_VERSION", f"{module} repeats the version as a literal"


def test_the_version_is_written_once_in_the_package():
    literals = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "devplug").rglob("*.py"))
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if re.match(r'\s*(DEVPLUG_CONTRACT|CONTRACT_VERSION)\s*=\s*["\']', line)]
    assert [place.split(":")[0] for place in literals] == ["devplug/core/contract/records.py"], literals


def test_every_template_plugin_declares_the_current_contract():
    """A third-party plugin states the contract it was written for, as a literal (docgen keeps the template's
    current); every module the template's entry points name does."""
    table = (TEMPLATE / "pyproject.toml").read_text().rsplit("[project.entry-points.devplug]", 1)[1].split("\n[", 1)[0]
    modules = re.findall(r'^\w+ = "([\w.]+)"', table, flags=re.MULTILINE)
    assert len(modules) == 2, table
    for module in modules:
        path = TEMPLATE / "src" / Path(*module.split(".")).with_suffix(".py")
        value = _declaration(path)
        assert isinstance(value, ast.Constant) and value.value == devplug.CONTRACT_VERSION, (path, ast.dump(value))


def test_the_guide_to_adding_a_hook_names_the_trainers_real_hook_caller():
    """docs/plugins.md, "Changing the contract": the caller it shows is an attribute the Trainer has."""
    from devplug.core.registry.devices import DeviceHooks

    section = (REPO / "docs" / "plugins.md").read_text().split("## Changing the contract", 1)[1]
    called = re.findall(r"`self\.(\w+)\(hookspecs\.", section)
    assert called, section[:400]
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=())
    for name in called:
        assert isinstance(getattr(trainer, name, None), DeviceHooks), f"the Trainer has no hook caller {name!r}"

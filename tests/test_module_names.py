"""Names say what a module does, once: no two core modules share a name, and the built-in plugins name the
module of one job alike."""

from __future__ import annotations

from collections import Counter

from paths import REPO

CORE = REPO / "devplug" / "core"
PLUGINS = REPO / "devplug" / "plugins"


def test_no_two_core_modules_share_a_name():
    names = Counter(path.name for path in CORE.rglob("*.py") if path.name != "__init__.py")
    assert [name for name, count in names.items() if count > 1] == []


def test_the_plugins_modules_for_peak_flops_have_one_name():
    modules = sorted(str(path.relative_to(PLUGINS)) for path in PLUGINS.glob("*/peak*.py"))
    assert modules and all(module.endswith("/peaks.py") for module in modules), modules

"""The codebase's boundaries: built-ins registered from their modules, a public API enforced by lint, no import
cycle in the core, one place to add a hook."""

from __future__ import annotations

import ast
import collections
import contextlib
import inspect
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from paths import REPO

import devplug
from devplug import cli
from devplug.core.contract import hookspecs
from devplug.core.registry.manager import BUILTIN_PLUGINS, create_plugin_manager
from devplug.testing.checks import uncovered_hooks

CORE = REPO / "devplug" / "core"


def test_a_hook_added_to_a_builtin_plugin_module_is_called(monkeypatch):
    from devplug.plugins.cpu import plugin as cpu_plugin

    entered = []

    class Region:
        def __enter__(self):
            entered.append("in")

        def __exit__(self, *exc):
            return False

    @devplug.hookimpl
    def devplug_region(device, name):
        return Region()

    monkeypatch.setattr(cpu_plugin, "devplug_region", devplug_region, raising=False)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=create_plugin_manager(autoload=False))
    with trainer.autocast():
        pass
    assert entered == ["in"]


def test_builtin_plugins_are_their_implementation_modules():
    for _name, module in BUILTIN_PLUGINS:
        assert module.endswith(".plugin")
        package = module.rsplit(".", 1)[0]
        tree = ast.parse((REPO / Path(*package.split(".")) / "__init__.py").read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not imports, f"{package} re-exports hooks; devplug registers {module} directly"


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("where", ["examples/bad_example.py", "devplug/plugins/cpu/bad.py", "benchmarks/bad.py"])
def test_the_lint_rule_rejects_core_imports_outside_the_core(where):
    source = ("from devplug.core.data.torch_loader import list_images\nimport devplug.core.registry.manager\n\n"
              "print(list_images)\n")
    result = subprocess.run([*_ruff(), "check", "--no-cache", "--select", "TID251", "--stdin-filename", where, "-"],
                            input=source, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("TID251") == 2 and "devplug.core is private" in result.stdout


def test_the_lint_rule_allows_the_public_api_and_the_core_itself():
    source = "from devplug import toolkit\nfrom devplug.core import records\n\nprint(toolkit, records)\n"
    for where, expected in (("examples/good.py", 1), ("devplug/core/good.py", 0)):
        result = subprocess.run([*_ruff(), "check", "--no-cache", "--select", "TID251", "--stdin-filename", where,
                                 "-"], input=source, capture_output=True, text=True, cwd=REPO)
        assert result.returncode == expected, result.stdout  # examples may import devplug.toolkit, not the core


#: The core's feature packages, lowest first: a package imports only from the packages before it (and the leaves).
CORE_LAYERS = ("precision", "contract", "data", "optim", "fallback", "registry", "checkpoint", "observe", "distributed",
               "loop")
#: The small modules at the core's root that every feature package may use; they import none of the packages.
CORE_LEAVES = {"errors", "validators", "tree", "log_once"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """devplug modules ``path`` imports at any level (lazy and type-only imports included)."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], node.module or ""]).strip(".") \
                if node.level else (node.module or "")
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module in known and module != name}


def _import_graph() -> dict[str, set[str]]:
    paths = sorted((REPO / "devplug").rglob("*.py"))
    known = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, known) for p in paths}


def test_no_import_circle_anywhere_in_devplug():
    graph = _import_graph()
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                pytest.fail("import circle: " + " -> ".join([*trail[trail.index(target):], target]))
            if not state.get(target):
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [module])


def test_the_core_is_feature_packages_and_a_few_leaves():
    modules = {p.stem for p in CORE.glob("*.py")} - {"__init__"}
    assert modules == CORE_LEAVES, f"modules at the core's root beyond the leaves: {sorted(modules - CORE_LEAVES)}"
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(CORE_LAYERS)
    for package in packages:
        tree = ast.parse((CORE / package / "__init__.py").read_text())
        assert len(tree.body) == 1 and ast.get_docstring(tree), f"core/{package}/__init__.py is not a docstring only"


def test_core_packages_import_only_from_the_packages_below_them():
    graph = _import_graph()
    for module, targets in graph.items():
        parts = module.split(".")
        if parts[:2] != ["devplug", "core"] or len(parts) < 3:
            continue
        own = parts[2]
        allowed = set(CORE_LEAVES) if own in CORE_LEAVES else {own, *CORE_LEAVES, *CORE_LAYERS[:CORE_LAYERS.index(own)]}
        for target in targets:
            target_parts = target.split(".")
            if target_parts[:2] != ["devplug", "core"]:
                assert target in ("devplug.core", "devplug._version"), f"{module} imports {target}, above the core"
                continue
            if len(target_parts) > 2:
                assert target_parts[2] in allowed, f"{module} imports {target}, from a package above it"


def test_one_place_to_add_a_hook():
    operational = [fn.__name__ for fn in hookspecs.HOOKS if "device" in inspect.signature(fn).parameters]
    assert list(hookspecs.OPERATIONAL_HOOKS) == operational
    assert uncovered_hooks() == []
    assert hookspecs.HOOKS[0].__name__ == "devplug_register_devices"


def test_the_cli_does_not_swallow_an_internal_assertion(monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("an internal invariant failed")

    monkeypatch.setattr(cli, "devices_report", broken)
    with pytest.raises(AssertionError, match="internal invariant"):
        cli.main(["devices"])


def test_typed_hook_calls_return_the_specs_record():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    choice = trainer._hooks(hookspecs.devplug_optimizer, name="sgd", params=[torch.nn.Parameter(torch.zeros(1))],
                           options={"lr": 0.1})
    assert isinstance(choice, devplug.OptimizerChoice)
    with pytest.raises(TypeError, match="by keyword"):
        trainer._hooks(hookspecs.devplug_synchronize, trainer.device)  # type: ignore[call-arg]


def test_the_step_goes_through_pluggy_only_for_hooks_with_several_implementations():
    pm = create_plugin_manager(autoload=False)
    dispatched = []
    inner = pm._inner_hookexec
    pm._inner_hookexec = lambda name, *args: (dispatched.append(name), inner(name, *args))[1]
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    dispatched.clear()
    for _ in range(3):
        with trainer.autocast():
            loss = model(torch.ones(2, 3)).sum()
        trainer.backward(loss)
        trainer.step(opt)
    assert dispatched == []  # region: the fallback alone answers; mark_step: nobody implements it on cpu

    class Counting:
        marks = 0

        @devplug.hookimpl
        def devplug_mark_step(self, device, phase):
            Counting.marks += 1

    counted = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=create_plugin_manager(autoload=False, extra_plugins=[Counting()]))
    counted.backward(counted.setup(torch.nn.Linear(3, 1))(torch.ones(2, 3)).sum())
    assert Counting.marks == 1  # a neutral plugin's hook is still called


@contextlib.contextmanager
def _count_hook_calls() -> Iterator[collections.Counter]:
    # every hook implementation that runs, whatever route the Trainer resolved for it (pluggy's dispatch or a
    # direct call): their functions are the ones named devplug_*
    calls: collections.Counter = collections.Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name.startswith("devplug_"):
            calls[frame.f_code.co_name] += 1

    sys.setprofile(count)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def test_a_cpu_step_calls_no_hook_that_only_the_fallback_answers():
    # count_flops=False: the one-time peak-FLOPs question at step 2 is not a per-step call
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=(), count_flops=False)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.ones(8, 3), torch.ones(8, 1)), 2,
                                num_workers=0)
    with _count_hook_calls() as calls:
        for _ in trainer.epochs(1):
            for x, y in loader:
                with trainer.autocast():
                    loss = torch.nn.functional.mse_loss(model(x), y)
                trainer.backward(loss)
                trainer.step(opt)
    # one move per batch; no region (the fallback marks none), no mark_step (eager), no context of theirs;
    # once, when the loop ends, a synchronize: the run's rate then covers the steps after the last log point
    assert dict(calls) == {"devplug_to_device": 4, "devplug_synchronize": 1}
    trainer.close()


def test_a_plugin_that_marks_regions_is_called_for_each_region():
    class Marking:
        names: list[str] = []

        @devplug.hookimpl
        def devplug_region(self, device, name):
            Marking.names.append(name)
            return contextlib.nullcontext()

    pm = create_plugin_manager(autoload=False, extra_plugins=[Marking()])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    with trainer.autocast():
        loss = model(torch.ones(2, 3)).sum()
    trainer.backward(loss)
    trainer.step(opt)
    assert Marking.names == ["forward", "backward", "optimizer_step"]


def _documented_trainer_names() -> set[str]:
    """Names docs/trainer.md's Methods section documents: every call it shows, and its list of properties."""
    text = (REPO / "docs" / "trainer.md").read_text()
    start = text.index("## Methods")
    section = text[start:text.index("\n## ", start + 1)]
    methods, properties = section.split("- Properties:")
    properties = properties.split("\n\n")[0]
    while "(" in properties:  # what a property's parentheses say about it is not a name
        properties = re.sub(r"\([^()]*\)", "", properties)
    return set(re.findall(r"`(\w+)\(", methods)) | set(re.findall(r"`(\w+)`", properties))


def test_the_trainers_public_attributes_are_exactly_the_documented_ones():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=())
    public = {name for name in dir(trainer) if not name.startswith("_")}
    documented = _documented_trainer_names()
    assert public - documented == set(), "public but not documented in docs/trainer.md"
    assert documented - public == set(), "documented in docs/trainer.md but not a Trainer attribute"

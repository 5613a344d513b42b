"""devplug's Gaudi choices checked against Habana's own clients, lightning-habana and optimum-habana.

Both install from PyPI (``pip install --no-deps lightning-habana==1.6.0 optimum-habana==1.21.2``) but
need the Gaudi bridge to import, so these tests read their installed sources and check the practice
devplug copies: ``mark_step()`` after every backward, also inside gradient accumulation, and the
conditions under which HabanaDataLoader runs aeon (8 workers, pinned memory, no shuffle). They skip
where the clients are not installed.
"""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import pytest

from devplug.plugins.hpu import data


def client_source(distribution: str, version: str, path: str) -> str:
    try:
        found = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed (pip install --no-deps {distribution}=={version})")
    if found.version != version:
        pytest.skip(f"{distribution} {found.version} installed; these checks read {version}")
    return Path(found.locate_file(path)).read_text()


def method(source: str, cls: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not found")


def calls(node: ast.AST) -> list[str]:
    return [ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)]


def test_lightning_habana_marks_the_step_after_backward_and_after_the_optimizer_step():
    source = client_source("lightning-habana", "1.6.0", "lightning_habana/pytorch/strategies/single.py")
    assert "htcore.mark_step" in calls(method(source, "SingleHPUStrategy", "on_after_backward"))
    assert "htcore.mark_step" in calls(method(source, "SingleHPUStrategy", "optimizer_step"))


def test_optimum_habana_marks_the_step_after_every_micro_batch_not_only_at_the_sync_step():
    source = client_source("optimum-habana", "1.21.2", "optimum/habana/transformers/trainer.py")
    loop = source[source.index("tr_loss_step = self.training_step("):]
    micro_batch = loop[: loop.index("if do_sync_step:")]
    assert "self.htcore.mark_step()" in micro_batch  # before, and outside, the optimizer-step branch


def test_lightning_habana_runs_habana_dataloader_with_the_aeon_conditions_devplug_predicts():
    source = client_source("lightning-habana", "1.6.0", "lightning_habana/pytorch/datamodule/datamodule.py")
    setup = ast.unparse(method(source, "HPUDataModule", "setup"))
    assert f"self.num_workers != {data.AEON_WORKERS}" in setup
    assert "self.pin_memory is False" in setup and "self.shuffle is True" in setup

"""The checkpoint-format seam: a format is one class plus one registration, and a Trainer saves, resumes and
prunes through it without any other change."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import devplug
from devplug.core.checkpoint.format import TrainingRun, format_names, format_of, unregister_format
from devplug.core.checkpoint.plain import PlainFile
from devplug.core.checkpoint.sharded_folder import ShardedFolder
from devplug.toolkit import CheckpointFormat, register_checkpoint_format


class JsonAndTensors(CheckpointFormat):
    """A toy format: a folder holding a JSON description and the canonical state in one torch file."""

    name = "toy-json-pt"
    saves: list[Path] = []  # what every instance saved, for the test to check
    loads: list[Path] = []

    def save(self, run: TrainingRun, path: Path, extra: Mapping[str, Any], *, main: bool,
             async_save: bool = False) -> str | None:
        if not main:
            return None
        staging = path.parent / f".{path.name}.toy-partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        run.save(staging / "state.pt", extra)  # the canonical state, checked and digested as a plain file is
        (staging / "about.json").write_text(json.dumps({"format": self.name, "extra": sorted(extra)}))
        os.replace(staging, path)
        type(self).saves.append(path)
        return str(path)

    def load(self, run: TrainingRun, path: Path) -> dict[str, Any]:
        type(self).loads.append(path)
        return run.load(path / "state.pt")

    def recognises(self, path: Path) -> bool:
        about = path / "about.json"
        return about.is_file() and json.loads(about.read_text()).get("format") == self.name


@pytest.fixture
def toy_format() -> Iterator[type[JsonAndTensors]]:
    register_checkpoint_format(JsonAndTensors)  # the one registration line
    JsonAndTensors.saves, JsonAndTensors.loads = [], []
    yield JsonAndTensors
    unregister_format(JsonAndTensors.name)


def _run(folder: Path, steps: int, *, resume: bool = False) -> tuple[devplug.Trainer, torch.nn.Module, Any]:
    policy = devplug.CheckpointPolicy(directory=folder, every_n_steps=2, keep_last=2)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              checkpoint_format="toy-json-pt", stop_signals=(), count_flops=False, log_every=1000)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("adam", model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(24, 3, generator=g), torch.randn(24, 1, generator=g))
    loader = trainer.dataloader(data, 2, num_workers=0)
    resumed = trainer.resume() if resume else None
    for _ in trainer.epochs(1, max_steps=steps):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
    trainer.close()
    return trainer, model, resumed


def test_a_registered_format_saves_resumes_and_prunes_a_trainer(tmp_path, toy_format):
    folder = tmp_path / "ckpt"
    _, reference, _ = _run(tmp_path / "reference", 8)
    _run(folder, 6)
    assert sorted(p.name for p in folder.glob("step_*.pt")) == ["step_0000004.pt", "step_0000006.pt"]  # 2 pruned
    assert all((p / "about.json").is_file() and p.is_dir() for p in folder.glob("step_*.pt"))
    assert [p.name for p in toy_format.saves[-3:]] == ["step_0000002.pt", "step_0000004.pt", "step_0000006.pt"]
    assert isinstance(format_of(folder / "step_0000006.pt"), toy_format)

    trainer, resumed_model, resumed = _run(folder, 8, resume=True)
    assert toy_format.loads == [folder / "step_0000006.pt"]
    assert resumed is not None and resumed.step == 6
    assert trainer.global_step == 8
    assert sorted(p.name for p in folder.glob("step_*.pt")) == ["step_0000006.pt", "step_0000008.pt"]
    for mine, theirs in zip(resumed_model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)  # a resumed run continues bitwise


def test_the_built_in_formats_are_chosen_by_the_strategy_and_recognise_their_own(tmp_path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=())
    assert isinstance(trainer._keeper.format, PlainFile) and not trainer._keeper.format.collective
    assert format_names()[:2] == ("plain", "sharded") and ShardedFolder.collective
    model = trainer.setup(torch.nn.Linear(2, 1))
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    path = Path(trainer.save(tmp_path / "one.pt"))
    assert isinstance(format_of(path), PlainFile) and not ShardedFolder().recognises(path)
    assert isinstance(format_of(tmp_path), ShardedFolder)  # a folder no format recognises: the sharded folder says why
    with pytest.raises(devplug.CheckpointError, match="not a complete sharded checkpoint"):
        trainer.load(tmp_path)


def test_an_unknown_or_taken_format_name_is_one_line(toy_format):
    with pytest.raises(devplug.ConfigError, match="checkpoint_format"):
        devplug.Trainer(device="cpu", progress=False, checkpoint_format="nope")
    with pytest.raises(devplug.ConfigError, match="already registered"):
        register_checkpoint_format(type("Clash", (JsonAndTensors,), {"name": "plain"}))

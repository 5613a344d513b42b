"""Saves that could never be loaded back are refused before anything is written: a value in ``extra`` (or in a
registered object's state) that ``torch.load(weights_only=True)`` does not read, or a path that is no file."""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import pytest
import torch

import devplug


def _trainer(**kwargs) -> tuple[devplug.Trainer, torch.optim.Optimizer]:
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, stop_signals=(),
                              count_flops=False, log_every=1000, **kwargs)
    model = trainer.setup(torch.nn.Linear(3, 1))
    return trainer, trainer.optimizer("sgd", model.parameters(), lr=0.1)


@pytest.mark.parametrize(("value", "named"), [(np.float64(0.5), "numpy"), (np.arange(3), "numpy.ndarray"),
                                              (pathlib.Path("data"), "pathlib"), (object(), "builtins.object"),
                                              (collections.defaultdict(int, a=1), "collections.defaultdict")])
def test_an_extra_a_load_would_refuse_is_refused_at_the_save(tmp_path, value, named):
    trainer, _opt = _trainer()
    target = tmp_path / "last.pt"
    with pytest.raises(devplug.CheckpointError, match=rf"extra 'best'.*{named}.*could never be loaded") as info:
        trainer.save(target, epoch_seen=3, best=value)
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file
    trainer.save(target, epoch_seen=3, best=float(value) if named == "numpy" else 0.5)  # plain values load
    assert trainer.load(target)["epoch_seen"] == 3


class _NumpyState:
    """An author's object whose state holds a numpy array (numpy's RNG state, say)."""

    def state_dict(self):
        return {"rng": np.random.default_rng(0).bit_generator.state, "seen": np.int64(4)}

    def load_state_dict(self, state):
        pass


def test_a_policy_run_whose_registered_state_cannot_load_stops_at_its_first_save(tmp_path):
    folder = tmp_path / "ckpt"
    trainer, opt = _trainer(checkpoints=devplug.CheckpointPolicy(directory=folder, every_n_steps=2))
    trainer.register_for_checkpointing(sampler_state=_NumpyState())
    params = [p for group in opt.param_groups for p in group["params"]]
    with pytest.raises(devplug.CheckpointError, match="extra 'sampler_state' holds numpy"):
        for _ in trainer.epochs(1, max_steps=4):
            for x in trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(8, 3)), 2, num_workers=0):
                trainer.backward((x[0] @ params[0].T).sum())
                trainer.step(opt)
    trainer.close()
    assert not list(folder.glob("step_*.pt")) and not list(folder.glob(".*.tmp"))


def test_a_save_to_a_folder_or_under_a_file_is_one_line(tmp_path):
    trainer, _opt = _trainer()
    with pytest.raises(devplug.CheckpointError, match="it is a folder; give a file's path"):
        trainer.save(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(devplug.CheckpointError, match=r"notes\.txt' is a file, not a folder"):
        trainer.save(tmp_path / "notes.txt" / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]

"""keep_best ranks checkpoints by the monitored value of their own weights, whatever ``log_every`` is.

Each kept file is loaded and evaluated again here: the truly best checkpoint of the run must be kept, and the
score written beside it must be its own evaluation, for the README loop (evaluation at each epoch's end) and
docs/trainer.md's "evaluate every N steps" recipe.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import devplug

#: Training pulls the weight from 0 towards 2; the validation targets sit at 1, so val_loss falls, then rises:
#: the best weights are in the middle of the run, neither the first nor the last checkpoint.
TRAIN_SLOPE, VAL_SLOPE = 2.0, 1.0


def _data(slope: float, n: int, seed: int) -> torch.utils.data.TensorDataset:
    x = torch.randn(n, 1, generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.TensorDataset(x, slope * x)


def _val_loss(model: torch.nn.Module, val: torch.utils.data.TensorDataset) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(val.tensors[0]), val.tensors[1]))


def _run(folder: Path, *, log_every: int, every: int | None, epochs: int = 8, batches: int = 4
         ) -> tuple[dict[int, float], torch.utils.data.TensorDataset]:
    """The README loop (``every=None``: evaluation at each epoch's end) or the every-N-steps recipe."""
    policy = devplug.CheckpointPolicy(directory=folder, every_n_steps=every or batches, keep_last=1, keep_best=2,
                                      monitor="val_loss", mode="min")
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, log_every=log_every, loggers=[])
    model = trainer.setup(torch.nn.Linear(1, 1, bias=False))
    torch.nn.init.zeros_(model.weight)
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.03)
    train, val = _data(TRAIN_SLOPE, batches * 4, 0), _data(VAL_SLOPE, 32, 1)
    loader = trainer.dataloader(train, 4, num_workers=0)
    evaluated: dict[int, float] = {}  # step -> val_loss of the weights after that step
    for _ in trainer.epochs(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            if trainer.step(opt) and every is not None and trainer.global_step % every == 0:
                evaluated[trainer.global_step] = _val_loss(model, val)
                trainer.log(val_loss=torch.tensor(evaluated[trainer.global_step]))
            trainer.log(loss=loss)
        if every is None:
            evaluated[trainer.global_step] = _val_loss(model, val)
            trainer.log(val_loss=torch.tensor(evaluated[trainer.global_step]))
    trainer.close()
    return evaluated, val


def _own_evaluation(path: Path, val: torch.utils.data.TensorDataset) -> float:
    model = torch.nn.Linear(1, 1, bias=False)
    model.load_state_dict(torch.load(path, weights_only=True)["modules"]["linear"])
    return _val_loss(model, val)


@pytest.mark.parametrize("every", [None, 2, 5], ids=["readme-loop", "every-2-steps", "every-5-steps"])
@pytest.mark.parametrize("log_every", [1, 3, 5, 50])
def test_the_truly_best_checkpoints_are_kept_and_scored_with_their_own_weights(tmp_path, every, log_every):
    evaluated, val = _run(tmp_path / "ckpt", log_every=log_every, every=every)
    best_two = sorted(evaluated, key=evaluated.__getitem__)[:2]
    last = 32  # 8 epochs of 4 steps: the end-of-run checkpoint (evaluated only where the schedule says)
    assert min(best_two) > min(evaluated) and last not in best_two  # the run is a real test of the ranking
    kept = {int(p.stem.split("_")[1]): p for p in (tmp_path / "ckpt").glob("step_*.pt")}
    assert set(kept) == {*best_two, last}
    scores = json.loads((tmp_path / "ckpt" / "checkpoints.json").read_text())
    assert set(scores) == {p.name for step, p in kept.items() if step in evaluated}  # the last one too, if evaluated
    for step, path in kept.items():
        own = _own_evaluation(path, val)
        if step in evaluated:
            assert own == pytest.approx(evaluated[step], rel=1e-6)
            assert scores[path.name] == pytest.approx(own, rel=1e-6)


def test_a_checkpoint_without_a_value_at_its_step_is_unscored_and_the_scored_best_stays(tmp_path):
    # evaluation every 2 steps, checkpoints every 3: only steps 6, 12, ... have a value of their own
    policy = devplug.CheckpointPolicy(directory=tmp_path, every_n_steps=3, keep_last=1, keep_best=1,
                                      monitor="val_loss", at_end=False)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, log_every=1, loggers=[])
    model = trainer.setup(torch.nn.Linear(1, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.0)
    values = {2: 5.0, 4: 4.0, 6: 1.0, 8: 0.5, 10: 3.0, 12: 2.0}
    for _ in trainer.epochs(1):
        for (x,) in trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(13, 1)), 1, num_workers=0):
            trainer.backward(model(x).sum())
            if trainer.step(opt) and trainer.global_step in values:
                trainer.log(val_loss=values[trainer.global_step])
    trainer.close()
    assert json.loads((tmp_path / "checkpoints.json").read_text()) == {"step_0000006.pt": 1.0,
                                                                      "step_0000012.pt": 2.0}
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_0000006.pt", "step_0000012.pt"]


def test_a_monitor_never_logged_is_one_warning(tmp_path):
    policy = devplug.CheckpointPolicy(directory=tmp_path, every_n_steps=2, keep_last=1, keep_best=1,
                                      monitor="val_los")
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, loggers=[])
    model = trainer.setup(torch.nn.Linear(1, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(8, 1)), 1, num_workers=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in trainer.epochs(2):
            for (x,) in loader:
                trainer.backward(model(x).sum())
                trainer.step(opt)
                trainer.log(val_loss=1.0)
        trainer.close()
    about = [w for w in caught if "val_los" in str(w.message)]
    assert len(about) == 1, [str(w.message) for w in caught]
    assert "never logged" in str(about[0].message) and "trainer.log(val_los=" in str(about[0].message)


class _Recorder:
    """A logger that keeps every value of every point."""

    def __init__(self) -> None:
        self.points: list[tuple[int, dict[str, float]]] = []

    def devplug_log(self, point) -> None:
        if point.values:
            self.points.append((point.step, dict(point.values)))


class _Jumpy(torch.nn.Module):
    """A linear classifier whose outputs move fast with its weights, so the accuracy changes every epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * 300.0


@pytest.mark.parametrize("log_every", [1, 3, 50])
def test_the_readme_loop_itself_keeps_its_best_epochs_scored_with_their_own_accuracy(tmp_path, monkeypatch,
                                                                                      log_every):
    from dist_scripts.common import documented_loop

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1024 + 500, 8, generator=g), torch.randint(0, 3, (1024 + 500,), generator=g)
    y[::2] = (x[::2] @ torch.randn(8, 3, generator=g)).argmax(dim=1)
    train_set, val_set = (torch.utils.data.TensorDataset(x[:1024], y[:1024]),
                          torch.utils.data.TensorDataset(x[1024:], y[1024:]))
    recorder = _Recorder()
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=8, keep_last=1, keep_best=2,
                                      monitor="val_accuracy", mode="max")  # 8 steps per epoch
    code = documented_loop().replace("log_every=50,", "log_every=LOG_EVERY, checkpoints=POLICY, loggers=[RECORDER],"
                                     " progress=False,")
    assert "checkpoints=POLICY" in code
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace = {"MyNet": _Jumpy, "train_set": train_set, "val_set": val_set, "LOG_EVERY": log_every,
                 "POLICY": policy, "RECORDER": recorder}
    exec(compile(code, "README.md", "exec"), namespace)
    namespace["trainer"].close()
    accuracy = {step: values["val_accuracy"] for step, values in recorder.points if "val_accuracy" in values}
    assert sorted(accuracy) == list(range(8, 81, 8))  # one per epoch, each at its own step, as logged
    assert len(set(accuracy.values())) > 3  # the accuracy moves: the ranking is a real one
    kept = {int(p.stem.split("_")[1]): p for p in (tmp_path / "ckpt").glob("step_*.pt")}
    scores = json.loads((tmp_path / "ckpt" / "checkpoints.json").read_text())
    assert set(scores) == {p.name for p in kept.values()}
    best_two = [step for step, _ in sorted(accuracy.items(), key=lambda item: (-item[1], -item[0]))[:2]]
    assert set(kept) == {*best_two, 80}  # the two best epochs (ties: the newer) and the newest
    for step, path in kept.items():
        model = _Jumpy()
        model.load_state_dict(torch.load(path, weights_only=True)["modules"]["_jumpy"])
        with torch.no_grad():
            own = (model(val_set.tensors[0]).argmax(dim=1) == val_set.tensors[1]).double().mean().item()
        assert scores[path.name] == pytest.approx(own, abs=1e-6) == accuracy[step]


def test_a_resumed_run_with_nothing_left_to_train_does_not_say_its_monitor_was_never_logged(tmp_path):
    _run(tmp_path, log_every=1, every=None, epochs=2)  # a finished run: its checkpoints are scored
    assert json.loads((tmp_path / "checkpoints.json").read_text())
    policy = devplug.CheckpointPolicy(directory=tmp_path, every_n_steps=4, keep_last=1, keep_best=2,
                                      monitor="val_loss", mode="min")
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, loggers=[])
    model = trainer.setup(torch.nn.Linear(1, 1, bias=False))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.03)
    loader = trainer.dataloader(_data(TRAIN_SLOPE, 16, 0), 4, num_workers=0)
    assert trainer.resume(tmp_path) is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in trainer.epochs(2):  # the same 2 epochs: nothing left to train
            for x, y in loader:
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                trainer.step(opt)
        trainer.close()
    assert not [str(w.message) for w in caught if "val_loss" in str(w.message)]

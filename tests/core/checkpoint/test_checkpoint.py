"""Checkpoints: round trip, resume equals an uninterrupted run, atomic writes, clear errors."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

import devplug
from devplug.core.checkpoint import file as ckpt
from devplug.core.errors import CheckpointError


def build(seed: int = 0, **options):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed, **options)
    torch.manual_seed(seed)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)))
    opt = trainer.optimizer("adam", model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(40, 5, generator=g), torch.randn(40, 1, generator=g))
    loader = trainer.dataloader(data, batch_size=4, shuffle=True, num_workers=0)
    return trainer, model, opt, loader


def train(trainer, model, opt, loader, *, epochs: int, max_steps: int | None = None):
    for _ in trainer.epochs(epochs, max_steps=max_steps):
        for x, y in loader:
            noise = torch.randn_like(x) * 0.01  # consumes the torch RNG, like a GAN's latent noise
            loss = torch.nn.functional.mse_loss(model(x + noise), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)


def test_round_trip_restores_modules_optimizers_counters_and_extra(tmp_path):
    trainer, model, opt, loader = build()
    train(trainer, model, opt, loader, epochs=1)
    path = trainer.save(tmp_path / "ck.pt", note="hello")
    fresh, fmodel, fopt, _ = build(seed=1)
    extra = fresh.load(path)
    assert extra == {"note": "hello"}
    assert fresh.global_step == trainer.global_step == 10 and fresh.epoch == 1
    for a, b in zip(model.state_dict().values(), fmodel.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fopt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_checkpoint_tensors_are_on_the_cpu(tmp_path):
    trainer, *_ = build()
    state = torch.load(trainer.save(tmp_path / "ck.pt"), weights_only=True)
    devices = set()
    from devplug.core.tree import map_tensors

    map_tensors(state, lambda t: devices.add(t.device.type))
    assert devices == {"cpu"}


@pytest.mark.parametrize("stop_at", [10, 13])  # an epoch boundary, and mid-epoch
def test_resume_gives_identical_weights_to_an_uninterrupted_run(tmp_path, stop_at):
    full, fmodel, fopt, floader = build()
    train(full, fmodel, fopt, floader, epochs=3)

    first, model, opt, loader = build()
    train(first, model, opt, loader, epochs=3, max_steps=stop_at)
    assert first.global_step == stop_at
    path = first.save(tmp_path / "ck.pt")

    resumed, rmodel, ropt, rloader = build(seed=7)  # different init: everything must come from the checkpoint
    resumed.load(path)
    train(resumed, rmodel, ropt, rloader, epochs=3)
    assert resumed.global_step == full.global_step == 30
    for a, b in zip(fmodel.state_dict().values(), rmodel.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_failure_mid_save_leaves_previous_checkpoint_loadable(tmp_path, monkeypatch):
    trainer, model, opt, loader = build()
    path = trainer.save(tmp_path / "ck.pt", generation=1)
    train(trainer, model, opt, loader, epochs=1)

    real_save = torch.save

    def crash_after_partial_write(obj, handle, *args, **kwargs):
        handle.write(b"partial garbage")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_after_partial_write)
    with pytest.raises(OSError, match="disk full"):
        trainer.save(path, generation=2)
    monkeypatch.setattr(torch, "save", real_save)
    assert build()[0].load(path) == {"generation": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]  # no temp file left behind


def test_corrupt_checkpoint_is_a_clear_error_and_changes_nothing(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00not a checkpoint")
    trainer, model, *_ = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        trainer.load(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        trainer.load(tmp_path / "missing.pt")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a devplug checkpoint"):
        trainer.load(tmp_path / "other.pt")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_mismatched_checkpoint_names_the_difference(tmp_path):
    trainer, *_ = build()
    path = trainer.save(tmp_path / "ck.pt")
    other = devplug.Trainer(device="cpu", progress=False)
    model = other.setup(torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Dropout(0.2), torch.nn.Linear(9, 1)))
    other.optimizer("adam", model.parameters())
    with pytest.raises(CheckpointError, match=r"does not match.*0.weight has shape \(8, 5\), model has \(9, 5\)"):
        other.load(path)


def test_atomic_save_replaces_target_in_one_step(tmp_path):
    target = tmp_path / "x.pt"
    ckpt.atomic_save({"a": torch.ones(2)}, target)
    ckpt.atomic_save({"a": torch.zeros(2)}, target)
    assert torch.equal(torch.load(target, weights_only=True)["a"], torch.zeros(2))


def test_mismatch_in_a_later_module_leaves_earlier_modules_untouched(tmp_path):
    trainer = devplug.Trainer(device="cpu", progress=False)
    trainer.setup(torch.nn.Linear(3, 3), name="a")
    trainer.setup(torch.nn.Linear(3, 3), name="b")
    path = trainer.save(tmp_path / "ck.pt")
    other = devplug.Trainer(device="cpu", progress=False)
    a = other.setup(torch.nn.Linear(3, 3), name="a")
    other.setup(torch.nn.Sequential(torch.nn.Linear(3, 3)), name="b")  # same shapes, other parameter names
    before = {k: v.clone() for k, v in a.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"module 'b': missing \['0.bias', '0.weight'\]"):
        other.load(path)
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())


BROKEN_STATES = [  # algorithm and options, the state entry that breaks, how, what the error says
    ("adam", {"amsgrad": True}, "max_exp_avg_sq", lambda t: t - t.max() - 1, "max_exp_avg_sq has negative values"),
    ("adamw", {}, "exp_avg_sq", lambda t: -t - 1, "exp_avg_sq has negative values"),
    ("adamax", {}, "exp_inf", lambda t: -t - 1, "exp_inf has negative values"),
    ("nadam", {}, "exp_avg_sq", lambda t: -t - 1, "exp_avg_sq has negative values"),
    ("radam", {}, "exp_avg_sq", lambda t: -t - 1, "exp_avg_sq has negative values"),
    ("adagrad", {}, "sum", lambda t: -t - 1, "sum has negative values"),
    ("rmsprop", {}, "square_avg", lambda t: -t - 1, "square_avg has negative values"),
    ("sgd", {"momentum": 0.9}, "momentum_buffer", lambda t: t / 0, "momentum_buffer holds NaN or infinity"),
]


@pytest.mark.parametrize(("algorithm", "options", "entry", "change", "expected"), BROKEN_STATES,
                         ids=[f"{b[0]}-{b[2]}" for b in BROKEN_STATES])
def test_a_state_that_breaks_its_algorithm_is_refused_before_anything_is_restored(tmp_path, algorithm, options, entry,
                                                                                    change, expected):
    def trainer_with(seed: int):
        trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed)
        torch.manual_seed(seed)
        model = trainer.setup(torch.nn.Linear(3, 2), "net")
        return trainer, model, trainer.optimizer(algorithm, model.parameters(), lr=1e-2, **options)

    trainer, model, opt = trainer_with(0)
    for _ in range(2):
        trainer.backward(model(torch.randn(4, 3)).pow(2).mean())
        trainer.step(opt)
    path = trainer.save(tmp_path / "ck.pt")
    state = torch.load(path, weights_only=True)
    values = state["optimizers"]["net"]["state"]["state"][0]
    values[entry] = change(values[entry])
    torch.save(ckpt.with_digest(state), path)
    other, other_model, other_opt = trainer_with(1)
    before = {k: v.clone() for k, v in other_model.state_dict().items()}
    state_before = {i: {k: v.clone() for k, v in s.items()} for i, s in other_opt.state_dict()["state"].items()}
    with pytest.raises(CheckpointError, match=expected) as caught:
        other.load(path)
    assert "optimizer 'net'" in str(caught.value) and "\n" not in str(caught.value)
    state_after = other_opt.state_dict()["state"]  # empty, or Adagrad's initial state
    assert state_after.keys() == state_before.keys()
    assert all(torch.equal(v, state_after[i][k]) for i, s in state_before.items() for k, v in s.items())
    assert all(torch.equal(before[k], v) for k, v in other_model.state_dict().items())

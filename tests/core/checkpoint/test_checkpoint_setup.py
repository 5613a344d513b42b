"""Checkpoints of what the author built around the Trainer: compiled models, own optimizers, models not set up."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import TensorDataset

import devplug
from devplug.core.errors import CheckpointMismatchError


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def trainer(seed: int = 0, **options) -> devplug.Trainer:
    return devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed, **options)


def train(t: devplug.Trainer, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> None:
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(24, 5, generator=g), torch.randn(24, 1, generator=g))
    loader = t.dataloader(data, batch_size=4, num_workers=0)
    for _ in t.epochs(1, max_steps=steps):
        for x, y in loader:
            t.backward(torch.nn.functional.mse_loss(model(x), y))
            t.step(opt)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_a_model_the_author_compiled_saves_plain_names_and_loads_into_an_uncompiled_one(tmp_path):
    first = trainer()
    compiled = first.setup(torch.compile(make_model(), backend="eager"))  # named as the model it compiled
    opt = first.optimizer("adam", compiled.parameters(), lr=1e-2)
    train(first, compiled, opt)
    path = first.save(tmp_path / "ck.pt")
    saved = torch.load(path, weights_only=True)["modules"]
    assert list(saved) == ["sequential"] and sorted(saved["sequential"]) == sorted(make_model().state_dict())

    plain = trainer(seed=1)
    model = plain.setup(make_model())
    plain.optimizer("adam", model.parameters(), lr=1e-2)
    plain.load(path)
    assert same_weights(model, compiled)


def test_a_plain_checkpoint_loads_into_a_compiled_model(tmp_path):
    first = trainer()
    model = first.setup(make_model(), name="net")
    first.optimizer("adam", model.parameters(), lr=1e-2)
    path = first.save(tmp_path / "ck.pt")

    second = trainer(seed=1)
    compiled = second.setup(torch.compile(make_model(), backend="eager"), name="net")
    second.optimizer("adam", compiled.parameters(), lr=1e-2)
    second.load(path)
    assert same_weights(model, compiled)


def test_a_checkpoint_with_compiled_names_loads_into_an_uncompiled_model(tmp_path):
    # as written before compiled names were made plain on save
    first = trainer()
    compiled = first.setup(torch.compile(make_model(), backend="eager"), name="net")
    first.optimizer("adam", compiled.parameters(), lr=1e-2)
    state = first.state_dict()
    state["modules"]["net"] = compiled.state_dict()
    assert all(name.startswith("_orig_mod.") for name in state["modules"]["net"])
    first._state.state_dict = lambda: state
    path = first.save(tmp_path / "ck.pt")

    plain = trainer(seed=1)
    model = plain.setup(make_model(), name="net")
    plain.optimizer("adam", model.parameters(), lr=1e-2)
    plain.load(path)
    assert same_weights(model, compiled)


def test_counting_flops_of_a_compiled_model_prints_no_torch_warning():
    for compile_yourself in (True, False):
        t = trainer(compile=not compile_yourself, compile_options={"backend": "eager"})
        net = make_model()
        model = t.setup(torch.compile(net, backend="eager") if compile_yourself else net)
        opt = t.optimizer("sgd", model.parameters(), lr=0.1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(t, model, opt)
        assert not [str(w.message) for w in caught if "global hooks" in str(w.message)]
        assert t.summary()["flops_per_sample"] == 208  # forward 96, backward 112: what an eager step counts
        assert not [f for f in warnings.filters if "global hooks" in str(f[1] and f[1].pattern)]


def test_save_warns_about_an_optimizer_the_author_built(tmp_path):
    t = trainer()
    model = t.setup(make_model(), name="net")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    train(t, model, opt)
    with pytest.warns(RuntimeWarning, match=r"optimizer torch\.optim\.Adam over the parameters of 'net' is not in "
                                            r"the checkpoint.*not built by trainer\.optimizer\(\)"):
        t.save(tmp_path / "ck.pt")


def test_an_optimizer_built_by_the_trainer_or_registered_saves_without_a_warning(tmp_path):
    t = trainer()
    model = t.setup(make_model(), name="net")
    built = t.optimizer("adam", model.parameters(), lr=1e-2)
    own = torch.optim.SGD(model.parameters(), lr=1e-3)
    t.register_for_checkpointing(own=own)
    train(t, model, built)
    train(t, model, own, steps=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.save(tmp_path / "ck.pt")


def test_loading_modules_no_model_was_set_up_for_names_them(tmp_path):
    first = trainer()
    first.setup(make_model(), name="generator")
    first.setup(make_model(), name="critic")
    path = first.save(tmp_path / "ck.pt")
    second = trainer()
    second.setup(make_model(), name="generator")
    with pytest.raises(CheckpointMismatchError, match=r"module\(s\) \['critic'\] of the checkpoint would not be "
                                                      r"restored: no module of that name was passed to "
                                                      r"trainer.setup\(\)"):
        second.load(path)
    with pytest.raises(CheckpointMismatchError, match=r"\['critic', 'generator'\] .* \(set up: none\)"):
        trainer().load(path)


@pytest.mark.parametrize("saved_rows, own_rows", [(1, 4), (4, 2)])
def test_a_registered_tensor_of_another_shape_is_a_mismatch_and_changes_nothing(tmp_path, saved_rows, own_rows):
    """Neither broadcast into the registered tensor (1 row saved, 4 here) nor a torch error after the weights
    were restored (4 rows saved, 2 here): one line naming it, before anything is restored."""
    first = trainer()
    model = first.setup(make_model(), name="net")
    opt = first.optimizer("adam", model.parameters(), lr=1e-2)
    first.register_for_checkpointing(noise=torch.full((saved_rows, 3), 7.0))
    train(first, model, opt)
    path = first.save(tmp_path / "ck.pt")
    second = trainer(seed=1)
    fresh = second.setup(make_model(), name="net")
    second.optimizer("adam", fresh.parameters(), lr=1e-2)
    noise = torch.zeros(own_rows, 3)
    second.register_for_checkpointing(noise=noise)
    before = [p.detach().clone() for p in fresh.parameters()]
    with pytest.raises(CheckpointMismatchError, match=rf"registered tensor 'noise' has shape \({saved_rows}, 3\) "
                                                      rf"there, \({own_rows}, 3\) here"):
        second.load(path)
    assert torch.equal(noise, torch.zeros(own_rows, 3))
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters(), strict=True))


def test_an_extra_named_as_a_registered_object_is_refused_and_nothing_is_written(tmp_path):
    t = trainer()
    model = t.setup(make_model(), name="net")
    opt = t.optimizer("adam", model.parameters(), lr=1e-2)
    noise = torch.full((2, 3), 7.0)
    t.register_for_checkpointing(noise=noise)
    train(t, model, opt)
    with pytest.raises(devplug.ConfigError, match=r"save\(\) extra 'noise' has the name of an object registered "
                                                  r"for checkpointing"):
        t.save(tmp_path / "ck.pt", noise=torch.zeros(2, 3), epoch=3)
    assert list(tmp_path.iterdir()) == []
    t.save(tmp_path / "ck.pt", epoch=3)
    assert t.load(tmp_path / "ck.pt")["epoch"] == 3 and torch.equal(noise, torch.full((2, 3), 7.0))

"""Mistakes a model author makes are caught with one line that says what to do."""

from __future__ import annotations

import pytest
import torch

import devplug


def _trainer(**options) -> tuple[devplug.Trainer, torch.nn.Module, torch.optim.Optimizer]:
    trainer = devplug.Trainer(device="cpu", progress=False, loggers=[], stop_signals=(), count_flops=False,
                              **options)
    model = trainer.setup(torch.nn.Linear(2, 1))
    return trainer, model, trainer.optimizer("sgd", model.parameters(), lr=0.1)


def test_step_without_backward_is_one_line_saying_to_call_trainer_backward():
    trainer, model, opt = _trainer(precision="32-true")
    model(torch.ones(1, 2)).sum()  # the loss computed, never backpropagated
    with pytest.raises(devplug.ConfigError, match=r"no gradients.*call trainer\.backward\(loss\) before") as err:
        trainer.step(opt)
    assert "\n" not in str(err.value)


def test_step_after_trainer_backward_and_a_second_optimizer_of_the_same_backward_are_fine():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[])
    a, b = trainer.setup(torch.nn.Linear(2, 1), name="a"), trainer.setup(torch.nn.Linear(1, 1), name="b")
    opt_a, opt_b = (trainer.optimizer("sgd", m.parameters(), lr=0.1) for m in (a, b))
    trainer.backward(b(a(torch.ones(1, 2))).sum())  # one backward, two optimizers (a model in two parts)
    assert trainer.step(opt_a) and trainer.step(opt_b)


def test_loss_backward_under_a_grad_scaler_is_one_line_naming_trainer_backward():
    trainer, model, opt = _trainer(precision="16-mixed")
    assert trainer.scaler is not None
    with trainer.autocast():
        loss = model(torch.ones(1, 2)).float().sum()
    loss.backward()  # the scaler never saw the loss
    with pytest.raises(devplug.ConfigError, match=r"trainer\.backward\(loss\) instead of loss\.backward\(\)"):
        trainer.step(opt)


def test_load_into_a_trainer_with_nothing_set_up_names_setup(tmp_path):
    trainer, _, _ = _trainer()
    trainer.save(tmp_path / "c.pt")
    fresh = devplug.Trainer(device="cpu", progress=False, loggers=[])
    with pytest.raises(devplug.CheckpointError, match=r"passed to trainer\.setup\(\).*before load\(\)"):
        fresh.load(tmp_path / "c.pt")


def test_load_without_the_optimizers_built_says_to_build_them_or_read_the_weights(tmp_path):
    trainer, _, _ = _trainer()
    trainer.save(tmp_path / "c.pt")
    fresh = devplug.Trainer(device="cpu", progress=False, loggers=[])
    model = fresh.setup(torch.nn.Linear(2, 1))
    with pytest.raises(devplug.CheckpointError, match=r"build 'linear' with trainer\.optimizer\(\.\.\.\) before load"):
        fresh.load(tmp_path / "c.pt")
    weights = torch.load(tmp_path / "c.pt", weights_only=True)["modules"]["linear"]  # what the line says works
    model.load_state_dict(weights)


def test_a_list_of_batches_is_used_as_it_is_every_epoch():
    trainer, model, opt = _trainer(precision="32-true")
    batches = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(3)]
    loader = trainer.dataloader(batches)  # the docs: any iterable of batches, batch_size left out
    shapes = []
    for _ in trainer.epochs(2):
        for x, y in loader:
            shapes.append(tuple(x.shape))
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
    assert shapes == [(4, 2)] * 6 and trainer.global_step == 6


def test_a_generator_of_batches_used_up_by_the_first_epoch_is_one_line_not_an_empty_epoch():
    trainer, model, opt = _trainer(precision="32-true")
    loader = trainer.dataloader((torch.randn(4, 2), torch.randn(4, 1)) for _ in range(3))
    with pytest.raises(devplug.DataError, match=r"used up.*list.*__iter__") as err:
        for _ in trainer.epochs(2):
            for x, y in loader:
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                trainer.step(opt)
    assert trainer.global_step == 3 and "\n" not in str(err.value)

"""The progress bar shows the first values the loop logged, in the order it logged them."""

from __future__ import annotations

import torch

import devplug
from devplug.core.observe.progress import progress_postfix


def test_log_points_keep_the_order_values_were_logged_in_and_the_bar_shows_the_first_two():
    trainer = devplug.Trainer(device="cpu", progress=False, log_every=2)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    points = []
    for _ in trainer.epochs(1):
        for (x,) in trainer.dataloader([(torch.ones(4, 3),)] * 4):
            loss = model(x).pow(2).mean()
            trainer.backward(loss)
            trainer.step(opt)
            point = trainer.log(loss_G=loss, loss_D=loss * 2, D_x=loss * 3, D_G_z=loss * 4)
            if point is not None:
                points.append(point)
    assert len(points) == 2
    for point in points:
        assert [k for k in point if k in ("loss_G", "loss_D", "D_x", "D_G_z")] == ["loss_G", "loss_D", "D_x", "D_G_z"]
        shown = progress_postfix(point)
        assert "loss_G " in shown and "loss_D " in shown and "D_x" not in shown and "D_G_z" not in shown

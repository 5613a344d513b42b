"""The data-wait figure: the share of wall time the loop waited for its loader, and the input-bound hint."""

from __future__ import annotations

import time

import torch
from toys import make_data, make_model

import devplug
from devplug.core.observe.reporter import input_bound_hint


class SlowDataset(torch.utils.data.Dataset):
    """Every sample takes ``delay`` seconds to load (decoding JPEGs on one core, say)."""

    def __init__(self, n: int, delay: float) -> None:
        self.data, self.delay = make_data(n), delay

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return self.data[i]


def _run(dataset, *, step_delay: float = 0.0, steps: int = 8) -> tuple[devplug.Trainer, list[float]]:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(dataset, batch_size=2, num_workers=0)
    waits = []
    for _ in trainer.epochs(1, max_steps=steps):
        for x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            time.sleep(step_delay)  # a slow step: compute the loader keeps up with
            values = trainer.log(loss=loss)
            if values is not None:
                waits.append(values["data_wait"])
    return trainer, waits


def test_a_slow_loader_shows_as_data_wait_and_an_input_bound_hint():
    # 0.2 s of loading a batch against a near-empty step: a share far above 0.5 even on a busy machine
    trainer, waits = _run(SlowDataset(64, delay=0.1))
    assert len(waits) == 4 and all(w > 0.5 for w in waits), waits
    summary = trainer.summary()
    assert summary["data_wait"] > 0.5
    hint = summary["input_bound"]
    assert hint.startswith("input-bound: loader delivers ") and hint.endswith("try the cache / more workers / DALI")
    assert f"{summary['samples_per_sec']:,.1f} samples/s, step consumes" in hint


def test_a_loader_that_keeps_up_waits_little_and_gives_no_hint():
    trainer, waits = _run(make_data(64), step_delay=0.1)
    assert len(waits) == 4 and all(0 <= w < 0.3 for w in waits), waits
    assert trainer.summary()["input_bound"] is None
    assert trainer.last_metrics["data_wait"] == waits[-1]


def test_the_hint_says_what_the_step_could_consume():
    assert input_bound_hint(100.0, 0.5) == ("input-bound: loader delivers 100.0 samples/s, step consumes 200.0 "
                                            "samples/s (50% of the time waiting for data); try the cache / more "
                                            "workers / DALI")
    assert input_bound_hint(100.0, 0.05) is None
    assert input_bound_hint(0.0, 0.9) is None


def test_the_first_batch_wait_is_not_counted():
    from devplug.core.observe.metrics import Throughput

    meter = Throughput()
    meter.add(4, waited=5.0)  # worker start-up, before the clock runs
    meter.add(4, waited=0.0)
    assert meter.wait_total == 0.0

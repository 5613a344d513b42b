"""Gradient accumulation under DDP (2 gloo ranks), and a 2-rank checkpoint resumed on 1 rank."""

from __future__ import annotations

import pytest
import torch
from dist_scripts import common
from dist_scripts.common import HERE, run_ranks
from torch.utils.data import DistributedSampler

import devplug

SAMPLES, BATCH, WORLD, ACCUMULATION = 40, 4, 2, 2
MICRO = SAMPLES // (BATCH * WORLD)  # 5 micro-batches per rank: steps end at micro-batches 2, 4 and 5 (epoch end)


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("accumulate")
    run_ranks(HERE / "train_accumulate.py", ["--out", str(out), "--samples", str(SAMPLES), "--batch-size",
                                             str(BATCH)], world_size=WORLD, timeout=180)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def reference_weights() -> dict[str, torch.Tensor]:
    """One process, plain PyTorch: each micro-batch is both ranks' micro-batches concatenated, loss / 2."""
    data = common.IndexedData(SAMPLES)
    model = common.make_model(0)
    from devplug.plugins.cpu import plugin as cpu_plugin

    fused = {"fused": True} if cpu_plugin.supports_fused("sgd") else {}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **fused)
    per_rank = common.shards(SAMPLES, WORLD, 0)
    for micro in range(MICRO):
        idx = [i for order in per_rank for i in order[micro * BATCH:(micro + 1) * BATCH]]
        (torch.nn.functional.mse_loss(model(data.x[idx]), data.y[idx]) / ACCUMULATION).backward()
        if micro % ACCUMULATION == ACCUMULATION - 1 or micro == MICRO - 1:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return model.state_dict()


@pytest.mark.slow
def test_accumulation_skips_the_allreduce_between_boundaries_and_matches_one_process(accumulated):
    _out, (r0, r1) = accumulated
    boundary = [(m % ACCUMULATION == ACCUMULATION - 1) or m == MICRO - 1 for m in range(MICRO)]
    for result in (r0, r1):
        assert [count > 0 for count in result["allreduces"]] == boundary
        assert result["global_step"] == 3
    for name, expected in reference_weights().items():
        assert torch.equal(r0["final"][name], r1["final"][name])
        torch.testing.assert_close(r0["final"][name], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_one_rank_at_the_same_sample(accumulated):
    out, (r0, _r1) = accumulated
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=5, progress=False, accumulate_grad_batches=2)
    model = trainer.setup(common.make_model(3), name="mlp")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9)
    loader = trainer.dataloader(common.IndexedData(SAMPLES), BATCH * WORLD, shuffle=True, num_workers=0)
    trainer.load(out / "after_step1.pt")
    assert trainer.global_step == 1
    seen = []
    for _epoch in trainer.epochs(1):
        for index, x, y in loader:
            seen.extend(int(i) for i in index)
            with trainer.accumulate(model):
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                trainer.step(opt)
    sampler = DistributedSampler(common.IndexedData(SAMPLES), num_replicas=1, rank=0, shuffle=True, seed=0)
    assert seen == list(sampler)[2 * BATCH * WORLD:]  # the two ranks had read the first 16 samples
    assert trainer.global_step == 3
    for name, value in model.state_dict().items():  # same sample sets per micro-batch as the 2 ranks
        torch.testing.assert_close(value, r0["final"][name], rtol=1e-5, atol=1e-6)


def test_a_mid_epoch_checkpoint_that_cannot_continue_at_the_same_sample_says_why(tmp_path):
    trainer = devplug.Trainer(device="cpu", progress=False, seed=0)
    model = trainer.setup(common.make_model(0), name="mlp")
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(common.IndexedData(SAMPLES), 4, shuffle=True)
    for _epoch in trainer.epochs(1):
        for i, _ in enumerate(loader):
            if i == 2:
                break
        break
    path = trainer.save(tmp_path / "three.pt")  # 3 batches of 4 = 12 samples read
    other = devplug.Trainer(device="cpu", progress=False)
    other_model = other.setup(common.make_model(0), name="mlp")
    other.optimizer("sgd", other_model.parameters(), lr=0.1)
    other.dataloader(common.IndexedData(SAMPLES), 8, shuffle=True)
    with pytest.raises(devplug.CheckpointError, match=r"12 samples.*not a whole number of batches of 8"):
        other.load(path)

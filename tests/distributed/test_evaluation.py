"""Evaluation under several processes: unpadded shards holding each sample once, and the author's reductions.

The README loop must report the same ``val_accuracy`` on 1, 2 and 3 processes (1,001 samples: uneven
shards); the multi-process runs are tests/dist_scripts/readme_eval.py under ``common.run_ranks``.
"""

from __future__ import annotations

import pytest
import torch
from dist_scripts import common
from dist_scripts.common import HERE, run_ranks
from torch.utils.data import TensorDataset

import devplug
from devplug.core.contract.records import LoaderOptions
from devplug.core.data.evaluation import EvaluationSampler, evaluation_shard
from devplug.core.data.torch_loader import make_sampler, torch_dataloader


def _expected_accuracy(namespace: dict[str, object]) -> float:
    _, labels = namespace["val_set"].tensors  # type: ignore[attr-defined]
    return (common.expected_predictions(namespace) == labels).double().mean().item()


@pytest.mark.parametrize("world", [2, 3])
def test_an_evaluation_sampler_splits_the_dataset_into_disjoint_blocks_that_cover_it_once(world):
    dataset = TensorDataset(torch.arange(1001))
    shards = [list(make_sampler(dataset, LoaderOptions(batch_size=8, rank=rank, world_size=world, evaluation=True)))
              for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(1001))  # each sample once, none padded
    assert [i for shard in shards for i in shard] == list(range(1001))  # rank order is the dataset's order
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_a_shuffled_evaluation_sampler_still_holds_each_sample_once_per_epoch():
    samplers = [EvaluationSampler(1001, rank=rank, world_size=2, shuffle=True, seed=3) for rank in range(2)]
    orders = []
    for epoch in range(2):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        order = [i for sampler in samplers for i in sampler]
        assert sorted(order) == list(range(1001))
        orders.append(order)
    assert orders[0] != orders[1]


def test_evaluation_shards_of_fewer_samples_than_ranks_leave_some_ranks_empty():
    assert [len(evaluation_shard(2, rank, 3)) for rank in range(3)] == [1, 1, 0]
    with pytest.raises(ValueError, match="rank 3"):
        evaluation_shard(10, 3, 3)


def test_the_torch_loader_of_an_evaluation_set_yields_this_ranks_block_unpadded():
    dataset = TensorDataset(torch.arange(1001))
    batches = [torch_dataloader(dataset, LoaderOptions(batch_size=256, rank=rank, world_size=2, evaluation=True))
               .loader for rank in range(2)]
    seen = [torch.cat([batch for (batch,) in loader]).tolist() for loader in batches]
    assert [len(s) for s in seen] == [501, 500]
    assert seen[0] + seen[1] == list(range(1001))


@pytest.mark.parametrize("shuffle", [False, True])
def test_dali_shards_an_evaluation_folder_unpadded(shuffle):
    from devplug.plugins.cuda import dali  # imports nvidia.dali only when a pipeline is built

    items = [f"img{i:02d}.png" for i in range(14)]
    shards = [dali.shard_items(items, LoaderOptions(batch_size=2, rank=rank, world_size=3, shuffle=shuffle,
                                                    evaluation=True)) for rank in range(3)]
    assert [len(shard) for shard in shards] == [5, 5, 4]
    assert sorted(shards[0] + shards[1] + shards[2]) == items
    assert shuffle or shards[0] + shards[1] + shards[2] == items


def test_the_trainers_evaluation_loader_asks_for_an_evaluation_sampler():
    trainer = devplug.Trainer(device="cpu", progress=False)
    data = TensorDataset(torch.arange(10))
    assert isinstance(trainer.dataloader(data, 4, train=False).choice.sampler, EvaluationSampler)
    assert not isinstance(trainer.dataloader(data, 4).choice.sampler, EvaluationSampler)


def test_all_reduce_and_gather_are_the_identity_in_one_process():
    trainer = devplug.Trainer(device="cpu", progress=False)
    value = torch.tensor([1.0, 2.0])
    assert trainer.all_reduce(value) is value
    assert trainer.all_reduce(3, op="max") == 3
    assert trainer.gather(value) is value
    with pytest.raises(devplug.ConfigError, match="'avg'"):
        trainer.all_reduce(value, op="avg")


def test_the_readme_loop_reports_the_true_accuracy_in_one_process(tmp_path, monkeypatch):
    namespace = common.loop_namespace()
    monkeypatch.chdir(tmp_path)
    exec(compile(common.documented_loop(), "README.md", "exec"), namespace)
    namespace["trainer"].close()
    expected = _expected_accuracy(namespace)
    assert 0.4 < expected < 0.9
    assert namespace["trainer"].last_metrics["val_accuracy"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_the_readme_loop_reports_the_one_process_accuracy_on_several_ranks(world, tmp_path):
    run_ranks(HERE / "readme_eval.py", ["--out", str(tmp_path)], world_size=world, timeout=240)
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
    namespace = common.loop_namespace()
    expected = _expected_accuracy(namespace)
    for result in results:
        assert result["correct"] / 1001 == pytest.approx(expected, abs=1e-12)
        assert result["val_accuracy"] == pytest.approx(expected, abs=1e-6)
        assert torch.equal(result["gathered"], common.expected_predictions(namespace))  # dataset order, once
    assert sum(result["mine"] for result in results) == 1001  # uneven shards, nothing padded

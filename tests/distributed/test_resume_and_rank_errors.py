"""Multi-process and sharded runs off the happy path: resuming across strategies, damaged folders, bad flags."""

from __future__ import annotations

import pytest
import torch
from dist_scripts.fsdp_model import Block, lm_loss, make_lm, rank_batch

import devplug


def _trainer(**options):
    return devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0, **options)


def test_a_plain_checkpoint_with_schedule_settings_loads_into_a_sharded_run(tmp_path):
    # a schedule keeps its peak in each group as initial_lr, a key the fresh sharded optimizer's groups lack
    schedule = devplug.LRSchedule(total_steps=10, warmup_steps=4)
    plain = _trainer()
    model = plain.setup(make_lm(), name="lm")
    opt = plain.optimizer("adamw", model.parameters(), lr=1e-2)
    for step in (1, 2):
        schedule.apply(opt, step)
        plain.backward(lm_loss(model, rank_batch(step, 0, 1)))
        plain.step(opt)
    plain.save(tmp_path / "plain.pt", step=2)
    again = _trainer(strategy="fsdp")
    sharded_model = again.setup(make_lm(1), name="lm", shard=[Block])
    fresh = again.optimizer("adamw", sharded_model.parameters(), lr=1e-2)
    assert again.load(tmp_path / "plain.pt") == {"step": 2}
    assert fresh.param_groups[0]["initial_lr"] == 1e-2 and fresh.param_groups[0]["lr"] == pytest.approx(5e-3)
    for name, value in sharded_model.state_dict().items():
        assert torch.equal(value.full_tensor(), model.state_dict()[name])
    moments = fresh.state_dict()["state"][0]["exp_avg"].full_tensor()
    assert torch.equal(moments, opt.state_dict()["state"][0]["exp_avg"])
    again.close()


def test_an_error_outside_a_process_group_of_several_ranks_is_never_taken_for_a_lost_peer():
    from devplug.core.distributed.peer_loss import lost_peer

    assert lost_peer(RuntimeError("Connection reset by peer")) is None  # one process: its own error, shown whole


def test_a_rank_stays_quiet_only_when_rank_zero_printed_the_same_line():
    from torch.distributed import HashStore

    from devplug.core.distributed.said_once import said_by_rank_zero

    store = HashStore()  # stands for the job's store: every rank sees the same keys
    assert said_by_rank_zero("lm: error: its own reason", store=store, rank=1, wait=0.05) is False  # rank 0 silent
    assert said_by_rank_zero("lm: error: bad --tp", store=store, rank=0) is False  # rank 0 always prints
    assert said_by_rank_zero("lm: error: bad --tp", store=store, rank=1, wait=0.05) is True
    assert said_by_rank_zero("lm: error: rank 1's own reason", store=store, rank=1, wait=0.05) is False
    assert said_by_rank_zero("lm: error: bad --tp") is False  # one process: no group, always printed


@pytest.mark.parametrize(("strategy", "named"), [("auto", "none"), ("ddp", "none"), ("fsdp", "fsdp")])
def test_a_tp_for_a_strategy_that_does_not_split_layers_is_refused_not_ignored(strategy, named):
    # one process: auto and ddp are the plain strategy, "none"
    with pytest.raises(devplug.ConfigError, match=rf"tp=2 .*strategy '{named}' does not .*choose strategy 'tp', "
                                                  r"'fsdp\+tp'"):
        _trainer(strategy=strategy, tp=2)


def _policy_run(folder, *, batch_size: int, steps: int, resume: bool) -> devplug.Trainer:
    policy = devplug.CheckpointPolicy(directory=folder, every_n_steps=2, auto_resume=resume)
    trainer = _trainer(checkpoints=policy, stop_signals=())
    model = trainer.setup(torch.nn.Linear(3, 1), name="model")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(40, 3)), batch_size, shuffle=True)
    for _ in trainer.epochs(1, max_steps=steps):
        for (x,) in loader:
            trainer.backward(model(x).square().mean())
            trainer.step(opt)
    trainer.close()
    return trainer


def test_a_checkpoint_whose_data_position_does_not_fit_another_batch_or_world_size_is_an_error_not_damage(tmp_path):
    # 3 steps of 2 samples: 6 drawn, not a whole number of batches of 4. The newest checkpoint is intact; it was
    # taken for a damaged one, and the run went back to step 2 and moved the newest aside.
    _policy_run(tmp_path, batch_size=2, steps=3, resume=False)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == [
        "step_0000002.pt", "step_0000003.pt"]
    with pytest.raises(devplug.CheckpointMismatchError, match=r"step_0000003\.pt.*cannot continue training loader 0 "
                                                             r"at the same sample on 1 rank\(s\) with batch size 4"):
        _policy_run(tmp_path, batch_size=4, steps=6, resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000002.pt", "step_0000003.pt"]  # nothing set aside


def _raised_in(module: str, error: Exception) -> Exception:
    namespace: dict = {"__name__": module}
    exec("def fail(error):\n    raise error\n", namespace)  # a frame of that module's, as torch's own raise
    try:
        namespace["fail"](error)
    except Exception as caught:
        return caught
    raise AssertionError("not raised")


def test_only_a_collective_that_lost_its_peers_is_taken_for_another_process_ending():
    from torch.distributed import DistError, DistNetworkError

    from devplug.core.distributed.peer_loss import _peer_gone

    gloo = "[../gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:6: Connection reset by peer"
    assert _peer_gone(_raised_in("torch.distributed.distributed_c10d", RuntimeError(gloo)), DistError)
    assert _peer_gone(_raised_in("torch.autograd.graph", RuntimeError(gloo)), DistError)  # DDP's all-reduce
    assert _peer_gone(_raised_in("my_script", DistNetworkError("store gone")), DistError)
    assert not _peer_gone(_raised_in("torch.utils.data.dataloader", RuntimeError("timed out after 5 s")), DistError)
    assert not _peer_gone(_raised_in("my_script", RuntimeError(gloo)), DistError)  # the author's own error
    assert not _peer_gone(_raised_in("torch.distributed.tensor", RuntimeError("shape mismatch")), DistError)

"""DDP on CPU with gloo: 2 real ranks against one process on the concatenated batches, and the pieces.

The 2-rank scenario (tests/dist_scripts/train_ddp.py) runs once per module; each test checks one
promise of DDP training (identical ranks, disjoint shards, rank-0-only files, no host sync in the
steady state, reduced metrics, DDP options) from what the ranks recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from dist_scripts import common
from dist_scripts.common import HERE, free_port, make_model, run_ranks

import devplug
from devplug.core.contract.records import CollectiveSetup, LaunchInfo
from devplug.core.distributed import combine, ddp
from devplug.core.distributed import process_group as distributed
from devplug.core.errors import ConfigError
from devplug.core.loop.config import TrainerConfig

EPOCHS, BATCH, SAMPLES, LOG_EVERY, WORLD = 2, 4, 40, 4, 2
STEPS = EPOCHS * SAMPLES // (BATCH * WORLD)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """Run the 2-rank scenario once; return the run folder and each rank's recorded results."""
    root = tmp_path_factory.mktemp("ddp")
    run_ranks(HERE / "train_ddp.py",
              ["--run", str(root / "run"), "--results", str(root / "results"), "--epochs", str(EPOCHS),
               "--batch-size", str(BATCH), "--samples", str(SAMPLES), "--log-every", str(LOG_EVERY)],
              world_size=WORLD, timeout=240)
    results = [torch.load(root / "results" / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return root / "run", results


def shards(epoch: int) -> list[list[int]]:
    """The sample order DistributedSampler gives each rank in ``epoch`` (seed 0, shuffled)."""
    return common.shards(SAMPLES, WORLD, epoch)


# ---- the 2-rank scenario ------------------------------------------------------------------------------


@pytest.mark.slow
def test_ranks_end_identical_and_equal_to_one_process_on_concatenated_batches(ddp_run):
    _run, (r0, r1) = ddp_run
    assert (r0["launcher"], r0["world_size"], r0["global_step"]) == ("torchrun", WORLD, STEPS)
    for name in r0["final"]:
        assert torch.equal(r0["final"][name], r1["final"][name]), f"{name} differs between ranks"
    reference = common.train_on_concatenated_batches(STEPS, samples=SAMPLES, batch_size=BATCH, world_size=WORLD)
    start = make_model(0).state_dict()
    for name, expected in reference.items():
        assert not torch.allclose(start[name], expected), "training did not move the weights"
        torch.testing.assert_close(r0["final"][name], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_sampler_gives_disjoint_shards_reshuffled_each_epoch(ddp_run):
    _run, results = ddp_run
    for epoch in range(EPOCHS):
        seen = [r["seen"][epoch] for r in results]
        assert seen == shards(epoch)  # the order the reference above trains on
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(SAMPLES))
    assert results[0]["seen"][0] != results[0]["seen"][1], "set_epoch did not reshuffle"


@pytest.mark.slow
def test_only_rank_zero_writes_files_and_shows_progress(ddp_run):
    run, (r0, r1) = ddp_run
    assert r1["writes"] == [] and not r1["is_main"]
    written = "\n".join(r0["writes"])
    for part in ("tb", "ckpt", "samples"):
        assert str(run / part) in written
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (run / "ckpt").glob("*.pt")) == ["epoch0.pt", "epoch1.pt"]
    assert (run / "samples" / "grid.png").is_file()
    assert all(r0["progress_shown"]) and not any(r1["progress_shown"])


@pytest.mark.slow
def test_steady_state_step_has_no_barrier_collective_or_host_sync(ddp_run):
    _run, results = ddp_run
    for result in results:
        steps = result["steps"]
        assert len(steps) == STEPS
        quiet = [s for s in steps if not s["log_point"]]
        assert quiet and all(s["calls"] == [] for s in quiet), [s for s in quiet if s["calls"]]
        # the counters work: log points read values back and reduce them across ranks
        logged = [s for s in steps if s["log_point"]]
        assert [s["step"] for s in logged] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
        assert all("dist.all_reduce" in s["calls"] and "Trainer.synchronize" in s["calls"] for s in logged)
        assert not any("dist.barrier" in s["calls"] for s in steps)


@pytest.mark.slow
def test_metrics_are_reduced_across_ranks_at_log_points(ddp_run):
    _run, (r0, r1) = ddp_run
    assert len(r0["reports"]) == len(r1["reports"]) == STEPS // LOG_EVERY
    # the end of trainer.epochs() flushes the steps after the last log point the same way
    for a, b in zip([*r0["reports"], r0["last_metrics"]], [*r1["reports"], r1["last_metrics"]], strict=True):
        assert a["rank_value"] == pytest.approx(0.5)  # mean of rank 0's 0.0 and rank 1's 1.0
        assert a["loss"] == b["loss"]


@pytest.mark.slow
def test_ddp_options_reach_ddp_over_plugin_defaults(ddp_run):
    _run, results = ddp_run
    mib = 1024 * 1024
    for result in results:
        # CPU plugin has no DDP defaults: the author's options as given
        assert result["ddp_main"] == {"type": "DistributedDataParallel", "bucket_bytes_cap": 1 * mib,
                                      "broadcast_buffers": False, "gradient_as_bucket_view": True,
                                      "find_unused_parameters": False, "static_graph": False}
        # a plugin saying bucket 3 MiB, no buffer broadcast, bucket views; the author: 1 MiB, find unused
        assert result["ddp_plugin_defaults"] == {"type": "DistributedDataParallel", "bucket_bytes_cap": 1 * mib,
                                                 "broadcast_buffers": False, "gradient_as_bucket_view": True,
                                                 "find_unused_parameters": True, "static_graph": False}
        assert result["ddp_static"]["static_graph"] is True
        assert result["ddp_static"]["broadcast_buffers"] is True  # torch's default where nobody sets it


@pytest.mark.slow
def test_no_sync_keeps_gradients_local_until_the_next_synced_backward(ddp_run):
    _run, (r0, r1) = ddp_run
    # each rank's input is constant (rank + 1): local gradients differ, and the synced one is their mean
    assert not torch.allclose(r0["local_grad"], r1["local_grad"])
    assert torch.equal(r0["synced_grad"], r1["synced_grad"])
    expected = (2 * r0["local_grad"] + 2 * r1["local_grad"]) / 2  # each rank accumulated twice its local grad
    torch.testing.assert_close(r0["synced_grad"], expected)


@pytest.mark.slow
def test_slurm_style_launch_joins_over_tcp_from_the_node_list():
    """srun-like variables and no MASTER_ADDR: rendezvous at the node list's first host over tcp://."""
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = common.clean_env({"MASTER_PORT": str(port), "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(WORLD),
                                "SLURM_STEP_NUM_TASKS": str(WORLD), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
                                "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": str(WORLD)})
        procs.append(subprocess.Popen([sys.executable, str(HERE / "probe_launch.py")], env=env, cwd=common.REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, seen in enumerate(outputs):
        assert seen["launch"] == {"rank": rank, "world_size": WORLD, "local_rank": rank, "local_world_size": WORLD,
                                  "master_addr": "localhost", "launcher": "slurm"}
        assert seen["wrapped"] == "DistributedDataParallel"
        assert seen["grad"] == [[1.5, 1.5]]  # the mean of rank 0's input (1) and rank 1's (2)


# ---- in-process pieces --------------------------------------------------------------------------------


def test_single_process_trainer_leaves_torch_distributed_alone():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(make_model(0))
    assert trainer._collective is None and not trainer.launch.distributed
    assert not isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert not dist.is_initialized()
    assert trainer.is_main_process and trainer.world_size == 1


def test_ddp_options_put_author_options_over_plugin_defaults():
    plugin = CollectiveSetup(backend="x", ddp_kwargs={"bucket_cap_mb": 100, "broadcast_buffers": False,
                                                      "gradient_as_bucket_view": True, "device_ids": [3]})
    options = ddp.ddp_options(plugin, TrainerConfig(bucket_cap_mb=8).ddp_overrides())
    buffers = "forward_sync_buffers" if "forward_sync_buffers" in ddp._ddp_parameters() else "broadcast_buffers"
    assert options == {"bucket_cap_mb": 8, buffers: False, "gradient_as_bucket_view": True, "device_ids": [3]}
    config = TrainerConfig(broadcast_buffers=True, gradient_as_bucket_view=False, find_unused_parameters=True,
                           static_graph=True)
    options = ddp.ddp_options(plugin, config.ddp_overrides())
    assert options == {"bucket_cap_mb": 100, buffers: True, "gradient_as_bucket_view": False, "device_ids": [3],
                       "find_unused_parameters": True, "static_graph": True}


def test_init_method_uses_env_when_the_launcher_exported_the_master():
    launch = LaunchInfo(rank=1, world_size=2, master_addr="node03", master_port=29555, launcher="slurm")
    assert distributed.init_method(launch, {"MASTER_ADDR": "node03", "MASTER_PORT": "29555"}) == "env://"
    assert distributed.init_method(launch, {}) == "tcp://node03:29555"
    v6 = LaunchInfo(rank=1, world_size=2, master_addr="fe80::1", master_port=29555, launcher="openmpi")
    assert distributed.init_method(v6, {}) == "tcp://[fe80::1]:29555"


def test_a_plugin_without_collective_setup_is_a_clear_error():
    with pytest.raises(ConfigError, match="cannot train on several processes"):
        distributed.init_process_group(LaunchInfo(rank=0, world_size=2), None, SimpleNamespace(plugin_name="toy"))


@pytest.fixture
def one_rank_group():
    """A real gloo process group of one rank in this process, destroyed afterwards."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_wrap_ddp_passes_merged_options_to_ddp(one_rank_group):
    plugin = CollectiveSetup(backend="gloo", ddp_kwargs={"bucket_cap_mb": 7, "broadcast_buffers": False,
                                                         "gradient_as_bucket_view": True})
    config = TrainerConfig(bucket_cap_mb=2, find_unused_parameters=True)
    wrapped = ddp.wrap_ddp(make_model(0), plugin, config.ddp_overrides())
    assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
    assert wrapped.bucket_bytes_cap == 2 * 1024 * 1024
    assert (wrapped.broadcast_buffers, wrapped.gradient_as_bucket_view, wrapped.find_unused_parameters) == (
        False, True, True)


def test_wrap_ddp_leaves_a_frozen_module_unwrapped(one_rank_group):
    frozen = make_model(0).requires_grad_(False)
    assert ddp.wrap_ddp(frozen, CollectiveSetup(backend="gloo"), TrainerConfig().ddp_overrides()) is frozen


def test_mean_across_ranks_on_one_rank_is_identity(one_rank_group):
    values = torch.tensor([1.0, 3.0])
    assert torch.equal(combine.mean_across_ranks(values), values)


def test_metric_reduction_returns_only_after_gloo_let_go_of_its_tensor(one_rank_group, monkeypatch):
    # gloo's worker thread releases a finished all_reduce's tensor after the caller resumes; a release
    # during interpreter shutdown aborts the process (seen as a rare SIGABRT at the end of 2-rank runs)
    seen = []
    real = combine.wait_for_release

    def spy(tensor, timeout=2.0):
        released = real(tensor, timeout)
        seen.append((released, tensor._use_count()))
        return released

    monkeypatch.setattr(combine, "wait_for_release", spy)
    combine.mean_across_ranks(torch.tensor([1.0, 3.0]))
    assert seen == [(True, 1)]


def test_joining_a_process_group_registers_one_exit_grace(one_rank_group, monkeypatch):
    registered = []
    monkeypatch.setattr(distributed.atexit, "register", lambda fn, *args: registered.append((fn, args)))
    monkeypatch.setattr(distributed, "_exit_grace_registered", False)
    setup = CollectiveSetup(backend="gloo")
    launch = LaunchInfo(launcher="torchrun", rank=0, world_size=1)
    distributed.init_process_group(launch, setup, "cpu")
    distributed.init_process_group(launch, setup, "cpu")
    assert registered == [(distributed.time.sleep, (distributed.EXIT_GRACE_SECONDS,))]


def test_wait_for_release_gives_up_while_another_owner_holds_the_tensor():
    tensor = torch.ones(2)
    holder = tensor.view(-1)  # a view owns its base from C++, as a collective's work object does
    assert tensor._use_count() == 2
    assert combine.wait_for_release(tensor, timeout=0.02) is False
    del holder
    assert combine.wait_for_release(tensor, timeout=0.02) is True


def test_init_process_group_keeps_an_existing_group_and_checks_it(one_rank_group):
    setup = CollectiveSetup(backend="gloo")
    assert distributed.init_process_group(LaunchInfo(rank=0, world_size=1), setup, None) is setup
    other = LaunchInfo(rank=1, world_size=2, launcher="torchrun")
    with pytest.raises(ConfigError, match="existing process group has rank 0 of 1"):
        distributed.init_process_group(other, setup, None)



def test_a_group_of_several_ranks_without_launcher_variables_is_refused(one_rank_group, monkeypatch):
    """mp.spawn and the author's own init_process_group, no RANK/WORLD_SIZE exported: every process would train
    alone as rank 0 of 1 (no DDP, no data shard, every one writing as the main process)."""
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    with pytest.raises(ConfigError, match=r"rank 1 of a process group of 2, .* RANK, WORLD_SIZE"):
        devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[])


def test_a_group_of_one_without_launcher_variables_is_a_single_process(one_rank_group):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[])
    assert (trainer.rank, trainer.world_size, trainer.strategy) == (0, 1, "none")
    trainer.close()


def test_elastic_store_gives_each_restart_attempt_its_own_keys():
    port = free_port()
    agent_store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=10))
    launch = LaunchInfo(rank=0, world_size=1)
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "0"}
    first = distributed.elastic_store(launch, env, timeout=timedelta(seconds=10))
    first.set("rank1_address", "dead peer")
    second = distributed.elastic_store(launch, dict(env, TORCHELASTIC_RESTART_COUNT="1"),
                                       timeout=timedelta(seconds=10))
    assert not second.check(["rank1_address"])  # the new attempt does not see the old attempt's keys
    assert first.get("rank1_address") == b"dead peer"
    assert agent_store.check(["devplug/job/attempt0/rank1_address"])


def test_elastic_store_is_not_used_without_the_agent_store():
    launch = LaunchInfo(rank=0, world_size=2)
    assert distributed.elastic_store(launch, {"MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None
    assert distributed.elastic_store(launch, {"TORCHELASTIC_USE_AGENT_STORE": "False", "MASTER_ADDR": "h",
                                              "MASTER_PORT": "1"}) is None

"""Sharding with PyTorch's FSDP: 2 gloo ranks against DDP on the same data, sharded checkpoints across world sizes.

The 2-rank scenario (tests/dist_scripts/train_fsdp.py) runs once per module: DDP, FSDP, FSDP resumed from
its own sharded checkpoint (with activation checkpointing), FSDP resumed from DDP's plain checkpoint. Each
test checks one promise from what the ranks recorded; the one-process resumes (on the CPU and on the Gaudi
stand-in) run here. One more 2-rank run, under torchrun, kills a rank in the middle of a sharded save and
checks that the restarted job resumes from the last complete checkpoint and ends where the scenario's
uninterrupted FSDP run ends (both train with `train_fsdp.train_step`).

Tolerances (fp32): DDP all-reduces gradients, FSDP reduce-scatters them, and DDP's optimizer is torch's
fused AdamW where FSDP's is the foreach one over DTensor shards; the same sums are added in another order,
so results agree to a few float32 ulps per step (measured: losses equal to 1e-7 relative, weights within
3e-7 after 6 steps). Losses are compared at rtol 1e-5 and weights at atol 1e-5: well above that rounding,
far below what a wrong gradient average (a factor of 2) or a missed reduction would give. Resuming on the
same world size and strategy repeats the same operations in the same order, so it is compared bitwise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from dist_scripts import common
from dist_scripts.common import HERE, run_ranks
from dist_scripts.fsdp_model import ADAMW, STEPS, TinyLM, lm_loss, make_lm, rank_batch
from standins import hpu_fixtures

import devplug
from devplug import toolkit
from devplug.core.checkpoint.sharded import is_sharded_checkpoint

WORLD = 2


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """Run the 2-rank scenario once; the folder it wrote into and each rank's records."""
    out = tmp_path_factory.mktemp("fsdp")
    run_ranks(HERE / "train_fsdp.py", ["--out", str(out)], world_size=WORLD, timeout=300)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture
def hpu(monkeypatch):
    """The Gaudi stand-in for one test (it computes on the CPU, in fp32)."""
    yield from hpu_fixtures.standin(monkeypatch)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-5, msg=name)


def _curve(record: dict) -> list[float]:
    return [record["losses"][step] for step in sorted(record["losses"])]


@pytest.mark.slow
def test_an_fsdp_rank_holds_half_the_bytes_of_a_ddp_rank(fsdp_run):
    _out, ranks = fsdp_run
    for record in ranks:
        ddp, fsdp = record["ddp"], record["fsdp"]
        for kind in ("param_bytes", "grad_bytes", "state_bytes"):
            ratio = fsdp[kind] / ddp[kind]
            assert 0.49 < ratio < 0.52, f"{kind}: FSDP {fsdp[kind]} bytes, DDP {ddp[kind]} bytes"
        total = sum(fsdp[k] for k in ("param_bytes", "grad_bytes", "state_bytes"))
        assert total / sum(ddp[k] for k in ("param_bytes", "grad_bytes", "state_bytes")) == pytest.approx(0.5, abs=0.01)
    assert "foreach=True" in ranks[0]["fsdp"]["implementation"]


@pytest.mark.slow
def test_fsdp_loss_curve_gradient_norms_and_weights_match_ddp(fsdp_run):
    _out, (r0, r1) = fsdp_run
    assert len(r0["fsdp"]["losses"]) == STEPS
    torch.testing.assert_close(_curve(r0["fsdp"]), _curve(r0["ddp"]), rtol=1e-5, atol=0)
    assert _curve(r0["fsdp"])[-1] < _curve(r0["fsdp"])[0], "training did not lower the loss"
    # the norm over sharded gradients is the norm of the whole gradient, as DDP's replicas see it
    torch.testing.assert_close(r0["fsdp"]["norms"], r0["ddp"]["norms"], rtol=1e-5, atol=0)
    assert r0["fsdp"]["norms"] == r1["fsdp"]["norms"]
    _close(r0["fsdp"]["final"], r0["ddp"]["final"])
    assert _equal(r0["fsdp"]["final"], r1["fsdp"]["final"])


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_on_two_ranks_bitwise_with_activation_checkpointing(fsdp_run):
    _out, (r0, _r1) = fsdp_run
    assert sorted(r0["fsdp_resume"]["losses"]) == [3, 4, 5]
    assert _curve(r0["fsdp_resume"]) == _curve(r0["fsdp"])[3:]
    assert _equal(r0["fsdp_resume"]["final"], r0["fsdp"]["final"])


@pytest.mark.slow
def test_a_ddp_checkpoint_resumes_under_fsdp(fsdp_run):
    out, (r0, _r1) = fsdp_run
    saved = torch.load(out / "ddp3.pt", weights_only=True)["modules"]["lm"]
    assert _equal(r0["fsdp_from_ddp"]["loaded"], saved)
    torch.testing.assert_close(_curve(r0["fsdp_from_ddp"]), _curve(r0["ddp"])[3:], rtol=1e-5, atol=0)
    _close(r0["fsdp_from_ddp"]["final"], r0["ddp"]["final"])


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_on_one_process_without_sharding(fsdp_run):
    out, (r0, _r1) = fsdp_run
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False)
    model = trainer.setup(make_lm(1), name="lm")
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2, weight_decay=0.01, eps=1e-4)
    first = trainer.load(out / "fsdp3")["step"]
    assert first == 3 and _equal(model.state_dict(), r0["fsdp_resume"]["loaded"])
    losses = []
    for step in range(first, STEPS):
        loss = lm_loss(model, rank_batch(step, 0, 1))  # the whole global batch
        trainer.backward(loss)
        trainer.clip_grad_norm(opt, 1.0)
        trainer.step(opt)
        losses.append(float(loss.detach()))
    torch.testing.assert_close(losses, _curve(r0["fsdp"])[3:], rtol=1e-5, atol=0)
    _close(model.state_dict(), r0["fsdp"]["final"])


@pytest.mark.slow
def test_a_sharded_checkpoint_of_two_ranks_resumes_on_gaudi_with_its_fused_optimizer(fsdp_run, hpu):
    """Written by 2 FSDP ranks with torch's AdamW, continued on one Gaudi (the stand-in) with hpex's FusedAdamW.

    FusedAdamW is another algorithm in rounding and eps placement than torch's AdamW, so the Gaudi run is not
    compared with the 2-rank run's end (they drift by about 1e-2 in 3 steps, as much as a FusedAdamW whose
    step count restarted). What must hold exactly: the loaded weights are the saved ones, FusedAdamW holds
    the saved moments and step count in its own layout, and its continuation equals, bitwise, a FusedAdamW
    given that state by hand over the same weights loaded on the CPU with torch's AdamW.
    """
    out, (r0, _r1) = fsdp_run
    trainer = devplug.Trainer(device="hpu", precision="32-true", seed=0, progress=False,
                              plugin_manager=hpu.plugin_manager())
    model = trainer.setup(make_lm(1), name="lm")
    opt = trainer.optimizer("adamw", model.parameters(), **ADAMW)
    assert trainer.optimizer_implementation(opt).startswith("habana_frameworks.torch.hpex.optimizers.FusedAdamW")
    assert trainer.load(out / "fsdp3")["step"] == 3
    assert _equal(model.state_dict(), r0["fsdp_resume"]["loaded"])

    cpu = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False)
    reference = cpu.setup(make_lm(2), name="lm")
    torch_opt = cpu.optimizer("adamw", reference.parameters(), **ADAMW)
    cpu.load(out / "fsdp3")
    assert _equal(reference.state_dict(), r0["fsdp_resume"]["loaded"])
    saved = torch_opt.state_dict()
    from habana_frameworks.torch.hpex.optimizers import FusedAdamW

    by_hand = FusedAdamW(reference.parameters(), **ADAMW)
    by_hand.param_groups[0]["step"] = 3  # FusedAdamW counts steps per group, its parameters' "step" stays 0
    assert [group["step"] for group in opt.param_groups] == [3]
    for index, (param, twin) in enumerate(zip(model.parameters(), reference.parameters(), strict=True)):
        moments = {k: saved["state"][index][k] for k in ("exp_avg", "exp_avg_sq")}
        assert int(saved["state"][index]["step"]) == 3
        assert opt.state[param].keys() == {"step", "exp_avg", "exp_avg_sq"} and opt.state[param]["step"] == 0
        assert all(torch.equal(opt.state[param][k], v) for k, v in moments.items())
        by_hand.state[twin] = {"step": 0, **{k: v.clone() for k, v in moments.items()}}

    for step in range(3, STEPS):
        tokens = rank_batch(step, 0, 1)  # the whole global batch
        loss = lm_loss(model, tokens)
        trainer.backward(loss)
        trainer.step(opt)
        expected = lm_loss(reference, tokens)
        expected.backward()
        by_hand.step()
        by_hand.zero_grad(set_to_none=True)
        assert torch.equal(loss.detach(), expected.detach()), step
        if step == 3:  # from the saved weights: the 2-rank run's loss at that step
            assert float(loss.detach()) == pytest.approx(r0["fsdp"]["losses"][3], rel=1e-5)
    assert _equal(model.state_dict(), reference.state_dict())
    assert not _equal(model.state_dict(), r0["fsdp_resume"]["loaded"])  # it trained on


@pytest.mark.slow
def test_the_asynchronous_save_completes_and_loads(fsdp_run):
    out, (r0, _r1) = fsdp_run
    assert is_sharded_checkpoint(out / "fsdp_end") and not list(out.glob(".fsdp_end.*partial"))
    assert not list(out.glob(".fsdp3.*partial"))  # the staging folders are named after the job's rank 0
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(make_lm(1), name="lm")
    trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    assert trainer.load(out / "fsdp_end")["step"] == STEPS
    assert _equal(model.state_dict(), r0["fsdp"]["final"])


@pytest.mark.slow
def test_a_consolidated_checkpoint_loads_into_a_plain_module_with_weights_only(fsdp_run, tmp_path):
    out, (r0, _r1) = fsdp_run
    written = toolkit.consolidate_checkpoint(out / "fsdp3", tmp_path / "lm.pt")
    weights = torch.load(written, weights_only=True)
    model = TinyLM()
    model.load_state_dict(weights)  # strict: every name, no extra
    assert _equal(model.state_dict(), r0["fsdp_resume"]["loaded"])


@pytest.mark.slow
def test_a_rank_killed_inside_a_sharded_save_restarts_from_the_last_complete_checkpoint(fsdp_run, tmp_path):
    """torchrun restarts both ranks after rank 1 dies with its shards half-saved; the job ends bitwise as if
    nothing happened, and the run folder holds complete checkpoints only (the partial one is removed, never loaded).
    """
    _out, (r0, _r1) = fsdp_run
    ckpt, events, final = tmp_path / "ckpt", tmp_path / "events.jsonl", tmp_path / "final.pt"
    every, kill_at = 2, 4  # policy saves after steps 2, 4 and 6: rank 1 dies inside the second one
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(WORLD), "--max-restarts", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{common.free_port()}", "--rdzv-id", "fsdp-kill",
        "--monitor-interval", "0.1",
        str(HERE / "train_fsdp_killed.py"), "--ckpt-dir", str(ckpt), "--events", str(events), "--final", str(final),
        "--every", str(every), "--kill-at", str(kill_at),
    ]
    try:
        # FSDP's per-step UserWarnings would push the ranks' tracebacks out of the output a failure shows
        proc = subprocess.run(command, env=common.clean_env({"PYTHONWARNINGS": "ignore::UserWarning"}),
                              cwd=common.REPO, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish:\n{exc.stdout}\n{exc.stderr}")
    log = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    output = f"events: {log}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-12000:]}"
    assert proc.returncode == 0, output

    (kill,) = [e for e in log if e["kind"] == "kill"]
    partial = kill["folder"]  # the staging folder, named after the job's rank 0
    # rank 1 died with its shard file written, before the coordinator could write .metadata
    assert kill["rank"] == 1 and re.fullmatch(rf"\.step_{kill_at:07d}\.pt\.[\w-]+\.\d+\.partial", partial), output
    assert kill["files"]["__1_0.distcp"] > 0 and ".metadata" not in kill["files"], output
    starts = sorted((e["rank"], e["restart"]) for e in log if e["kind"] == "start")
    assert starts == [(0, 0), (0, 1), (1, 0), (1, 1)], output
    for start in (e for e in log if e["kind"] == "start" and e["restart"] == 1):
        # what the restart found: the killed save's partial folder, without metadata, beside a complete checkpoint
        assert ".metadata" not in start["folder"][partial] and "__1_0.distcp" in start["folder"][partial], output
        assert ".metadata" in start["folder"][f"step_{every:07d}.pt"], output
        assert start["resumed"] == {"path": f"step_{every:07d}.pt", "step": every, "set_aside": 0}, output
    ends = [e for e in log if e["kind"] == "end"]
    assert sorted((e["rank"], e["restart"], e["global_step"]) for e in ends) == [(0, 1, STEPS), (1, 1, STEPS)]
    expected = {str(step): loss for step, loss in r0["fsdp"]["losses"].items() if step >= every}
    assert all(e["losses"] == expected for e in ends), output

    # the interrupted job ends bitwise where the uninterrupted one does
    assert _equal(torch.load(final, weights_only=True), r0["fsdp"]["final"])
    # complete checkpoints only: the next save of that step removed the partial folder, nothing else is left over
    names = [f"step_{step:07d}.pt" for step in range(every, STEPS + 1, every)]
    assert sorted(p.name for p in ckpt.iterdir()) == names
    assert all(is_sharded_checkpoint(ckpt / name) for name in names)

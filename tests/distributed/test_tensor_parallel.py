"""Tensor parallel and FSDP × tensor parallel on gloo ranks: the LM example's network (width 64, 2 layers).

One module-scoped scenario (tests/dist_scripts/train_tp.py, each run its own process group):

1. ``tp``: strategy="tp" on 2 ranks, 20 steps, a sharded checkpoint after step 10;
2. ``ft``: strategy="fsdp+tp", tp=2 on 4 ranks (dp=2 × tp=2), 6 steps, a checkpoint after step 3; then, in
   the same processes, compiled on that mesh (block by block inside the FSDP units) and trained with
   `SEQUENCE_PLAN` on it, saving after step 2;
3. ``fsdp_from_tp``: strategy="fsdp" on 2 ranks resumed from ``tp``'s checkpoint, a checkpoint after step 15;
4. ``tp_from_fsdp``: strategy="tp" on 2 ranks resumed from that FSDP checkpoint;
5. ``fsdp_from_ft``: strategy="fsdp" on 2 ranks resumed from ``ft``'s checkpoint.

Launches cost more than short runs, so three of them go on with a fresh model in the same processes:
``fsdp_from_tp`` compiled under FSDP (dp=2, block by block), ``fsdp_from_ft`` compiled under FSDP × TP with
dp=1 × tp=2 (tensor-parallel blocks compiled one by one inside their FSDP units), ``tp_from_fsdp`` compiled
whole under TP and then trained under TP with `SEQUENCE_PLAN` (sequence-parallel norms), saving after
step 2; each compiled run uses the CPU plugin's backend (inductor).

Each step accumulates two micro-batches and clips the gradient norm at 1.0. The reference is one process
with no strategy on the whole global batch. Tolerance (fp32): the tensor-parallel ranks add the partial
sums of the rowwise layers' products in another order than one process, and FSDP reduce-scatters; losses
and norms are compared at rtol 1e-5 and weights at atol 1e-5 (measured: losses agree to about 2e-7
relative after 20 steps), far below a missing reduction or a doubled gradient. Compiled runs: 1e-4 (the
generated kernels add in their own order; measured about 1e-7).
"""

from __future__ import annotations

import pytest
import torch
from dist_scripts import train_tp as scenario
from dist_scripts.common import HERE, run_ranks

import devplug
from devplug.core.distributed.tensor_parallel import check_plan, default_plan

STEPS, SAVE = 20, 10
FT_STEPS, FT_SAVE = 6, 3
COMPILE_STEPS = 3
SEQ_STEPS, SEQ_SAVE = 4, 2
COMPILED = "2 sharded blocks (Block) compiled with inductor"


def _launch(out, world: int, *args: str) -> None:
    run_ranks(HERE / "train_tp.py", ["--out", str(out), *args], world_size=world, timeout=400)


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """Run the scenario once; the folder and rank 0's record of each run."""
    out = tmp_path_factory.mktemp("tp")
    _launch(out, 2, "--strategy", "tp", "--steps", str(STEPS), "--save-after", str(SAVE), "--name", "tp")
    _launch(out, 4, "--strategy", "fsdp+tp", "--tp", "2", "--steps", str(FT_STEPS), "--save-after", str(FT_SAVE),
            "--name", "ft", "--compile-steps", str(COMPILE_STEPS), "--compile-tp", "2", "--sequence-steps",
            str(SEQ_STEPS), "--sequence-save", str(SEQ_SAVE), "--sequence-strategy", "fsdp+tp", "--sequence-tp", "2")
    _launch(out, 2, "--strategy", "fsdp", "--steps", str(STEPS), "--resume", f"tp_{SAVE}", "--save-after", "15",
            "--name", "fsdp_from_tp", "--compile-steps", str(COMPILE_STEPS))
    _launch(out, 2, "--strategy", "tp", "--steps", str(STEPS), "--resume", "fsdp_from_tp_15", "--name",
            "tp_from_fsdp", "--compile-steps", str(COMPILE_STEPS), "--sequence-steps", str(SEQ_STEPS),
            "--sequence-save", str(SEQ_SAVE))
    _launch(out, 2, "--strategy", "fsdp", "--steps", str(FT_STEPS), "--resume", f"ft_{FT_SAVE}", "--name",
            "fsdp_from_ft", "--compile-steps", str(COMPILE_STEPS), "--compile-strategy", "fsdp+tp",
            "--compile-tp", "2")
    records = {name: torch.load(out / f"{name}_rank0.pt", weights_only=False)
               for name in ("tp", "ft", "fsdp_from_tp", "tp_from_fsdp", "fsdp_from_ft")}
    return out, records


@pytest.fixture(scope="module")
def reference():
    """One process, no strategy, the whole global batch: STEPS steps."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False)
    model = trainer.setup(scenario.make_model(), name="lm")
    opt = trainer.optimizer("adamw", model.parameters(), **scenario.ADAMW)
    record = scenario.train(trainer, model, opt, range(STEPS), 0, 1)
    record["final"] = scenario.full_weights(model)
    trainer.close()
    return record


def _curve(losses: dict, steps: range) -> list[float]:
    assert sorted(losses) == list(steps)
    return [losses[s] for s in steps]


def _close_weights(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-5, msg=name)


def _one_process_resume(path, end: int | None = None) -> tuple[int, dict, dict]:
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False)
    torch.manual_seed(7)  # other initial weights: the load must replace them
    model = trainer.setup(scenario.LanguageModel(scenario.SPEC), name="lm")
    opt = trainer.optimizer("adamw", model.parameters(), **scenario.ADAMW)
    first = trainer.load(path)["step"]
    end = end or (STEPS if first == SAVE else FT_STEPS)
    record = scenario.train(trainer, model, opt, range(first, end), 0, 1)
    record["final"] = scenario.full_weights(model)
    trainer.close()
    return first, record, model


@pytest.mark.slow
def test_two_tensor_parallel_ranks_match_one_process(tp_run, reference):
    _out, runs = tp_run
    tp = runs["tp"]
    assert tp["reason"] == "device mesh dp=1 x tp=2"
    torch.testing.assert_close(_curve(tp["losses"], range(STEPS)), _curve(reference["losses"], range(STEPS)),
                               rtol=1e-5, atol=0)
    # clipping saw the norm of the whole gradient, split and replicated parts together
    torch.testing.assert_close(_curve(tp["norms"], range(STEPS)), _curve(reference["norms"], range(STEPS)),
                               rtol=1e-5, atol=0)
    _close_weights(tp["final"], reference["final"])
    # each rank holds half of every MLP weight: fewer parameters than the whole model
    whole = sum(v.numel() for k, v in reference["final"].items() if k != "head.weight")
    assert tp["local_numel"] < whole


@pytest.mark.slow
def test_fsdp_times_tensor_parallel_on_four_ranks_matches_one_process(tp_run, reference):
    _out, runs = tp_run
    ft = runs["ft"]
    assert ft["reason"].startswith("device mesh dp=2 x tp=2; FSDP")
    steps = range(FT_STEPS)
    torch.testing.assert_close(_curve(ft["losses"], steps), _curve(reference["losses"], range(STEPS))[:FT_STEPS],
                               rtol=1e-5, atol=0)
    torch.testing.assert_close(_curve(ft["norms"], steps), _curve(reference["norms"], range(STEPS))[:FT_STEPS],
                               rtol=1e-5, atol=0)
    assert ft["local_numel"] < runs["tp"]["local_numel"]  # FSDP halves what tensor parallel left


@pytest.mark.slow
def test_a_tensor_parallel_checkpoint_resumes_on_one_process(tp_run, reference):
    out, _runs = tp_run
    first, record, _model = _one_process_resume(out / f"tp_{SAVE}")
    assert first == SAVE
    torch.testing.assert_close(_curve(record["losses"], range(SAVE, STEPS)),
                               _curve(reference["losses"], range(STEPS))[SAVE:], rtol=1e-5, atol=0)
    _close_weights(record["final"], reference["final"])


@pytest.mark.slow
def test_a_tensor_parallel_checkpoint_resumes_under_fsdp_and_back(tp_run, reference):
    _out, runs = tp_run
    torch.testing.assert_close(_curve(runs["fsdp_from_tp"]["losses"], range(SAVE, STEPS)),
                               _curve(reference["losses"], range(STEPS))[SAVE:], rtol=1e-5, atol=0)
    torch.testing.assert_close(_curve(runs["tp_from_fsdp"]["losses"], range(15, STEPS)),
                               _curve(reference["losses"], range(STEPS))[15:], rtol=1e-5, atol=0)
    _close_weights(runs["tp_from_fsdp"]["final"], reference["final"])


@pytest.mark.slow
def test_an_fsdp_times_tensor_parallel_checkpoint_resumes_on_one_process_and_under_fsdp(tp_run, reference):
    out, runs = tp_run
    first, record, _model = _one_process_resume(out / f"ft_{FT_SAVE}")
    assert first == FT_SAVE
    expected = _curve(reference["losses"], range(STEPS))[FT_SAVE:FT_STEPS]
    torch.testing.assert_close(_curve(record["losses"], range(FT_SAVE, FT_STEPS)), expected, rtol=1e-5, atol=0)
    torch.testing.assert_close(_curve(runs["fsdp_from_ft"]["losses"], range(FT_SAVE, FT_STEPS)), expected,
                               rtol=1e-5, atol=0)
    _close_weights(record["final"], runs["fsdp_from_ft"]["final"])


@pytest.mark.slow
@pytest.mark.parametrize(("run", "mesh", "compiled"), [
    ("fsdp_from_tp", None, COMPILED),
    ("fsdp_from_ft", "device mesh dp=1 x tp=2; FSDP", COMPILED),
    ("tp_from_fsdp", "device mesh dp=1 x tp=2", "compiled whole with inductor"),
    ("ft", "device mesh dp=2 x tp=2; FSDP", COMPILED),
])
def test_compiled_runs_learn_the_eager_curve_in_one_graph(tp_run, reference, run, mesh, compiled):
    record = tp_run[1][run]["compiled"]
    assert record["summary"] == compiled  # the CPU plugin's backend, named
    if mesh is not None:
        assert record["reason"].startswith(mesh)
    steps = range(COMPILE_STEPS)
    torch.testing.assert_close(_curve(record["losses"], steps), _curve(reference["losses"], range(STEPS))[:3],
                               rtol=1e-4, atol=0)
    torch.testing.assert_close(_curve(record["norms"], steps), _curve(reference["norms"], range(STEPS))[:3],
                               rtol=1e-4, atol=0)
    # the DTensor and FSDP hooks trace: no graph break, and nothing compiled again after the first step
    assert record["graph_breaks"] == 0
    assert record["graphs"] == record["graphs_after_first_step"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize(("run", "mesh", "placements"), [
    ("tp_from_fsdp", "device mesh dp=1 x tp=2", "(Replicate(),)"),  # a norm's weight is whole on each rank
    ("ft", "device mesh dp=2 x tp=2; FSDP", "(Shard(dim=0), Replicate())"),  # FSDP shards it across dp only
])
def test_sequence_parallel_norms_match_one_process_and_resume_on_one(tp_run, reference, run, mesh, placements):
    out, runs = tp_run
    record = runs[run]["sequence"]
    assert record["reason"].startswith(mesh)
    assert record["norm_placements"] == placements
    steps = range(SEQ_STEPS)
    torch.testing.assert_close(_curve(record["losses"], steps), _curve(reference["losses"], range(STEPS))[:SEQ_STEPS],
                               rtol=1e-5, atol=0)
    # the norms' gradients, partial on each rank's half of the positions, were summed once
    torch.testing.assert_close(_curve(record["norms"], steps), _curve(reference["norms"], range(STEPS))[:SEQ_STEPS],
                               rtol=1e-5, atol=0)
    first, resumed, _model = _one_process_resume(out / f"{run}_sequence_{SEQ_SAVE}", end=SEQ_STEPS)
    assert first == SEQ_SAVE
    torch.testing.assert_close(_curve(resumed["losses"], range(SEQ_SAVE, SEQ_STEPS)),
                               _curve(record["losses"], steps)[SEQ_SAVE:], rtol=1e-5, atol=0)
    _close_weights(resumed["final"], record["final"])


def test_the_default_plan_splits_each_mlp_colwise_then_rowwise_and_leaves_attention_whole():
    plan = default_plan(scenario.make_model())
    assert plan == {"blocks.0.mlp.0": "colwise", "blocks.0.mlp.2": "rowwise",
                    "blocks.1.mlp.0": "colwise", "blocks.1.mlp.2": "rowwise"}


@pytest.mark.parametrize(("plan", "message"), [
    ({"blocks.*.ffn": "colwise"}, "has no submodule 'blocks.*.ffn'"),
    ({"blocks.*.mlp.0": "diagonal"}, "use one of colwise, rowwise, sequence"),
    (["blocks.0.mlp.0"], "takes a dict of module paths to styles"),
])
def test_a_wrong_tp_plan_is_one_clear_line(plan, message):
    with pytest.raises(devplug.ConfigError, match=message.replace("*", r"\*").replace(".", r"\.")):
        check_plan(scenario.make_model(), plan)


def test_tp_plan_without_a_tensor_parallel_strategy_is_refused():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    with pytest.raises(devplug.ConfigError, match=r"tp_plan=.*needs strategy='tp' or 'fsdp\+tp'"):
        trainer.setup(scenario.make_model(), tp_plan={"blocks.0.mlp.0": "colwise"})


def test_tensor_parallel_on_one_process_trains_as_plain_and_refuses_a_tp_that_does_not_divide():
    with pytest.raises(devplug.ConfigError, match="tp=2 does not divide the 1 process"):
        devplug.Trainer(device="cpu", precision="32-true", progress=False, strategy="tp", tp=2)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, strategy="tp")
    model = trainer.setup(scenario.make_model(), name="lm", tp_plan={"blocks.*.mlp.0": "colwise",
                                                                    "blocks.*.mlp.2": "rowwise"})
    assert type(model.blocks[0].mlp[0].weight).__name__ == "DTensor"
    assert model.head.weight is model.embed.weight  # the tied weight stays one parameter
    opt = trainer.optimizer("adamw", model.parameters(), **scenario.ADAMW)
    # over DTensor parameters: the torch.optim kernel the device plugin's sharding plan allows
    assert "foreach=True" in trainer.optimizer_implementation(opt)
    ours = scenario.train(trainer, model, opt, range(2), 0, 1)
    trainer.close()
    plain = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False)
    ref = plain.setup(scenario.make_model(), name="lm")
    expected = scenario.train(plain, ref, plain.optimizer("adamw", ref.parameters(), **scenario.ADAMW), range(2), 0, 1)
    torch.testing.assert_close(ours["losses"], expected["losses"], rtol=1e-6, atol=0)


def test_a_replicated_layer_gives_plain_tensors_when_compiled_too():
    # the hook that hands a replicated layer's output on as a plain tensor must survive tracing: else the
    # attention meets a DTensor (no sharding rule for it) and the compiled LM breaks apart or fails
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, strategy="tp")
    model = trainer.setup(scenario.make_model(), name="lm")
    qkv = model.blocks[0].qkv
    assert type(qkv.weight).__name__ == "DTensor"
    x = torch.randn(2, 4, scenario.SPEC.width)
    traced = torch.compile(lambda t: qkv(t) * 2, backend="eager", fullgraph=True)
    out = traced(x)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, qkv(x) * 2)
    trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "replicas"), [("tp", 1), ("ddp", 2)])
def test_a_tensor_parallel_jobs_rates_count_each_batch_once_and_each_device_its_share(strategy, replicas):
    # both ranks of a tensor-parallel pair read the same batches: the job's samples/s is one rank's rate (not
    # twice it), and each device is credited with half the FLOPs of a sample (the counter sees whole layers)
    import json

    results = run_ranks(HERE / "tp_rates.py", [strategy], world_size=2, timeout=200)
    for result in results:
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen["summary"] == pytest.approx(replicas)
        assert seen["logged"] == pytest.approx([replicas] * 3)
        assert seen["flops_per_sample"] == 2 * (6 * 16 + 16 * 1) + 2 * (6 * 16 + 16 * 1) + 2 * 16 * 1  # whole model
        assert seen["device_share"] == pytest.approx(replicas / 2)
        assert seen["mfu"] == pytest.approx(1.0)

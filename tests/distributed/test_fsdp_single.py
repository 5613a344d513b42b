"""Sharding on one process and its pieces: the plan records and hooks, unit choice, accumulation, clipping,
activation checkpointing, atomic sharded saves, and the refusal of a device that cannot shard."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from dist_scripts.fsdp_model import Block, TinyLM, lm_loss, make_lm, rank_batch

import devplug
from devplug import ShardingPlan, toolkit
from devplug.core.checkpoint import sharded
from devplug.core.checkpoint.tempfiles import remove_stale_temp_files
from devplug.core.distributed import fsdp
from devplug.core.errors import CheckpointError, ConfigError
from devplug.core.registry.manager import create_plugin_manager


def _trainer(**options):
    return devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0, **options)


def _spec_device(name="cpu"):
    from devplug.core.registry.devices import DeviceRegistry

    return DeviceRegistry(create_plugin_manager(autoload=False)).resolve(name)


# ---- the plan ------------------------------------------------------------------------------------------


def test_a_plan_that_cannot_shard_needs_its_reason():
    with pytest.raises(ValueError, match="needs a reason"):
        ShardingPlan(supported=False)
    with pytest.raises(ValueError, match="optimizer_kernel"):
        ShardingPlan(supported=True, optimizer_kernel="apex")
    with pytest.raises(ValueError, match=r"torch\.dtype"):
        ShardingPlan(supported=True, param_dtype="bf16")
    assert ShardingPlan.unsupported("x: no; use y").reason == "x: no; use y"


def test_the_cpu_plan_keeps_gloo_in_fp32_and_the_generic_plan_gathers_in_low_precision():
    device = _spec_device("cpu")
    from devplug.plugins.cpu import plugin as cpu_plugin

    plan = cpu_plugin.devplug_sharding(device, "bf16-mixed")
    assert plan.supported and plan.param_dtype is None and plan.optimizer_kernel == "foreach"
    generic = toolkit.torch_sharding_plan(device, "bf16-mixed", gather_low_precision=True)
    assert (generic.param_dtype, generic.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert toolkit.torch_sharding_plan(device, "32-true").reduce_dtype is None


def test_the_cuda_plan_uses_the_fused_kernel_and_offers_offload():
    from devplug.plugins.cuda import plugin as cuda_plugin

    plan = cuda_plugin.devplug_sharding(_spec_device("cpu"), "16-mixed")
    assert (plan.param_dtype, plan.reduce_dtype, plan.optimizer_kernel, plan.cpu_offload) == \
        (torch.float16, torch.float32, "fused", True)


def test_a_device_type_without_a_collective_backend_cannot_shard(monkeypatch):
    from devplug.core.fallback import accelerator

    device = _spec_device("cpu")
    monkeypatch.setattr(accelerator, "collective_backend", lambda kind: "gloo")
    monkeypatch.setattr(accelerator, "is_current_accelerator", lambda kind: False)
    monkeypatch.setattr(type(device), "torch_device", property(lambda self: torch.device("meta")))
    plan = toolkit.torch_sharding_plan(device, "32-true")
    assert not plan.supported and plan.reason.startswith("cpu:") and "strategy='auto'" in plan.reason
    assert "\n" not in plan.reason


class NoSharding:
    @devplug.hookimpl(tryfirst=True)
    def devplug_sharding(self, device, precision):
        return ShardingPlan.unsupported(f"{device}: no reduce-scatter here; use strategy='ddp'")


def test_a_trainer_on_a_device_that_cannot_shard_says_so_in_one_line():
    manager = create_plugin_manager(autoload=False)
    manager.register(NoSharding(), name="no-sharding")
    with pytest.raises(ConfigError, match=r"strategy='fsdp' is not available: cpu: no reduce-scatter here; use"):
        devplug.Trainer(device="cpu", precision="32-true", progress=False, strategy="fsdp", plugin_manager=manager)


def test_strategy_and_shard_are_validated():
    with pytest.raises(ConfigError, match="strategy"):
        _trainer(strategy="zero3")
    trainer = _trainer()
    assert trainer.strategy == "none" and trainer.sharding is None
    with pytest.raises(ConfigError, match="needs Trainer\\(strategy='fsdp'\\)"):
        trainer.setup(make_lm(), shard=[Block])


# ---- units -----------------------------------------------------------------------------------------------


def test_units_are_the_named_classes_innermost_first_or_submodules_above_a_size():
    model = make_lm()
    assert fsdp.shard_targets(model, [Block]) == [model.blocks[1], model.blocks[0]]
    # each Block holds 3,312 parameters; the embedding 512
    assert fsdp.shard_targets(model, 3000) == [model.blocks[0], model.blocks[1]]
    assert fsdp.shard_targets(model, None) == []  # below the default: the root alone
    with pytest.raises(ConfigError, match="holds no instance"):
        fsdp.shard_targets(model, [torch.nn.Conv2d])
    with pytest.raises(ConfigError, match="module classes or a positive parameter count"):
        fsdp.shard_targets(model, 0)


# ---- one process -----------------------------------------------------------------------------------------


def test_one_process_shards_on_a_group_of_one_and_trains_like_the_plain_model():
    reference = make_lm()
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, foreach=True)
    trainer = _trainer(strategy="fsdp")
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    assert fsdp.is_sharded(model) and all(hasattr(p, "placements") for p in model.parameters())
    assert trainer.optimizer_implementation(opt) == "torch.optim.AdamW(foreach=True)"
    for step in range(2):
        tokens = rank_batch(step, 0, 1)
        trainer.backward(lm_loss(model, tokens))
        norm = trainer.clip_grad_norm(opt, 0.5)
        trainer.step(opt)
        lm_loss(reference, tokens).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad()
        assert type(norm) is torch.Tensor  # the replicated DTensor norm as a plain tensor
        torch.testing.assert_close(norm, ref_norm)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.full_tensor(), reference.state_dict()[name], rtol=0, atol=1e-6)
    trainer.close()


def test_accumulation_skips_the_reduce_scatter_until_the_last_micro_batch():
    trainer = _trainer(strategy="fsdp", accumulate_grad_batches=2)
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    switched = []
    original = model.set_requires_gradient_sync
    model.set_requires_gradient_sync = lambda value, **kw: (switched.append(value), original(value, **kw))[1]
    whole = rank_batch(0, 0, 1)
    for half in trainer.dataloader(iter([whole[:4], whole[4:]])):
        with trainer.accumulate(model):
            trainer.backward(lm_loss(model, half))
            trainer.step(opt)
    assert switched == [False, True]  # off for the first micro-batch, back on for the step's last
    reference = make_lm()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    (sum(lm_loss(reference, h) for h in (whole[:4], whole[4:])) / 2).backward()
    ref_opt.step()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.full_tensor(), reference.state_dict()[name], rtol=0, atol=1e-6)


def test_activation_checkpointing_recomputes_blocks_and_keeps_gradients_and_names(tmp_path):
    calls = []
    trainer = _trainer()
    model = trainer.setup(make_lm(), name="lm", activation_checkpointing=[Block])
    model.blocks[0].qkv.register_forward_pre_hook(lambda *_: calls.append(1))
    lm_loss(model, rank_batch(0, 0, 1)).backward()
    assert len(calls) == 2  # forward, then again in backward
    reference = make_lm()
    lm_loss(reference, rank_batch(0, 0, 1)).backward()
    for (name, p), (ref_name, ref) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert name == ref_name
        torch.testing.assert_close(p.grad, ref.grad, rtol=0, atol=1e-7)
    with pytest.raises(ConfigError, match="holds no instance"):
        _trainer().setup(make_lm(), activation_checkpointing=[torch.nn.Conv2d])


def test_activation_checkpointing_under_sharding_on_one_process():
    trainer = _trainer(strategy="fsdp")
    model = trainer.setup(make_lm(), name="lm", shard=[Block], activation_checkpointing=[Block])
    reference = make_lm()
    loss = lm_loss(model, rank_batch(0, 0, 1))
    trainer.backward(loss)
    lm_loss(reference, rank_batch(0, 0, 1)).backward()
    for (name, p), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad.full_tensor(), ref.grad, rtol=0, atol=1e-6, msg=name)


# ---- sharded checkpoints -----------------------------------------------------------------------------------


def _sharded_trainer():
    trainer = _trainer(strategy="fsdp")
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    trainer.backward(lm_loss(model, rank_batch(0, 0, 1)))
    trainer.step(opt)
    return trainer, model


def test_a_killed_save_keeps_the_last_good_checkpoint_and_is_never_taken_for_one(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    trainer, model = _sharded_trainer()
    target = tmp_path / "ckpt"
    trainer.save(target, note="good")
    good = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    trainer.backward(lm_loss(model, rank_batch(1, 0, 1)))
    trainer.step(trainer._optimizers["lm"].optimizer)

    def killed(state, checkpoint_id):
        (sharded.Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(dcp, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save(target, note="bad")
    monkeypatch.undo()
    assert sharded.partial_path(target).exists() and not sharded.is_sharded_checkpoint(sharded.partial_path(target))
    # it names its writer, alive here, so tidying the folder keeps it
    assert (sharded.partial_path(target) / ".writer").read_text().split()[1] == str(os.getpid())
    assert remove_stale_temp_files(tmp_path) == [] and sharded.partial_path(target).exists()
    with pytest.raises(CheckpointError, match="not a complete sharded checkpoint"):
        trainer.load(sharded.partial_path(target))
    assert trainer.load(target) == {"note": "good"}
    for name, value in model.state_dict().items():
        assert torch.equal(value.full_tensor(), good[name])
    trainer.save(target, note="again")  # the next save clears what the killed one left
    assert not sharded.partial_path(target).exists() and trainer.load(target) == {"note": "again"}


def test_a_plain_checkpoint_loads_into_a_sharded_run_and_back(tmp_path):
    plain = _trainer()
    model = plain.setup(make_lm(), name="lm")
    opt = plain.optimizer("adamw", model.parameters(), lr=1e-2)
    plain.backward(lm_loss(model, rank_batch(0, 0, 1)))
    plain.step(opt)
    plain.save(tmp_path / "plain.pt", tag=1)
    trainer = _trainer(strategy="fsdp")
    sharded_model = trainer.setup(make_lm(1), name="lm", shard=[Block])
    sharded_opt = trainer.optimizer("adamw", sharded_model.parameters(), lr=1e-2)
    assert trainer.load(tmp_path / "plain.pt") == {"tag": 1}
    for name, value in sharded_model.state_dict().items():
        assert torch.equal(value.full_tensor(), model.state_dict()[name])
    moments = sharded_opt.state_dict()["state"][0]["exp_avg"].full_tensor()
    assert torch.equal(moments, opt.state_dict()["state"][0]["exp_avg"])
    trainer.save(tmp_path / "folder")
    back = _trainer()
    again = back.setup(make_lm(2), name="lm")
    back.optimizer("adamw", again.parameters(), lr=1e-2)
    back.load(tmp_path / "folder")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in again.state_dict().items())


def _full(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def _moments(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [_full(optimizer.state[p]["exp_avg"]).clone() for p in optimizer.param_groups[0]["params"]]


def test_a_load_after_a_backward_restores_the_optimizer_state_and_keeps_the_gradients(tmp_path):
    # torch creates the state a load fills only while no parameter has a gradient: a backward before the
    # load used to leave the optimizer without its moments (or, plain into sharded, fail inside torch)
    saved, _model = _sharded_trainer()
    saved.save(tmp_path / "folder")
    plain = _trainer()
    plain_model = plain.setup(make_lm(), name="lm")
    plain_opt = plain.optimizer("adamw", plain_model.parameters(), lr=1e-2)
    plain.backward(lm_loss(plain_model, rank_batch(0, 0, 1)))
    plain.step(plain_opt)
    plain.save(tmp_path / "plain.pt")
    expected = {"folder": _moments(saved._optimizers["lm"].optimizer), "plain.pt": _moments(plain_opt)}
    for source, strategy in [("folder", "fsdp"), ("folder", "auto"), ("plain.pt", "fsdp")]:
        trainer = _trainer(strategy=strategy)
        model = trainer.setup(make_lm(1), name="lm", **({"shard": [Block]} if strategy == "fsdp" else {}))
        opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
        trainer.backward(lm_loss(model, rank_batch(1, 0, 1)))
        grads = [_full(p.grad).clone() for p in model.parameters()]
        trainer.load(tmp_path / source)
        assert len(opt.state) == len(grads), (source, strategy)
        assert all(torch.equal(a, b) for a, b in zip(_moments(opt), expected[source], strict=True)), (source, strategy)
        assert all(torch.equal(_full(p.grad), g) for p, g in zip(model.parameters(), grads, strict=True))


def test_a_sharded_checkpoint_that_does_not_fit_is_refused(tmp_path):
    trainer, _model = _sharded_trainer()
    trainer.save(tmp_path / "ckpt")
    other = _trainer()
    other.setup(TinyLM(), name="other")
    with pytest.raises(CheckpointError, match="does not match this run"):
        other.load(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="holds no module 'x'"):
        toolkit.consolidate_checkpoint(tmp_path / "ckpt", tmp_path / "x.pt", module="x")
    deeper = _trainer()  # the same names, a module with a layer the checkpoint lacks: DCP finds no entry for it
    deeper_model = deeper.setup(TinyLM(layers=3), name="lm")
    deeper.optimizer("adamw", deeper_model.parameters(), lr=1e-2)
    with pytest.raises(CheckpointError, match=r"does not fit this run.*: Missing key .*lm\.blocks\.2"):
        deeper.load(tmp_path / "ckpt")


class Batches:
    """The same batches, in the same order, each time it is iterated (so a resume can skip the consumed ones)."""

    def __init__(self, items: list[torch.Tensor]) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)


def test_a_checkpoint_policy_saves_prunes_and_resumes_sharded_checkpoints(tmp_path):
    def run(steps: int, resume: bool) -> tuple[devplug.Trainer, dict[str, torch.Tensor]]:
        policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=2, keep_last=2,
                                          auto_resume=resume)
        trainer = _trainer(strategy="fsdp", checkpoints=policy, stop_signals=())
        model = trainer.setup(make_lm(), name="lm", shard=[Block])
        opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
        loader = trainer.dataloader(Batches([rank_batch(i, 0, 1) for i in range(6)]))
        for _ in trainer.epochs(1, max_steps=steps):
            for batch in loader:
                trainer.backward(lm_loss(model, batch))
                trainer.step(opt)
        trainer.close()
        return trainer, {k: v.full_tensor().clone() for k, v in model.state_dict().items()}

    _whole, whole = run(6, resume=False)
    shutil.rmtree(tmp_path / "ckpt")
    run(3, resume=False)
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step_"))
    assert saved == ["step_0000002.pt", "step_0000003.pt"]  # folders, one per checkpoint; the end saved too
    assert all(sharded.is_sharded_checkpoint(tmp_path / "ckpt" / name) for name in saved)
    resumed, weights = run(6, resume=True)
    assert resumed.global_step == 6
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step_")) == [
        "step_0000004.pt", "step_0000006.pt"]  # the older folders pruned
    assert all(torch.equal(weights[k], whole[k]) for k in whole)


def test_a_sharded_checkpoint_loads_without_a_process_group_and_without_a_warning(tmp_path):
    import warnings

    trainer = _trainer(strategy="fsdp")
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    trainer.save(tmp_path / "ckpt", step=1)
    torch.distributed.destroy_process_group()  # a later process: resumes on one process without sharding
    plain = _trainer()
    plain.setup(make_lm(1), name="lm")
    plain.optimizer("adamw", plain._modules["lm"].parameters(), lr=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DCP's "assuming the intent is to load in a single process" included
        assert plain.load(tmp_path / "ckpt")["step"] == 1


def test_a_sharded_checkpoint_keeps_group_settings_added_after_the_optimizer_was_built(tmp_path):
    schedule = devplug.LRSchedule(total_steps=10, warmup_steps=4)  # keeps the peak as the groups' initial_lr
    trainer = _trainer(strategy="fsdp")
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    for step in (1, 2):
        schedule.apply(opt, step)
        trainer.backward(lm_loss(model, rank_batch(step, 0, 1)))
        trainer.step(opt)
    trainer.save(tmp_path / "ckpt", step=2)
    again = _trainer(strategy="fsdp")
    fresh = again.optimizer("adamw", again.setup(make_lm(1), name="lm", shard=[Block]).parameters(), lr=1e-2)
    again.load(tmp_path / "ckpt")
    assert fresh.param_groups[0]["initial_lr"] == 1e-2 and fresh.param_groups[0]["lr"] == pytest.approx(5e-3)
    schedule.apply(fresh, 3)  # the resumed run's learning rate is the uninterrupted run's
    assert fresh.param_groups[0]["lr"] == pytest.approx(7.5e-3)


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_mixed_precision_trains_sharded_through_autocast_and_the_grad_scaler(precision):
    trainer = devplug.Trainer(device="cpu", precision=precision, progress=False, seed=0, strategy="fsdp")
    assert (trainer.precision.scaler is not None) == (precision == "16-mixed")
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    losses = []
    for step in range(3):
        with trainer.autocast():
            loss = lm_loss(model, rank_batch(step, 0, 1))
        trainer.backward(loss)
        norm = trainer.clip_grad_norm(opt, 1.0)
        assert trainer.step(opt) and torch.isfinite(norm)
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.slow
def test_a_sharded_module_is_compiled_block_by_block_after_sharding_and_trains_the_same():
    losses = {}
    for compiled in (False, True):
        options = {"compile": True, "compile_options": {"backend": "aot_eager"}} if compiled else {}
        trainer = _trainer(strategy="fsdp", **options)
        model = trainer.setup(make_lm(), name="lm", shard=[Block])
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        assert fsdp.is_sharded(trainer._modules["lm"]) and type(model).__name__ != "OptimizedModule"  # root eager
        assert blocks and all((m._compiled_call_impl is not None) == compiled for m in blocks)
        assert trainer.summary()["compiled"] == (
            {"lm": f"{len(blocks)} sharded blocks (Block) compiled with aot_eager"} if compiled else {})
        opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
        for step in range(3):
            loss = lm_loss(model, rank_batch(step, 0, 1))
            trainer.backward(loss)
            trainer.step(opt)
        losses[compiled] = float(loss.detach())
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)

"""The loop a model author writes: a training loader, an evaluation loader, accumulation, clipping, a schedule.

Steps are training iterations (one per optimizer-step round); evaluation loaders never move them.
"""

from __future__ import annotations

import math
import multiprocessing
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import devplug
from devplug.plugins.cpu import plugin as cpu_plugin

TRAIN, EVAL, BATCH = 32, 10, 4  # 8 training micro-batches per epoch; 3 evaluation batches (an odd number)


def datasets() -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(TRAIN + EVAL, 6, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return TensorDataset(x[:TRAIN], y[:TRAIN]), TensorDataset(x[TRAIN:], y[TRAIN:])


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / 3)


class Run:
    """A Trainer with the author's loop: accumulation over 2, clipping, LambdaLR, a mid-epoch and an epoch-end eval."""

    def __init__(self, *, workers: int = 0, accumulation: int = 2, seed: int = 0, **options) -> None:
        train, evaluation = datasets()
        options.setdefault("progress", False)
        self.trainer = devplug.Trainer(device="cpu", precision="32-true", seed=seed, log_every=2,
                                       accumulate_grad_batches=accumulation, **options)
        self.model = self.trainer.setup(make_model(), name="net")
        self.opt = self.trainer.optimizer("adamw", self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warmup)
        self.train_loader = self.trainer.dataloader(train, BATCH, shuffle=True, num_workers=workers)
        self.eval_loader = self.trainer.dataloader(evaluation, BATCH, train=False, num_workers=workers)
        self.eval_sizes: list[int] = []
        self.log_steps: list[int] = []
        self.optimizer_steps = 0

    def evaluate(self) -> None:
        self.model.eval()
        seen = 0
        with torch.no_grad():
            for x, _ in self.eval_loader:
                seen += x.shape[0]
        self.model.train()
        self.eval_sizes.append(seen)

    def train(self, epochs: int, *, max_steps: int | None = None, stop_after_eval_at: int | None = None) -> bool:
        """Train; with ``stop_after_eval_at``, save right after that step's mid-epoch eval and stop (True)."""
        trainer = self.trainer
        for _epoch in trainer.epochs(epochs, max_steps=max_steps):
            for x, y in self.train_loader:
                with trainer.accumulate(self.model):
                    with trainer.autocast():
                        loss = torch.nn.functional.mse_loss(self.model(x), y)
                    trainer.backward(loss)
                    trainer.clip_grad_norm(self.opt, 0.5)
                    if trainer.step(self.opt):
                        self.sched.step()
                        self.optimizer_steps += 1
                if trainer.log(loss=loss) is not None:
                    self.log_steps.append(trainer.global_step)
                if trainer.sync_gradients and trainer.global_step % 3 == 0:
                    self.evaluate()
                    if trainer.global_step == stop_after_eval_at:
                        self.path = trainer.save(self.folder / "mid.pt", scheduler=self.sched.state_dict())
                        return True
            self.evaluate()
        return False

    def weights(self) -> list[torch.Tensor]:
        return [t.detach().clone() for t in self.model.state_dict().values()]


def test_steps_are_optimizer_steps_and_evaluation_never_moves_them():
    run = Run()
    run.train(3)
    assert run.optimizer_steps == 12  # 3 epochs x 8 micro-batches / 2
    assert run.trainer.global_step == 12
    assert run.eval_sizes == [EVAL] * len(run.eval_sizes) and len(run.eval_sizes) == 4 + 3
    assert run.log_steps == [2, 4, 6, 8, 10, 12]
    assert run.trainer.summary()["steps"] == 12


def test_max_steps_counts_steps_and_the_eval_loader_still_yields_everything():
    run = Run()
    run.train(3, max_steps=6)
    assert run.trainer.global_step == run.optimizer_steps == 6
    assert run.eval_sizes and all(size == EVAL for size in run.eval_sizes)


def test_the_progress_total_comes_from_the_training_loader():
    run = Run(progress=True)
    seen = []
    for _epoch in run.trainer.epochs(2):
        seen.append(run.trainer._reporter.progress_bar.total)
        for _ in run.eval_loader:
            pass
        break
    assert seen == [8]  # 2 epochs x 4 steps, not the eval loader's 3 batches


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_after_a_mid_epoch_eval_ends_bitwise_equal(tmp_path, workers):
    full = Run(workers=workers)
    full.train(3)

    first = Run(workers=workers)
    first.folder = tmp_path
    assert first.train(3, stop_after_eval_at=6) is True  # mid-epoch: epoch 1 has steps 5-8

    resumed = Run(workers=workers, seed=11)  # another seed: everything must come from the checkpoint
    extra = resumed.trainer.load(first.path)
    resumed.sched.load_state_dict(extra["scheduler"])
    assert (resumed.trainer.global_step, resumed.trainer.epoch) == (6, 1)
    resumed.train(3)
    assert resumed.trainer.global_step == full.trainer.global_step == 12
    for a, b in zip(full.weights(), resumed.weights(), strict=True):
        assert torch.equal(a, b)


def _new_workers(before: set[int]) -> int:
    """Live child processes started since ``before`` (the loaders' workers)."""
    return sum(1 for child in multiprocessing.active_children() if child.pid not in before)


def test_the_loaders_workers_are_gone_when_the_loop_ends_even_when_it_leaves_mid_epoch(tmp_path):
    before = {child.pid for child in multiprocessing.active_children()}
    run = Run(workers=2)
    run.folder = tmp_path
    assert run.train(3, stop_after_eval_at=6) is True  # returns from inside both loops, mid-epoch
    # persistent workers (2 per loader) would live until the Trainer is garbage collected: as part of a
    # reference cycle, torch's clean-up then cannot reach them and waits 5 s per worker before killing it
    assert _new_workers(before) == 0
    run.evaluate()  # a loader used after the loop starts new workers, and still yields everything
    assert run.eval_sizes[-1] == EVAL and _new_workers(before) == 2
    run.trainer.close()
    assert _new_workers(before) == 0


class FailsAt(torch.utils.data.Dataset):
    """Eight samples; reading sample ``bad`` raises (in a loader worker: torch re-raises it in the loop)."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad:
            raise ValueError(f"sample {index} is broken")
        return torch.full((2,), float(index))


def test_a_pass_that_fails_in_a_worker_stops_its_workers_although_the_error_is_kept():
    before = {child.pid for child in multiprocessing.active_children()}
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    loader = trainer.dataloader(FailsAt(bad=5), 2, num_workers=2, persistent_workers=False)
    with pytest.raises(ValueError, match="sample 5 is broken") as caught:
        for _epoch in trainer.epochs(1):
            for _batch in loader:
                pass
    # the kept error's traceback holds torch's iterator: its workers would live as long as the error does
    assert caught.value is not None and _new_workers(before) == 0


def test_the_loop_is_bitwise_equal_to_plain_pytorch():
    run = Run()
    run.train(2)

    torch.manual_seed(0)
    model = make_model()
    fused = {"fused": True} if cpu_plugin.supports_fused("adamw") else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    train, _ = datasets()
    sampler = DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=BATCH, sampler=sampler, generator=torch.Generator())  # no global RNG draw
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / 2
            loss.backward()
            if i % 2 == 1:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
    for a, b in zip([t.detach() for t in model.state_dict().values()], run.weights(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_inside_an_accumulation_window_resumes_at_the_windows_start(tmp_path):
    full = Run()
    full.train(1)
    first = Run()
    trainer = first.trainer
    for _epoch in trainer.epochs(1):
        for i, (x, y) in enumerate(first.train_loader):
            with trainer.accumulate(first.model):
                trainer.backward(torch.nn.functional.mse_loss(first.model(x), y))
                trainer.clip_grad_norm(first.opt, 0.5)
                if trainer.step(first.opt):
                    first.sched.step()
            if i == 2:  # the first micro-batch of step 2
                path = trainer.save(tmp_path / "window.pt", scheduler=first.sched.state_dict())
                break
        break
    resumed = Run(seed=3)
    resumed.sched.load_state_dict(resumed.trainer.load(path)["scheduler"])
    assert (resumed.trainer.global_step, resumed.trainer._position.batches_in_epoch) == (1, 2)
    resumed.train(1)
    assert resumed.trainer.global_step == full.trainer.global_step == 4
    # The step is recomputed from its first micro-batch; the RNG state is the one at the save, so dropout
    # draws other masks for the recomputed micro-batch: close to the uninterrupted run, not bitwise equal.
    for a, b in zip(full.weights(), resumed.weights(), strict=True):
        assert torch.allclose(a, b, atol=0.05)


# ---- the author's own loaders ------------------------------------------------------------------------------
def _loop(trainer, model, opt, loader, *, epochs: int = 3, max_steps: int | None = None) -> list[int]:
    logged = []
    for _epoch in trainer.epochs(epochs, max_steps=max_steps):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            if trainer.log(loss=model(x).mean()) is not None:
                logged.append(trainer.global_step)
    return logged


def test_the_authors_dataloader_trains_logs_and_stops_at_max_steps():
    trainer = devplug.Trainer(device="cpu", progress=False, log_every=2, seed=0)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.05)
    loader = trainer.dataloader(DataLoader(datasets()[0], batch_size=BATCH, shuffle=True))
    assert loader.implementation == "author's DataLoader(workers=0)"
    assert _loop(trainer, model, opt, loader, max_steps=5) == [2, 4]
    assert trainer.global_step == 5


def test_a_generator_of_batches_trains_logs_and_stops_at_max_steps():
    trainer = devplug.Trainer(device="cpu", progress=False, log_every=2, seed=0)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.05)
    train, _ = datasets()
    batches = (train[i:i + BATCH] for i in range(0, TRAIN, BATCH))
    assert _loop(trainer, model, opt, trainer.dataloader(batches), epochs=1, max_steps=6) == [2, 4, 6]
    assert trainer.global_step == 6


def test_a_batch_size_that_contradicts_the_authors_dataloader_is_a_clear_error():
    trainer = devplug.Trainer(device="cpu", progress=False)
    with pytest.raises(devplug.ConfigError, match="differs from your DataLoader's batch_size=4"):
        trainer.dataloader(DataLoader(datasets()[0], batch_size=4), 8)
    with pytest.raises(devplug.ConfigError, match="batch_size is required"):
        trainer.dataloader(datasets()[0])


def test_the_authors_shuffled_dataloader_resumes_at_the_same_sample(tmp_path):
    def order(trainer, loader, stop=None):
        seen = []
        for _epoch in trainer.epochs(2):
            for x, _ in loader:
                seen.append(round(float(x[0, 0]), 5))
                if len(seen) == stop:
                    return seen, trainer.save(tmp_path / "own.pt")
        return seen, None

    def build(seed):
        trainer = devplug.Trainer(device="cpu", progress=False, seed=seed)
        trainer.setup(make_model())
        return trainer, trainer.dataloader(DataLoader(datasets()[0], batch_size=BATCH, shuffle=True))

    full, _ = order(*build(0))
    head, path = order(*build(0), stop=11)
    resumed, loader = build(4)
    resumed.load(path)
    tail, _ = order(resumed, loader)
    assert head + tail == full


class CountingDataset(TensorDataset):
    """The training set, recording every index whose sample is read."""

    def __init__(self) -> None:
        super().__init__(*datasets()[0].tensors)
        self.read: list[int] = []

    def __getitem__(self, index):
        self.read.append(index)
        return super().__getitem__(index)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_resumed_epoch_reads_none_of_the_samples_it_skips(tmp_path, accumulation):
    def run(seed, stop=None, path=None, own_loader=False):
        trainer = devplug.Trainer(device="cpu", progress=False, seed=seed, accumulate_grad_batches=accumulation)
        trainer.setup(make_model(), name="net")
        data = CountingDataset()
        source = DataLoader(data, batch_size=BATCH, shuffle=True) if own_loader else data
        loader = trainer.dataloader(source, None if own_loader else BATCH, shuffle=True, num_workers=0)
        if path is not None:
            trainer.load(path)
        data.read.clear()
        batches = []
        for _ in trainer.epochs(2, max_steps=stop):
            batches += [x for x, _ in loader]
        return batches, data.read, trainer.save(tmp_path / f"{seed}.pt") if stop else None

    full, _, _ = run(0)
    stop = 5 if accumulation == 1 else 3  # 5 (or 6) of the 8 batches of the first epoch
    head, _, path = run(0, stop=stop)
    tail, read, _ = run(7, path=path)
    assert len(head) + len(tail) == len(full) == 16
    assert all(torch.equal(a, b) for a, b in zip(head + tail, full, strict=True))
    assert len(read) == TRAIN * 2 - len(head) * BATCH  # the rest of the first epoch and the second: nothing else

    own_tail, own_read, _ = run(7, path=path, own_loader=True)  # a loader devplug did not build draws them
    assert len(own_tail) == len(tail) and len(own_read) == TRAIN * 2


# ---- clipping ---------------------------------------------------------------------------------------------
def test_clipping_under_16_mixed_matches_torchs_recipe_and_unscales_once():
    train, _ = datasets()
    trainer = devplug.Trainer(device="cpu", precision="16-mixed", progress=False, seed=0)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    calls = []
    real_unscale = trainer.scaler.unscale_
    trainer.scaler.unscale_ = lambda o: (calls.append(o), real_unscale(o))[1]
    norms = []
    for i in range(0, 16, BATCH):
        x, y = train[i:i + BATCH]
        with trainer.autocast():
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        trainer.backward(loss)
        norms.append(trainer.clip_grad_norm(opt, 0.05))
        trainer.step(opt)

    torch.manual_seed(0)  # the reference draws the same initial weights and dropout masks
    ref_model = make_model()
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    ref_scaler = torch.amp.GradScaler("cpu")
    ref_norms = []
    for i in range(0, 16, BATCH):
        x, y = train[i:i + BATCH]
        with torch.autocast("cpu", dtype=torch.float16):
            ref_loss = torch.nn.functional.mse_loss(ref_model(x).float(), y)
        ref_scaler.scale(ref_loss).backward()
        ref_scaler.unscale_(ref_opt)
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.05))
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        ref_opt.zero_grad(set_to_none=True)
    assert len(calls) == 4  # once per step; the scaler's own step did not unscale again
    assert torch.equal(torch.stack(norms), torch.stack(ref_norms))  # inf included: that step is skipped alike
    for a, b in zip(ref_model.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_clip_grad_value_clamps_after_unscaling():
    trainer = devplug.Trainer(device="cpu", precision="16-mixed", progress=False, seed=0)
    model = trainer.setup(torch.nn.Linear(6, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    x, y = datasets()[0][:BATCH]
    with trainer.autocast():
        trainer.backward(torch.nn.functional.mse_loss(model(x).float(), y) * 0.01)
    scaled = [p.grad.clone() for p in model.parameters()]
    true_grads = [g / trainer.scaler.get_scale() for g in scaled]
    assert trainer.clip_grad_value(opt, 1e-3) is True
    for p, g in zip(model.parameters(), true_grads, strict=True):
        assert torch.equal(p.grad, g.clamp(-1e-3, 1e-3))  # clamped in the true gradients' units


# ---- loop hygiene -------------------------------------------------------------------------------------------
def test_breaking_out_of_epochs_reports_pending_values():
    trainer = devplug.Trainer(device="cpu", progress=False, log_every=100)
    loader = trainer.dataloader(datasets()[0], BATCH)
    for _epoch in trainer.epochs(2):
        for x, _ in loader:
            trainer.log(value=x.mean())
        break
    assert "value" in trainer.last_metrics
    assert trainer.flush_logs() == trainer.last_metrics  # nothing pending: the last reported values


def test_flush_logs_right_after_a_log_point_returns_the_last_values():
    trainer = devplug.Trainer(device="cpu", progress=False, log_every=1)
    loader = trainer.dataloader(datasets()[0], BATCH)
    for _epoch in trainer.epochs(1):
        for x, _ in loader:
            reported = trainer.log(value=x.mean())
    assert reported is not None and trainer.flush_logs() == reported


def test_log_without_a_training_loader_is_not_a_log_point_every_call():
    trainer = devplug.Trainer(device="cpu", progress=False, log_every=5)
    assert [trainer.log(value=1.0) for _ in range(3)] == [None, None, None]


def test_optimizers_are_keyed_by_module_so_creation_order_does_not_matter(tmp_path):
    def build(order):
        trainer = devplug.Trainer(device="cpu", progress=False, seed=0)
        nets = {"generator": trainer.setup(torch.nn.Linear(3, 3), name="generator"),
                "discriminator": trainer.setup(torch.nn.Linear(3, 1), name="discriminator")}
        opts = {key: trainer.optimizer("adam", nets[key].parameters(), lr=1e-2) for key in order}
        return trainer, nets, opts

    trainer, nets, opts = build(["generator", "discriminator"])
    assert sorted(trainer._optimizers) == ["discriminator", "generator"]
    for key, net in nets.items():
        net(torch.ones(2, 3)).sum().backward()
        trainer.step(opts[key])
    path = trainer.save(tmp_path / "gan.pt")
    other, _, other_opts = build(["discriminator", "generator"])
    other.load(path)
    for key in opts:
        saved, loaded = opts[key].state_dict()["state"], other_opts[key].state_dict()["state"]
        assert torch.equal(saved[0]["exp_avg"], loaded[0]["exp_avg"])


def test_a_second_optimizer_over_the_same_module_needs_a_name():
    trainer = devplug.Trainer(device="cpu", progress=False)
    model = trainer.setup(torch.nn.Linear(3, 3))
    trainer.optimizer("adam", model.parameters())
    with pytest.raises(devplug.ConfigError, match="optimizer named 'linear' already exists"):
        trainer.optimizer("sgd", model.parameters(), lr=0.1)
    trainer.optimizer("sgd", model.parameters(), lr=0.1, name="linear_sgd")
    assert sorted(trainer._optimizers) == ["linear", "linear_sgd"]


def test_an_optimizer_class_works_or_fails_with_one_clear_line():
    trainer = devplug.Trainer(device="cpu", progress=False)
    model = trainer.setup(torch.nn.Linear(3, 3))
    opt = trainer.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    assert isinstance(opt, torch.optim.AdamW)
    assert trainer.optimizer_implementation(opt).startswith("torch.optim.AdamW")

    class Custom(torch.optim.SGD):
        pass

    custom = trainer.optimizer(Custom, model.parameters(), lr=0.1, name="custom")
    assert type(custom) is Custom
    with pytest.raises(devplug.OptimizerError, match=r"must be a name such as 'adamw' or a torch\.optim\.Optimizer"):
        trainer.optimizer(42, model.parameters())


def test_saving_warns_about_an_optimizer_over_a_module_that_was_not_set_up(tmp_path):
    trainer = devplug.Trainer(device="cpu", progress=False)
    trainer.setup(torch.nn.Linear(3, 3), name="encoder")
    head = torch.nn.Linear(3, 1)  # used in the loop, never passed to setup()
    trainer.optimizer("sgd", head.parameters(), lr=0.1, name="head")
    with pytest.warns(RuntimeWarning, match="optimizer 'head' holds 2 parameter"):
        trainer.save(tmp_path / "ck.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.setup(head, name="head")
        trainer.save(tmp_path / "ck2.pt")


# ---- HPU (stand-in): the fused clip op, step marking with clipping and accumulation -----------------------
@pytest.fixture
def hpu(monkeypatch):
    from standins import hpu_fixtures

    yield from hpu_fixtures.standin(monkeypatch)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_lazy_gaudi_clips_with_the_fused_op_and_marks_the_step_after_every_backward(hpu, accumulation):
    trainer = devplug.Trainer(device="hpu", precision="32-true", progress=False, plugin_manager=hpu.plugin_manager(),
                              accumulate_grad_batches=accumulation)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-3)
    loader = trainer.dataloader(datasets()[0], BATCH, num_workers=0)
    hpu.reset()
    for _epoch in trainer.epochs(1):
        for x, y in loader:
            with trainer.accumulate(model):
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                norm = trainer.clip_grad_norm(opt, 1.0)
                trainer.step(opt)
            assert (norm is None) is (not trainer.sync_gradients)
    steps = TRAIN // BATCH // accumulation
    assert hpu.count("FusedAdamW.step") == steps
    assert hpu.count("FusedClipNorm.clip_norm") == steps and hpu.count("FusedClipNorm") <= 1
    # after every backward, as Habana's own trainers do (optimum-habana, lightning-habana), and after each step
    assert hpu.count("mark_step") == (accumulation + 1) * steps
    marks = [n for n in hpu.names() if n in ("mark_step", "FusedClipNorm.clip_norm", "FusedAdamW.step")]
    assert marks == (["mark_step"] * accumulation + ["FusedClipNorm.clip_norm", "FusedAdamW.step", "mark_step"]) * steps


def test_a_norm_other_than_l2_falls_back_to_torch_on_gaudi(hpu):
    trainer = devplug.Trainer(device="hpu", precision="32-true", progress=False, plugin_manager=hpu.plugin_manager())
    model = trainer.setup(torch.nn.Linear(6, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    x, y = datasets()[0][:BATCH]
    trainer.backward(torch.nn.functional.mse_loss(model(x), y))
    norm = trainer.clip_grad_norm(opt, 1.0, norm_type=math.inf)
    assert hpu.count("FusedClipNorm.clip_norm") == 0 and torch.isfinite(norm)


@pytest.mark.parametrize("shuffle", [False, True])
def test_epochs_entered_again_after_max_steps_continue_the_epoch_where_it_was(shuffle):
    # training in chunks (max_steps, then more): each sample once per epoch, in the uninterrupted run's order
    def run(limits):
        trainer = devplug.Trainer(device="cpu", progress=False, loggers=[], stop_signals=(), count_flops=False,
                                  seed=3)
        model = trainer.setup(torch.nn.Linear(1, 1))
        opt = trainer.optimizer("sgd", model.parameters(), lr=0.0)
        loader = trainer.dataloader(TensorDataset(torch.arange(12.0).unsqueeze(1)), batch_size=2, shuffle=shuffle,
                                    num_workers=0)
        seen = []
        for limit in limits:
            for epoch in trainer.epochs(2, max_steps=limit):
                for (x,) in loader:
                    seen.append((epoch, x.flatten().tolist()))
                    trainer.backward(model(x).sum())
                    trainer.step(opt)
        return seen, trainer.global_step

    whole, steps = run([None])
    assert steps == 12 and run([2, 5, None]) == (whole, 12)


def test_a_generator_source_left_after_max_steps_goes_on_where_it_was_when_epochs_is_entered_again():
    # leaving the loop must not close the author's generator: the next epochs() reads on from where it stopped
    trainer = devplug.Trainer(device="cpu", progress=False, loggers=[], stop_signals=(), count_flops=False)
    model = trainer.setup(torch.nn.Linear(1, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.0)
    loader = trainer.dataloader(torch.tensor([[float(i)]]) for i in range(12))
    seen = []
    for limit in (3, 6, None):
        for _epoch in trainer.epochs(1, max_steps=limit):
            for x in loader:
                seen.append(int(x.item()))
                trainer.backward(model(x).sum())
                trainer.step(opt)
    assert seen == list(range(12)) and trainer.global_step == 12


@pytest.mark.parametrize("clip", [False, True])
def test_two_optimizers_of_one_backward_under_a_grad_scaler_match_torchs_recipe(tmp_path, clip):
    # torch's recipe: scale(loss).backward(); step(o1); step(o2); update() once. Updating after each step
    # moved the scale between the two, and the second unscaled its gradients by a scale they were not made at
    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    ref = make()
    ref_opts = [torch.optim.SGD(ref[i].parameters(), lr=0.1) for i in (0, 1)]
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)  # the scale moves every update
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = ref(x).float().square().mean()
        ref_scaler.scale(loss).backward()
        for opt in ref_opts:
            if clip:
                ref_scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 0.01)
            ref_scaler.step(opt)
        ref_scaler.update()
        for opt in ref_opts:
            opt.zero_grad(set_to_none=True)

    trainer = devplug.Trainer(device="cpu", precision="16-mixed", progress=False, loggers=[], stop_signals=())
    model = trainer.setup(make())
    opts = [trainer.optimizer("sgd", model[i].parameters(), lr=0.1, name=f"layer{i}") for i in (0, 1)]
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    for _ in range(3):
        with trainer.autocast():
            loss = model(x).float().square().mean()
        trainer.backward(loss)
        for opt in opts:
            if clip:  # each optimizer clipped just before its step: the second after the first stepped
                trainer.clip_grad_norm(opt, 0.01)
            trainer.step(opt)
    for a, b in zip(ref.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    trainer.save(tmp_path / "ckpt.pt")  # the update the next backward would make is saved with the scale
    assert trainer.scaler.get_scale() == ref_scaler.get_scale()
    assert torch.load(tmp_path / "ckpt.pt", weights_only=False)["scaler"]["scale"] == ref_scaler.get_scale()

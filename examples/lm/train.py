#!/usr/bin/env python
"""A byte-level transformer language model on devplug: devices, precision, DDP or FSDP, resume, evaluation, sampling.

    python examples/lm.py                                        # a few minutes on a 2-core laptop CPU
    torchrun --standalone --nproc-per-node 2 examples/lm.py --strategy fsdp

``examples/lm.py`` runs this file (``python examples/lm/train.py`` does the same). The training loop is
the author's own and plain (`train_loop`); the devplug Trainer supplies what depends on the device and the
launch: placement, the optimizer implementation, mixed precision, gradient accumulation and clipping,
DDP or FSDP (one unit per `lm.models.Block`), checkpoints by a `devplug.CheckpointPolicy`, resume,
stop signals. There is no device branch and no vendor import in this folder.

Resuming is exact: the data order is the Trainer's loader's (shuffled from ``--seed`` and the epoch, each
rank its own share; a resumed run skips what the interrupted epoch already drew), the learning rate is a
stateless function of the step (`devplug.LRSchedule`), and the weights, AdamW state, step and RNG states
ride in the checkpoint; an fp32 run on the CPU resumed with ``--auto-resume`` ends bitwise equal to the
uninterrupted one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: import this folder as the package lm, not its modules as top-level ones
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import attrs
import torch
from torch import nn

import devplug
from devplug import toolkit

from lm import cli
from lm.corpus import Corpus, Windows, load_corpus
from lm.memory import check_memory
from lm.models import VOCAB, Block, LanguageModel, count_parameters, generate
from lm.summary import format_summary, perplexity, write_summary

Say = Callable[..., None]
#: Longest sample shown in the summary (the console shows all of it).
SAMPLE_SHOWN = 240


def _silent(*_args: Any, **_kwargs: Any) -> None:
    """What every process but the main one prints: nothing."""


@attrs.define
class EvalHistory:
    """The held-out losses of the run so far, kept in every checkpoint (a resumed run reports its first one)."""

    first: float | None = None
    last: float | None = None

    def state_dict(self) -> dict[str, float | None]:
        """The losses, as the checkpoint keeps them."""
        return {"first": self.first, "last": self.last}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        """Restore the losses."""
        self.first, self.last = state.get("first"), state.get("last")


@attrs.frozen
class Saved:
    """A value kept in every checkpoint's ``extra`` for whoever inspects it (the model sizes); nothing is restored."""

    value: Any

    def state_dict(self) -> Any:
        """The value, as the checkpoint keeps it."""
        return self.value

    def load_state_dict(self, _state: Any) -> None:
        """Nothing to restore: the model flags given again must match the checkpoint's shapes."""


@attrs.define
class Run:
    """A run's parts, made by `build_run`."""

    settings: cli.Settings
    trainer: devplug.Trainer
    corpus: Corpus
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: devplug.LRSchedule
    loader: Any
    eval_loader: Any
    eval_windows: int
    parameters: int
    history: EvalHistory = attrs.field(factory=EvalHistory)
    resumed: devplug.Resumed | None = None
    meter: devplug.ThroughputMeter = attrs.field(factory=devplug.ThroughputMeter)  # tokens/s, evaluation left out
    interrupted: bool = False
    sample: str | None = None
    consolidated: str | None = None

    @property
    def say(self) -> Say:
        """``print`` on the main process, silence on the others."""
        return print if self.trainer.is_main_process else _silent


def train(settings: cli.Settings, corpus: Corpus) -> int:
    """Train as ``settings`` say, evaluate, sample, write the summary; the exit status."""
    trainer = build_trainer(settings)
    try:
        run = build_run(trainer, settings, corpus)
        resume_if_asked(run)
        announce(run)
        if run.trainer.global_step == 0:
            report_eval(run, evaluate(run))
        train_loop(run)
        if not run.interrupted:
            report_eval(run, evaluate(run))
            run.sample = sample(run)
        consolidate(run)
        return finish(run)
    except BaseException:
        with contextlib.suppress(Exception):  # the run's error is the one reported
            trainer.close()  # the folder's run lock, loggers and loader workers let go now, not at the process's end
        raise


def build_trainer(settings: cli.Settings) -> devplug.Trainer:
    """The Trainer: a checkpoint every ``--save-every`` steps and at the end, the newest ``--keep-checkpoints`` kept."""
    trainer = devplug.Trainer(settings.trainer)  # the flags bound to devplug.TrainerConfig (lm.cli)
    if trainer.is_main_process:  # temp files of saves a killed run left behind (never a live writer's)
        toolkit.remove_stale_temp_files(settings.out / "checkpoints")
    return trainer


def build_run(trainer: devplug.Trainer, settings: cli.Settings, corpus: Corpus) -> Run:
    """The network (sharded or replicated as the strategy says), AdamW, the schedule and both loaders."""
    args, spec = settings.args, settings.spec
    stats = trainer.memory_stats()  # before the network is built: too large is one line, not an allocator's error
    check_memory(spec, args.batch_size, shards=data_parallel_size(trainer) if "fsdp" in trainer.strategy else 1,
                 device_total=getattr(stats, "total", None), host_available=toolkit.available_host_memory())
    network = LanguageModel(spec)  # built after the Trainer seeded every rank alike: replicas start equal
    parameters = count_parameters(network)
    model = trainer.setup(network, name="lm", shard=[Block] if "fsdp" in trainer.strategy else None,
                          activation_checkpointing=[Block] if args.recompute else None)
    optimizer = trainer.optimizer("adamw", model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=args.weight_decay)
    schedule = devplug.LRSchedule(total_steps=args.steps, warmup_steps=min(args.warmup, args.steps), decay="cosine",
                                  min_factor=args.min_lr / args.lr)

    world = data_parallel_size(trainer)  # tensor-parallel ranks of one group read the same batches
    windows = Windows.tiling(corpus.train, spec.context)
    if len(windows) < args.batch_size * world:
        raise devplug.DataError(f"the training text has {len(windows)} windows of --context {spec.context}, fewer "
                                f"than one step's {args.batch_size} x {world} processes; raise --corpus-mb or lower "
                                "--batch-size/--context")
    loader = trainer.dataloader(windows, args.batch_size, shuffle=True, drop_last=True, num_workers=args.workers,
                                pin_memory=args.pin_memory)
    # Every rank evaluates the same number of windows (a sharded forward is a collective, so the ranks
    # must run as many batches each): a multiple of the world size, split into equal blocks.
    held_out = Windows.spread(corpus.eval, spec.context, args.eval_batches * args.batch_size)
    count = len(held_out) - len(held_out) % world
    if count == 0:
        raise devplug.DataError(f"the held-out text ({len(corpus.eval):,} bytes) has no window of --context "
                                f"{spec.context} for each of {world} processes; raise --corpus-mb or lower --context")
    held_out = Windows(held_out.text, spec.context, held_out.starts[:count])
    eval_loader = trainer.dataloader(held_out, args.batch_size, train=False, num_workers=args.workers,
                                     pin_memory=args.pin_memory)
    run = Run(settings, trainer, corpus, model, optimizer, schedule, loader, eval_loader, count, parameters)
    trainer.register_for_checkpointing(history=run.history, spec=Saved(spec.as_dict()))
    return run


def data_parallel_size(trainer: devplug.Trainer) -> int:
    """How many groups of ranks read different batches: every rank, but one per tensor-parallel group."""
    if trainer.strategy in ("tp", "fsdp+tp"):
        return trainer.world_size // (trainer.config.tp or trainer.world_size)
    return trainer.world_size


def resume_if_asked(run: Run) -> None:
    """With ``--resume``/``--auto-resume``: continue through the Trainer and say from where."""
    settings, trainer = run.settings, run.trainer
    if settings.resume is None and not settings.auto_resume:
        return
    try:
        run.resumed = trainer.resume(settings.resume)  # None: --auto-resume with no checkpoint yet, a new run
    except devplug.CheckpointMismatchError as exc:
        if isinstance(exc, devplug.CheckpointPositionError):  # its message names the batch and world sizes
            raise
        raise devplug.CheckpointError(f"{exc} (resume with the same --width/--layers/--heads/--context/"
                                      "--tie-weights as the run that wrote it)") from exc
    resumed = run.resumed
    if resumed is not None:
        for path, reason in resumed.skipped:
            if trainer.is_main_process:
                print(f"lm: warning: skipping damaged checkpoint {path.name}: {reason}", file=sys.stderr)
        run.say(f"lm: resumed from {resumed.path} at step {resumed.step}")


def announce(run: Run) -> None:
    """Print what the run uses: device, precision, strategy and sharding plan, optimizer, model, corpus, output."""
    trainer, spec, say = run.trainer, run.settings.spec, run.say
    ranks = f" over {trainer.world_size} processes" if trainer.world_size > 1 else ""
    say(f"lm: device {trainer.device} (plugin {trainer.device.plugin_name}), precision {trainer.precision.name}, "
        f"strategy {trainer.strategy}{ranks}, optimizer {trainer.optimizer_implementation(run.optimizer)}")
    say(f"lm: sharding: {sharding_reason(trainer)}")
    say(f"lm: model {run.parameters:,} parameters (width {spec.width}, {spec.layers} layers, {spec.heads} heads, "
        f"context {spec.context}); loader {run.loader.implementation}")
    say(f"lm: corpus {run.corpus.description}")
    say(f"lm: writing to {toolkit.display_path(run.settings.out)}")


def sharding_reason(trainer: devplug.Trainer) -> str:
    """The device plugin's sharding plan in words, or why nothing is sharded."""
    if trainer.strategy in ("tp", "fsdp+tp"):
        tp = trainer.world_size // data_parallel_size(trainer)
        split = f"tensor parallel: each block's MLP split across {tp} rank(s), the rest replicated"
        return f"{split}; FSDP across the groups: {sharding_plan(trainer)}" if "fsdp" in trainer.strategy else split
    return sharding_plan(trainer)


def sharding_plan(trainer: devplug.Trainer) -> str:
    """The device plugin's FSDP plan in words, or why nothing is sharded."""
    if trainer.sharding is None:
        return f"none (strategy {trainer.strategy}: every process holds all the weights)"
    return trainer.sharding.reason or "the device plugin's plan"


def train_loop(run: Run) -> None:
    """Train to ``--steps`` or a stop signal, evaluating every ``--eval-every`` steps.

    Ctrl-C, SIGTERM or SIGUSR1 end ``trainer.epochs()`` at a step boundary, every rank at the same step,
    and the checkpoint policy saves that step; a second Ctrl-C stops at once.
    """
    trainer, args, model, optimizer = run.trainer, run.settings.args, run.model, run.optimizer
    tokens_per_batch = args.batch_size * args.context * data_parallel_size(trainer)
    meter = run.meter
    try:
        for _epoch in trainer.epochs(sys.maxsize, max_steps=args.steps):
            for batch in run.loader:  # (batch, context + 1) bytes on the device: this rank's share
                run.schedule.apply(optimizer, trainer.global_step)
                with trainer.accumulate(model):
                    with trainer.autocast():
                        loss = next_byte_loss(model, batch)
                    trainer.backward(loss)
                    if args.clip:
                        trainer.clip_grad_norm(optimizer, args.clip)
                    stepped = trainer.step(optimizer)
                values = trainer.log(loss=loss.detach())  # read back from the device at log points only
                meter.add(tokens_per_batch)
                if stepped and not meter.is_steady:  # once: time the steady state after warm-up
                    trainer.synchronize()
                    meter.first_step_done()
                step = trainer.global_step
                if values is not None:
                    rate = values.get("samples_per_sec", 0.0) * args.context
                    run.say(f"step {step}/{args.steps}  loss {values['loss']:.3f}  "
                            f"lr {optimizer.param_groups[0]['lr']:.2e}  {rate:,.0f} tokens/s", flush=True)
                if stepped and args.eval_every and step % args.eval_every == 0 and step < args.steps:
                    trainer.synchronize()
                    with meter.paused(), trainer.throughput.paused():  # evaluation is not training time
                        report_eval(run, evaluate(run))
                        trainer.synchronize()
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once
        run.interrupted = True
        run.say("\nlm: interrupted", file=sys.stderr)
    run.interrupted = run.interrupted or trainer.exit_code != 0
    trainer.synchronize()
    meter.exclude(trainer.checkpoint_seconds)  # writing checkpoints is not training
    meter.stop()


def next_byte_loss(model: nn.Module, batch: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of each byte of ``batch[:, 1:]`` given the bytes before it (nats per byte), in fp32."""
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), batch[:, 1:].reshape(-1),
                                       reduction=reduction)


def evaluate(run: Run) -> float:
    """The mean loss per byte over the held-out windows (every rank its block, summed across the ranks)."""
    trainer, model = run.trainer, run.model
    total = torch.zeros((), dtype=torch.float64, device=trainer.torch_device)
    model.eval()
    with torch.no_grad():
        for batch in run.eval_loader:
            with trainer.autocast():
                total += next_byte_loss(model, batch, reduction="sum").double()
    model.train()
    total = trainer.all_reduce(total, op="sum")  # a collective: every rank, after its pass
    copies = trainer.world_size // data_parallel_size(trainer)  # the ranks of a tensor-parallel group saw one block
    return float(total) / (copies * run.eval_windows * run.settings.spec.context)


def report_eval(run: Run, loss: float) -> None:
    """Remember and print a held-out loss and its perplexity."""
    history = run.history
    history.first = loss if history.first is None else history.first
    history.last = loss
    run.say(f"eval at step {run.trainer.global_step}: held-out loss {loss:.3f}, perplexity {perplexity(loss):.2f}",
            flush=True)


def sample(run: Run) -> str | None:
    """The model's continuation of ``--prompt``, printed (every rank runs the model: a sharded one needs it)."""
    args, trainer = run.settings.args, run.trainer
    if not args.sample_bytes:
        return None
    prompt_bytes = args.prompt.encode("utf-8", "surrogateescape") or b"\n"
    prompt = trainer.to_device(torch.tensor(list(prompt_bytes), dtype=torch.long))
    generator = torch.Generator().manual_seed(args.seed)
    run.model.eval()
    tokens = generate(run.model, prompt, args.sample_bytes, context=args.context, temperature=args.temperature,
                      generator=generator)
    run.model.train()
    text = bytes(tokens.cpu().tolist()).decode("utf-8", "replace")
    text = "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in text)  # no terminal control bytes
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}"
    run.say(f"lm: sample ({how}):\n{text}\n", flush=True)
    return text


def consolidate(run: Run) -> None:
    """``--consolidate FILE``: the final weights as one plain ``state_dict`` file (the main process writes it)."""
    target, trainer = run.settings.args.consolidate, run.trainer
    if target is None or not trainer.is_main_process:
        return
    target = target.expanduser()
    if trainer.sharding is not None:
        newest = trainer.summary()["last_checkpoint"] or (str(run.resumed.path) if run.resumed else None)
        if newest is None:
            raise devplug.CheckpointError("--consolidate: this run wrote no checkpoint to take the weights from")
        toolkit.consolidate_checkpoint(newest, target, module="lm")
    else:
        plain = getattr(run.model, "module", run.model)  # DDP keeps the module it wraps as .module
        weights = {name: value.detach().cpu() for name, value in plain.state_dict().items()}
        toolkit.write_atomically(target, lambda handle: torch.save(weights, handle))  # a killed writer's temp swept
    run.consolidated = str(target)
    run.say(f"lm: final weights in one file: {target}")


def efficiency(values: Any, tokens_per_sec: float, context: int, world: int) -> dict[str, Any]:
    """FLOPs per token (counted by the Trainer on one step), the device's peak and its source, and MFU.

    MFU here is the steady-state tokens/s of one process times the FLOPs per token, over the peak of the
    precision in use that the device plugin reports; empty where the device has no known peak.
    """
    per_sample, peak = values.get("flops_per_sample"), values.get("peak_flops")
    if not per_sample:
        return {}
    out: dict[str, Any] = {"flops_per_token": per_sample / context}
    if peak:
        out.update(peak_flops=peak, peak_source=values.get("peak_source"),
                   mfu=out["flops_per_token"] * tokens_per_sec / world / peak)
    return out


def summarize(run: Run) -> dict[str, Any]:
    """Everything the summary shows, as plain values (also written to ``summary.json``)."""
    trainer, meter = run.trainer, run.meter
    values = trainer.summary()
    last_checkpoint = values["last_checkpoint"]
    if run.resumed is not None and last_checkpoint == str(run.resumed.path):
        last_checkpoint = None  # this run wrote none
    shown = None
    if run.sample is not None:
        shown = run.sample if len(run.sample) <= SAMPLE_SHOWN else run.sample[:SAMPLE_SHOWN] + "..."  # plain text
    return {
        "status": "interrupted" if run.interrupted else "finished",
        "device": values["device"],
        "device_plugin": values["device_plugin"],
        "world_size": values["world_size"],
        "precision": values["precision"],
        "precision_detail": values["precision_detail"],
        "compiled": values["compiled"].get("lm"),
        "strategy": trainer.strategy,
        "sharding": sharding_reason(trainer),
        "optimizer": trainer.optimizer_implementation(run.optimizer),
        "parameters": run.parameters,
        "model_sizes": run.settings.spec.as_dict(),
        "recompute": run.settings.args.recompute,
        "corpus": run.corpus.description,
        "steps": values["steps"],
        "tokens_this_run": meter.total,
        "wall_seconds": round(meter.wall_seconds, 3),
        "tokens_per_sec": meter.per_second,
        **efficiency(values, meter.per_second, run.settings.spec.context, trainer.world_size),
        "first_eval_loss": run.history.first,
        "final_eval_loss": run.history.last,
        "final_eval_perplexity": perplexity(run.history.last),
        "sample": shown,
        "last_checkpoint": last_checkpoint,
        "consolidated": run.consolidated,
        "out_dir": str(run.settings.out),
    }


def finish(run: Run) -> int:
    """Close the trainer, write and print the summary; the exit status (`main` leaves the process group)."""
    trainer = run.trainer
    summary = summarize(run)
    trainer.close()
    if trainer.is_main_process:
        write_summary(summary, run.settings.out / "summary.json")
        print(format_summary(summary), flush=True)
    return trainer.exit_code or (130 if run.interrupted else 0)


def prepare_output_dir(out: Path, *, given: bool = True) -> None:
    """Create ``out`` and check a file can be written there, so a bad ``--out`` is one line now.

    ``given``: ``--out`` named it; otherwise it is the folder of the run ``--resume`` continues.
    """
    try:
        (out / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = out / f".lm-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if not given:
            raise devplug.ConfigError(f"the resumed run's folder {str(out)!r}, where it writes without --out, cannot "
                                      f"be written: {exc.strerror or exc}; pass --out to write the resumed run to a "
                                      "writable folder") from None
        raise devplug.ConfigError(f"--out {str(out)!r} cannot be written: {exc.strerror or exc}; pass a writable "
                                  "folder") from None


def check_consolidate_target(target: Path | None) -> None:
    """``--consolidate FILE``: its folder must take a file now, not only after training (one line if not)."""
    if target is None:
        return
    target = target.expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe = target.parent / f".{target.name}.lm-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise devplug.ConfigError(f"--consolidate {str(target)!r} cannot be written: {exc.strerror or exc}; name a "
                                  "file in a writable folder") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Bad input (a flag, the device, a checkpoint, the output folder) prints one ``lm: error:`` line on
    stderr and returns 2; Ctrl-C prints the summary so far and returns 130.
    """
    return cli.build_parser().run(start, argv)


def start(args: argparse.Namespace) -> int:
    """Resolve the flags, read the corpus, check the output folder, train; the exit status."""
    settings = cli.resolve(args)
    corpus = load_corpus(int(args.corpus_mb * 2**20))
    prepare_output_dir(settings.out, given=args.out is not None)
    check_consolidate_target(args.consolidate)
    return train(settings, corpus)


if __name__ == "__main__":
    devplug.ConfigParser.run_as_script(main)

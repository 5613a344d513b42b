#!/usr/bin/env python
"""DCGAN on devplug with every option: devices, precision, the image cache, resume, input checks, the summary.

    python examples/dcgan.py                          # embedded data, tiny-32 model, best device here
    python examples/dcgan.py --device hpu --model safe-64 --data ~/images
    torchrun --nproc-per-node 4 examples/dcgan.py --device cuda --data ~/images

``examples/dcgan.py`` runs this file (``python examples/dcgan/train.py`` does the same). The training
iteration is the model author's own (`dcgan.step.DCGANStep`: a GAN needs two optimizers and
manual control); the devplug Trainer supplies everything device-specific: where tensors live, the fastest
optimizer implementation, mixed precision, the data loader, step marking, process groups. There is no
device branch and no vendor import in this folder. ``--help`` lists every flag; see ``docs/dcgan.md``,
and ``minimal.py`` beside this file for the same loop without the options.

`train` runs a training in named steps: `build_trainer`, `build_run` (networks, data,
loader, sample noise), `resume_if_asked`, `announce`, `train_loop`,
`save_last_outputs` and `finish` (the summary).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: import this folder as the package dcgan, not its modules as top-level ones
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import attrs
import torch

import devplug
from devplug.toolkit import available_host_memory, display_path, remove_stale_temp_files

from dcgan import checks, cli, resume
from dcgan.data import TrainingData, load_training_data
from dcgan.notices import library_warnings_printed
from dcgan.step import DCGANStep, to_unit_range
from dcgan.summary import build_summary, format_summary, write_summary

SAMPLE_COUNT = 64  # images in the fixed-noise sample grid (8×8)

Say = Callable[..., None]


def _silent(*_args: Any, **_kwargs: Any) -> None:
    """What every process but the main one prints: nothing."""


@attrs.define
class Run:
    """A run's parts, made by `build_run`: the trainer, the step, the data and the fixed sample noise."""

    settings: cli.Settings
    trainer: devplug.Trainer
    train_step: DCGANStep
    data: TrainingData
    loader: Any
    fixed_noise: torch.Tensor  # the sample grid's noise: on the CPU until the run starts, then on the device
    resumed: devplug.Resumed | None = None  # what resume_if_asked resumed from (None: a new run)

    @property
    def say(self) -> Say:
        """``print`` on the main process, silence on the others."""
        return print if self.trainer.is_main_process else _silent


@attrs.define
class Progress:
    """What `train_loop` leaves for the end of the run: its timing, its last outputs, how it ended."""

    meter: devplug.ThroughputMeter  # images/s after the first step
    completed: int  # the last step whose updates all finished: a safe point to checkpoint
    last_sample: str | None = None
    interrupted: bool = False


@attrs.frozen
class Saved:
    """A value kept in every checkpoint's ``extra`` for whoever inspects it (the model preset, its sizes).

    Nothing is restored from it: the model flags given again must match the checkpoint's shapes.
    """

    value: Any

    def state_dict(self) -> Any:
        """The value, as the checkpoint keeps it."""
        return self.value

    def load_state_dict(self, _state: Any) -> None:
        """Nothing to restore."""


def train(settings: cli.Settings) -> int:
    """Train as ``settings`` say; print the summary at the end or on Ctrl-C. Returns the exit status."""
    trainer = build_trainer(settings)
    try:
        with library_warnings_printed(trainer.is_main_process):  # e.g. a checkpoint not saved: non-finite weights
            run = build_run(trainer, settings)
            resume_if_asked(run)
            run.fixed_noise = trainer.to_device(run.fixed_noise)  # after the resume, which may bring the noise back
            announce(run)
            progress = train_loop(run)
            save_last_outputs(run, progress)
            return finish(run, progress)
    except BaseException:
        close_after_error(trainer)
        raise


def close_after_error(trainer: devplug.Trainer) -> None:
    """Close the trainer of a run that stopped with an error (bad data, a non-finite loss): its folder's run lock,
    loggers and loader workers are let go now, not when the process ends; the run's error is the one reported."""
    with contextlib.suppress(Exception):
        trainer.close()


def build_trainer(settings: cli.Settings) -> devplug.Trainer:
    """The devplug Trainer for the flags; the main process also tidies the temporary files of killed saves.

    Its checkpoint policy writes ``--out``/checkpoints/step_NNNNNNN.pt every ``--save-every`` steps (between
    steps, after the step's sample grid: the saved generator is the one the next step starts from) and when
    the loop ends, and keeps the newest ``--keep-checkpoints``.
    """
    trainer = devplug.Trainer(settings.trainer)  # the flags bound to devplug.TrainerConfig (dcgan.cli)
    if trainer.is_main_process:  # temp files of saves a killed run left behind (never a live writer's)
        remove_stale_temp_files(settings.out / "checkpoints")
    return trainer


def build_run(trainer: devplug.Trainer, settings: cli.Settings) -> Run:
    """Check the memory, then build the networks and optimizers, the data and its loader, the fixed noise."""
    args, spec = settings.args, settings.spec
    stats = trainer.memory_stats()
    checks.check_memory(spec, args.batch_size, device_total=getattr(stats, "total", None),
                        host_available=available_host_memory())  # before the networks are built

    # Models: built on the CPU with DCGAN init, then placed (and converted/compiled/DDP-wrapped) by the plugin.
    train_step = DCGANStep(trainer, spec, lr=args.lr, beta1=args.beta1)

    data = load_training_data(settings, trainer)
    if data.cache is not None and trainer.is_main_process:
        print(data.cache.describe())
    if data.images < args.batch_size * trainer.world_size:
        raise devplug.ConfigError(
            f"the data has {data.images} images, fewer than one batch ({args.batch_size} x {trainer.world_size} "
            "processes); lower --batch-size or add images"
        )
    loader = trainer.dataloader(
        data.source,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,  # constant shapes: no recompilation for a short last batch (compile, HPU graphs)
        num_workers=args.workers,
        pin_memory=args.pin_memory,
        persistent_workers=args.persistent_workers,
        prefetch_factor=args.prefetch_factor,
    )

    # Fixed noise for the sample grid: a private generator, so it never disturbs the training RNG.
    fixed_noise = torch.randn(SAMPLE_COUNT, spec.nz, 1, 1, generator=torch.Generator().manual_seed(args.seed))
    # Saved in every checkpoint; a resume restores the noise in place (on the CPU, before it moves).
    trainer.register_for_checkpointing(model=Saved(settings.model), spec=Saved(spec.as_dict()),
                                       fixed_noise=fixed_noise)
    return Run(settings, trainer, train_step, data, loader, fixed_noise)


def resume_if_asked(run: Run) -> None:
    """With ``--resume``/``--auto-resume``: resume through the Trainer, apply ``--lr``/``--beta1``, say what moved."""
    settings, trainer, say = run.settings, run.trainer, run.say
    if settings.resume is None and not settings.auto_resume:
        return
    warn = (lambda text: print(text, file=sys.stderr)) if trainer.is_main_process else _silent
    run.resumed = resume.resume(trainer, settings.resume, say=say, warn=warn)  # None: --auto-resume, a new run
    if run.resumed is None:
        return
    resume.apply_overrides([run.train_step.opt_g, run.train_step.opt_d], settings.args.explicit,
                           {"lr": settings.args.lr, "beta1": settings.args.beta1}, say)
    resume.report_set_aside(run.resumed, say)


def announce(run: Run) -> None:
    """Print what the run uses: device, plugin, precision, optimizer, model, data, loader, output folder."""
    trainer, train_step, say = run.trainer, run.train_step, run.say
    say(f"dcgan: device {trainer.device} (plugin {trainer.device.plugin_name}), precision {trainer.precision.name}, "
        f"optimizer {train_step.implementation()}")
    layout = "channels_last" if trainer.device.channels_last else "default"
    why = f" ({trainer.device.layout_reason})" if trainer.device.layout_reason else ""
    say(f"dcgan: model {run.settings.model} (G {train_step.params_g:,} / D {train_step.params_d:,} parameters, "
        f"{layout} layout{why}), data {run.data.description}, loader {run.loader.implementation}")
    say(f"dcgan: writing to {display_path(run.settings.out)}")


def train_loop(run: Run) -> Progress:
    """Train to ``--steps``/``--epochs`` or a stop signal, sampling, saving and logging on schedule.

    Ctrl-C, SIGTERM or SIGUSR1 end ``trainer.epochs()`` at a step boundary (every rank at the same step);
    a second Ctrl-C stops at once. Either way the run goes on to its last outputs and summary.
    """
    settings, trainer, train_step = run.settings, run.trainer, run.train_step
    args = settings.args
    progress = Progress(meter=devplug.ThroughputMeter(), completed=trainer.global_step)
    meter = progress.meter
    try:
        for _epoch in trainer.epochs(settings.epochs or sys.maxsize, max_steps=settings.steps):
            for real, _labels in run.loader:
                real = to_unit_range(real)
                scalars = train_step(real)
                # Values stay on the device; the Trainer reads them back every --log-every steps only.
                values = trainer.log(**scalars)  # the Trainer adds lr/<optimizer> and samples/s itself
                step = trainer.global_step
                if values is not None:
                    report_log_point(trainer, values, settings, step)
                if step % args.sample_every == 0:
                    progress.last_sample = save_samples(run)
                # --save-every: the Trainer's checkpoint policy saves when the loader is asked for the next batch
                meter.add(real.shape[0] * trainer.world_size)
                if not meter.is_steady:  # once: time the steady state after warm-up
                    trainer.synchronize()
                    meter.first_step_done()
                progress.completed = step
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once
        progress.interrupted = True
        run.say("\ndcgan: interrupted", file=sys.stderr)
    except RuntimeError:
        if trainer.stop_signal is None:
            raise
        # The same Ctrl-C also stopped a loader worker while the next batch was being fetched.
    progress.interrupted = progress.interrupted or trainer.exit_code != 0
    trainer.synchronize()
    meter.exclude(trainer.checkpoint_seconds)  # writing checkpoints is not training
    meter.stop()
    return progress


def report_log_point(trainer: devplug.Trainer, values: dict[str, float], settings: cli.Settings, step: int) -> None:
    """At a log point: a console line when there is no progress bar (the loggers have every value)."""
    rate = values.get("samples_per_sec", 0.0)
    if settings.args.no_progress and trainer.is_main_process:
        total = f"/{settings.steps}" if settings.steps else ""
        print(f"step {step}{total}  loss_D {values['loss_D']:.3f}  loss_G {values['loss_G']:.3f}  "
              f"D(x) {values['D_x']:.3f}  D(G(z)) {values['D_G_z']:.3f}  {rate:,.0f} images/s", flush=True)


def save_samples(run: Run) -> str:
    """Fixed-noise grid to samples/step_N.png and TensorBoard (every process runs G: DDP needs it)."""
    trainer = run.trainer
    with torch.no_grad(), trainer.autocast():
        fakes = run.train_step.net_g(run.fixed_noise)
    path = str(run.settings.out / "samples" / f"step_{trainer.global_step:07d}.png")
    trainer.log_images("samples", fakes, nrow=8, path=path)
    return path


def save_last_outputs(run: Run, progress: Progress) -> None:
    """At a step boundary, the checkpoint and sample grid of the last step, unless the schedule just wrote them."""
    trainer, args = run.trainer, run.settings.args
    at_safe_point = trainer.global_step == progress.completed
    if at_safe_point and progress.meter.total:
        # Save before sampling: G samples in train mode, which moves its batch-norm running statistics,
        # and a checkpoint taken after that would resume to other weights than an uninterrupted run.
        # The policy saved when epochs() ended; after a second Ctrl-C (or a loader stopped by the same
        # signal) it did not, and this saves the step now (nothing when it is already saved).
        trainer.checkpoint_now()
        if trainer.global_step % args.sample_every != 0:
            progress.last_sample = save_samples(run)


def summarize(run: Run, progress: Progress) -> dict[str, Any]:
    """The run summary's values (see `dcgan.summary.build_summary`)."""
    settings, trainer, train_step = run.settings, run.trainer, run.train_step
    values = trainer.summary()
    last_checkpoint = values["last_checkpoint"]
    if run.resumed is not None and last_checkpoint == str(run.resumed.path):
        last_checkpoint = None  # this run wrote none
    return build_summary(
        values,
        model=settings.model,
        spec=settings.spec.as_dict(),
        params_g=train_step.params_g,
        params_d=train_step.params_d,
        optimizer_g=trainer.optimizer_implementation(train_step.opt_g),
        optimizer_d=trainer.optimizer_implementation(train_step.opt_d),
        data=run.data.description,
        meter=progress.meter,
        price_per_hour=settings.args.price_per_hour,
        cache=run.data.cache,
        decodes_every_epoch=settings.data_is_folder and run.data.cache is None,
        interrupted=progress.interrupted,
        out_dir=str(settings.out),
        last_sample=progress.last_sample,
        last_checkpoint=last_checkpoint,
    )


def finish(run: Run, progress: Progress) -> int:
    """Close the trainer and the data, write and print the summary; the exit status (main leaves the process
    group)."""
    trainer = run.trainer
    summary = summarize(run, progress)
    trainer.close()
    run.data.close()  # release the cache version, so a later rebuild may remove it
    if trainer.is_main_process:
        write_summary(summary, run.settings.out / "summary.json")
        print(format_summary(summary), flush=True)
    return trainer.exit_code or (130 if progress.interrupted else 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Bad input (data, device, image size, checkpoint) prints one ``dcgan: error:`` line on stderr and
    returns 2; Ctrl-C prints the summary so far and returns 130.
    """
    return cli.build_parser().run(start, argv)


def start(args: argparse.Namespace) -> int:
    """Resolve the flags; build the image cache (``--cache-only``) or train. The exit status."""
    settings = cli.resolve(args)
    if args.cache_only:
        cache = load_training_data(settings, None).cache
        print(cache.describe() if cache is not None else "dcgan: nothing to cache")
        return 0
    created = checks.prepare_output_dir(settings.out)  # a bad --out fails now, not at the first log point
    try:
        return train(settings)
    except (devplug.DevplugError, KeyboardInterrupt):  # bad input, or Ctrl-C before the first step
        checks.remove_empty(created)  # the run stopped before writing anything: leave no empty folders
        raise


if __name__ == "__main__":
    devplug.ConfigParser.run_as_script(main)

#!/usr/bin/env python
"""DCGAN on devplug: one script for every device.

    python examples/dcgan.py                          # embedded data, tiny-32 model, best device here
    python examples/dcgan.py --device hpu --model safe-64 --data ~/images
    torchrun --nproc-per-node 4 examples/dcgan.py --device cuda --data ~/images

The training loop below is the model author's own (a GAN needs two optimizers and manual control);
the devplug Trainer supplies everything device-specific: where tensors live, the fastest optimizer
implementation, mixed precision, the data loader, step marking, process groups. There is no device
branch and no vendor import in this file or in ``dcgan_lib``. ``--help`` lists every flag; see
``docs/dcgan.md``.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from dcgan_lib import checks, cli, resume
from dcgan_lib.data import CachedImages, CacheReport, prepare_cache
from dcgan_lib.default_data import FakeImages, ShapesDataset
from dcgan_lib.models import ModelSpec, build_models, count_parameters
from dcgan_lib.summary import Stopwatch, build_summary, format_summary, write_summary
from torch import nn

import devplug
from devplug.toolkit import display_path, list_images, printable, remove_stale_temp_files

SAMPLE_COUNT = 64  # images in the fixed-noise sample grid (8×8)


def to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """Images scaled to [-1, 1] on the device: uint8 batches (cache, embedded, fake) are scaled here,
    float batches (a plugin's own image loader) already are."""
    if images.dtype == torch.uint8:
        return images.float().div_(127.5).sub_(1.0)
    return images.float()


class DCGANStep:
    """One DCGAN iteration on a Trainer: D on real and fake images, then G (BCE-with-logits, Adam).

    Builds both networks with DCGAN init on the CPU and hands them to the Trainer, which places them
    (and converts, compiles or DDP-wraps them as the plugin and flags say); both optimizers come from
    the plugin's optimizer factory. ``step(real)`` takes a batch already on the device, in [-1, 1].
    """

    def __init__(self, trainer: devplug.Trainer, spec: ModelSpec, *, lr: float = 2e-4, beta1: float = 0.5) -> None:
        self.trainer, self.spec = trainer, spec
        generator, discriminator = build_models(spec)
        self.params_g, self.params_d = count_parameters(generator), count_parameters(discriminator)
        self.net_g = trainer.setup(generator, name="generator")
        self.net_d = trainer.setup(discriminator, name="discriminator")
        self.opt_g = trainer.optimizer("adam", self.net_g.parameters(), lr=lr, betas=(beta1, 0.999))
        self.opt_d = trainer.optimizer("adam", self.net_d.parameters(), lr=lr, betas=(beta1, 0.999))
        self.criterion = nn.BCEWithLogitsLoss()  # D returns logits: autocast-safe, unlike BCELoss after a sigmoid

    def __call__(self, real: torch.Tensor) -> dict[str, torch.Tensor]:
        """One iteration; returns the values to log, left on the device (read back at log points only)."""
        trainer, device, criterion = self.trainer, self.trainer.torch_device, self.criterion
        net_g, net_d, batch = self.net_g, self.net_d, real.shape[0]
        # Each process takes its own slice of one noise draw: distinct noise per process, while every
        # process's RNG stays in step (so one checkpoint's RNG state fits all of them).
        noise = torch.randn(trainer.world_size * batch, self.spec.nz, 1, 1, device=device)
        noise = noise[trainer.rank * batch:(trainer.rank + 1) * batch]
        ones, zeros = torch.ones(batch, device=device), torch.zeros(batch, device=device)

        # (1) Discriminator: real → 1, fake → 0.
        with trainer.autocast():
            fake = net_g(noise)
            logits_real = net_d(real)
            logits_fake = net_d(fake.detach())
            loss_d = criterion(logits_real, ones) + criterion(logits_fake, zeros)
        self.opt_d.zero_grad(set_to_none=True)  # drop the gradients the previous G step's backward left in D
        trainer.backward(loss_d)
        trainer.step(self.opt_d)

        # (2) Generator: make D call the fakes real.
        with trainer.autocast():
            loss_g = criterion(net_d(fake), ones)
        trainer.backward(loss_g)
        trainer.step(self.opt_g)
        return {
            "loss_D": loss_d,
            "loss_G": loss_g,
            "D_x": torch.sigmoid(logits_real.detach()).mean(),
            "D_G_z": torch.sigmoid(logits_fake.detach()).mean(),
        }

    def implementation(self) -> str:
        """The optimizer implementation the device plugin chose (the same for G and D)."""
        return self.trainer.optimizer_implementation(self.opt_g)


def make_data(settings: cli.Settings, trainer: devplug.Trainer | None) -> tuple[Any, str, int, CacheReport | None]:
    """The data source for the loader, a description, its image count and the cache report (folders only).

    Under ``torchrun`` the main process builds a missing cache while the others wait, then all map it.
    """
    size = settings.spec.image_size
    if settings.data == cli.EMBEDDED:
        dataset = ShapesDataset(size)
        return dataset, f"embedded shapes ({len(dataset)} generated {size}x{size} images)", len(dataset), None
    if settings.data == cli.FAKE:
        dataset = FakeImages(size, seed=settings.args.seed)
        return dataset, f"fake (random {size}x{size} images, compute only)", len(dataset), None
    root = Path(settings.data).expanduser()
    if settings.args.no_cache:
        count = len(list_images(root))  # clear errors for a missing or empty folder
        source = devplug.ImageFolderSource(str(root), image_size=size)
        return source, f"{display_path(root)} ({count} images, decoded every epoch)", count, None
    main = trainer is None or trainer.is_main_process
    if not main:
        _barrier()  # wait for the main process to build the cache
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, unit="image", desc="decoding into the cache", mininterval=2.0)
        bar.update(done - bar.n)

    show = main and not settings.args.no_progress
    try:
        # The build decodes on every core (--workers, when given, caps it); the cache is then reused.
        dataset, report = prepare_cache(root, size, settings.cache_dir, workers=settings.args.workers, build=main,
                                        progress=progress if show else None, on_wait=_waiting)
    finally:
        if bar is not None:
            bar.close()
    if main and trainer is not None:
        _barrier()
    return dataset, f"{display_path(root)} ({report.images} images, cached at {size}x{size})", report.images, report


def _waiting(path: Path) -> None:
    print(f"image cache: another process is building {display_path(path)}; waiting for it", flush=True)


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def save_checkpoint(trainer: devplug.Trainer, settings: cli.Settings, extra: dict[str, Any]) -> str | None:
    """Write ``checkpoints/step_NNNNNNN.pt`` (main process) and prune to the newest ``--keep-checkpoints``."""
    folder = settings.out / "checkpoints"
    target = folder / f"step_{trainer.global_step:07d}.pt"
    try:
        path = trainer.save(target, **extra)
    except devplug.NonFiniteLossError as exc:
        if settings.args.nonfinite == "raise":
            raise
        print(f"dcgan: warning: not saving {target.name}: {exc}", file=sys.stderr)
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        previous = next(iter(cli.checkpoints_newest_first(folder)), None)
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint was touched"
        raise devplug.CheckpointError(f"the disk is full: could not write {target} ({exc.strerror}); {kept}; "
                                      "free some space or give --out on another disk") from exc
    keep = settings.args.keep_checkpoints
    if path is not None and keep > 0:
        found = sorted((int(m[1]), p) for p in folder.iterdir() if (m := cli.CHECKPOINT_RE.match(p.name)))
        for _step, old in found[:-keep]:
            old.unlink(missing_ok=True)
    return path


def train(settings: cli.Settings) -> int:
    """Train as ``settings`` say; print the summary at the end or on Ctrl-C. Returns the exit status."""
    args = settings.args
    trainer = devplug.Trainer(
        device=args.device,
        precision=args.precision,
        log_dir=str(settings.out / "tensorboard"),
        log_every=args.log_every,
        seed=args.seed,
        compile=args.compile,
        channels_last=args.channels_last,
        progress=not args.no_progress,
        nonfinite=args.nonfinite,
        profile=args.profile,
        price_per_hour=args.price_per_hour,
    )
    say = print if trainer.is_main_process else (lambda *a, **k: None)
    if trainer.is_main_process:  # temp files of saves a killed run left behind (never a live writer's)
        remove_stale_temp_files(settings.out / "checkpoints")
    warn = (lambda text: print(text, file=sys.stderr)) if trainer.is_main_process else say
    spec = settings.spec
    stats = trainer.memory_stats()
    checks.check_memory(spec, args.batch_size, device_total=getattr(stats, "total", None),
                        host_available=checks.available_host_memory())  # before the networks are built

    # Models: built on the CPU with DCGAN init, then placed (and converted/compiled/DDP-wrapped) by the plugin.
    train_step = DCGANStep(trainer, spec, lr=args.lr, beta1=args.beta1)
    net_g, opt_g, opt_d = train_step.net_g, train_step.opt_g, train_step.opt_d

    source, data_description, images, cache = make_data(settings, trainer)
    if cache is not None:
        say(cache.describe())
    if images < args.batch_size * trainer.world_size:
        raise devplug.ConfigError(
            f"the data has {images} images, fewer than one batch ({args.batch_size} x {trainer.world_size} "
            "processes); lower --batch-size or add images"
        )
    loader = trainer.dataloader(
        source,
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
    extra: dict[str, Any] = {"model": settings.model, "spec": spec.as_dict(), "fixed_noise": fixed_noise}
    if settings.resume_candidates:
        try:
            resumed, saved = resume.load_first_good(trainer, settings.resume_candidates,
                                                    fall_back=args.auto_resume, warn=warn)
        except devplug.CheckpointError as exc:
            if resume.damaged(exc):
                raise
            raise devplug.CheckpointError(
                f"{exc} (resume with the same --model/--nz/--ngf/--ndf/--image-size as the run that wrote it)"
            ) from exc
        if isinstance(saved.get("fixed_noise"), torch.Tensor):
            fixed_noise = saved["fixed_noise"]
            extra["fixed_noise"] = fixed_noise
        say(f"resumed from {resumed} at step {trainer.global_step} (epoch {trainer.epoch})")
        resume.apply_overrides(trainer, args.explicit, {"lr": args.lr, "beta1": args.beta1}, say)
        if trainer.is_main_process:
            resume.set_aside_newer(resumed, say)
    fixed_noise = trainer.to_device(fixed_noise)

    say(f"dcgan: device {trainer.device} (plugin {trainer.device.plugin_name}), precision {trainer.precision.name}, "
        f"optimizer {train_step.implementation()}")
    say(f"dcgan: model {settings.model} (G {train_step.params_g:,} / D {train_step.params_d:,} parameters), "
        f"data {data_description}, loader {loader.implementation}")
    say(f"dcgan: writing to {display_path(settings.out)}")

    def sample() -> str:
        """Fixed-noise grid to samples/step_N.png and TensorBoard (every process runs G: DDP needs it)."""
        with torch.no_grad(), trainer.autocast():
            fakes = net_g(fixed_noise)
        path = str(settings.out / "samples" / f"step_{trainer.global_step:07d}.png")
        trainer.log_images("samples", fakes, nrow=8, path=path)
        return path

    stopwatch = Stopwatch()
    last_sample: str | None = None
    last_checkpoint: str | None = None
    completed = trainer.global_step  # the last step whose updates all finished: a safe point to checkpoint
    interrupted = False
    try:
        for _epoch in trainer.epochs(settings.epochs or sys.maxsize, max_steps=settings.steps):
            for real, _labels in loader:
                real = to_unit_range(real)
                scalars = train_step(real)
                # Values stay on the device; the Trainer reads them back every --log-every steps only.
                values = trainer.log(**scalars)  # the Trainer adds lr/<optimizer> and samples/s itself
                step = trainer.global_step
                if values is not None:
                    report_log_point(trainer, values, settings, step)
                if step % args.sample_every == 0:
                    last_sample = sample()
                if step % args.save_every == 0:
                    last_checkpoint = save_checkpoint(trainer, settings, extra) or last_checkpoint
                stopwatch.add(real.shape[0] * trainer.world_size)
                if stopwatch.steady_start is None:  # once: time the steady state after warm-up
                    trainer.synchronize()
                    stopwatch.first_step_done()
                completed = step
        # Ctrl-C, SIGTERM or SIGUSR1 end trainer.epochs() at a step boundary (every rank at the same step):
        # the run then samples, saves and summarizes below, and exits with trainer.exit_code.
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once
        interrupted = True
        say("\ndcgan: interrupted", file=sys.stderr)
    except RuntimeError:
        if trainer.stop_signal is None:
            raise
        # The same Ctrl-C also stopped a loader worker while the next batch was being fetched.
    interrupted = interrupted or trainer.exit_code != 0
    trainer.synchronize()
    stopwatch.stop()
    at_safe_point = trainer.global_step == completed
    if at_safe_point and stopwatch.images_total:
        # Save before sampling: G samples in train mode, which moves its batch-norm running statistics,
        # and a checkpoint taken after that would resume to other weights than an uninterrupted run.
        if trainer.global_step % args.save_every != 0:
            last_checkpoint = save_checkpoint(trainer, settings, extra) or last_checkpoint
        if trainer.global_step % args.sample_every != 0:
            last_sample = sample()
    summary = build_summary(
        trainer.summary(),
        model=settings.model,
        spec=spec.as_dict(),
        params_g=train_step.params_g,
        params_d=train_step.params_d,
        optimizer_g=trainer.optimizer_implementation(opt_g),
        optimizer_d=trainer.optimizer_implementation(opt_d),
        data=data_description,
        stopwatch=stopwatch,
        price_per_hour=args.price_per_hour,
        cache=cache,
        decodes_every_epoch=settings.data_is_folder and cache is None,
        interrupted=interrupted,
        out_dir=str(settings.out),
        last_sample=last_sample,
        last_checkpoint=last_checkpoint,
    )
    trainer.close()
    if isinstance(source, CachedImages):
        source.close()  # release the cache version, so a later rebuild may remove it
    if trainer.is_main_process:
        write_summary(summary, settings.out / "summary.json")
        print(format_summary(summary), flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return trainer.exit_code or (130 if interrupted else 0)


def report_log_point(trainer: devplug.Trainer, values: dict[str, float], settings: cli.Settings, step: int) -> None:
    """At a log point: a console line when there is no progress bar (the loggers have every value)."""
    rate = values.get("samples_per_sec", 0.0)
    if settings.args.no_progress and trainer.is_main_process:
        total = f"/{settings.steps}" if settings.steps else ""
        print(f"step {step}{total}  loss_D {values['loss_D']:.3f}  loss_G {values['loss_G']:.3f}  "
              f"D(x) {values['D_x']:.3f}  D(G(z)) {values['D_G_z']:.3f}  {rate:,.0f} images/s", flush=True)


def one_line(error: BaseException) -> str:
    """An error message on one line (some wrapped library messages span several)."""
    text = printable(" ".join(str(error).split()))  # a file name that is not UTF-8 prints as \xNN
    return text if len(text) <= 600 else text[:597] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Bad input (data, device, image size, checkpoint) prints one ``dcgan: error:`` line on stderr and
    returns 2; Ctrl-C prints the summary so far and returns 130.
    """
    args = cli.parse(argv)
    created: list[Path] = []
    try:
        settings = cli.resolve(args)
        if args.cache_only:
            _dataset, _description, _count, report = make_data(settings, None)
            print(report.describe() if report is not None else "dcgan: nothing to cache")
            return 0
        created = checks.prepare_output_dir(settings.out)  # a bad --out fails now, not at the first log point
        return train(settings)
    except devplug.DevplugError as exc:
        checks.remove_empty(created)  # the run stopped before writing anything: leave no empty folders
        print(f"dcgan: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dcgan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    for stream in (sys.stdout, sys.stderr):  # file names that are not valid UTF-8 print as \xNN, never crash
        stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    sys.exit(main())

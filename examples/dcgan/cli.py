"""The command line of the DCGAN example: every flag, its default, and how flags become run settings.

The Trainer's options and the checkpoint policy are devplug's configs bound to flags
(`devplug.ConfigParser`); this module adds the model's, the data's and the optimizer's flags, and the
``--config FILE`` every devplug parser reads takes them all.
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from devplug import CheckpointPolicy, ConfigError, ConfigParser, DataError, Flag, TrainerConfig
from devplug.toolkit import precision_names

from .cache import default_cache_dir
from .models import PRESETS, ModelSpec

#: ``--data`` values that are not folders.
EMBEDDED, FAKE = "shapes", "fake"
#: ``--model auto``: this preset for the embedded data (fast on a laptop CPU), the other for real data.
AUTO_MODEL_EMBEDDED, AUTO_MODEL_OTHER = "tiny-32", "naive-64"
DEFAULT_EPOCHS = 5

DESCRIPTION = """\
Train a DCGAN (pytorch/examples' architecture) with devplug: the same script on every device.

  python examples/dcgan.py                         # embedded shapes data, tiny-32, best device here
  python examples/dcgan.py --device hpu --model safe-64 --data ~/images --batch-size 256
  torchrun --nproc-per-node 4 examples/dcgan.py --device cuda --data ~/images

Everything device-specific (placement, optimizer implementation, mixed precision, data loader,
step marking, process groups) comes from the devplug device plugin; nothing in this script names
a device.
"""

EPILOG = """\
model presets (G and D: trainable parameters of the generator and the discriminator; naive-64 has
pytorch/examples' DCGAN sizes, tiny-32 learns the embedded data in minutes on a laptop CPU):
  tiny-32   nz 64,  ngf 32,  ndf 32,  32x32     G 296,896     D 167,808
  naive-64  nz 100, ngf 64,  ndf 64,  64x64     G 3,576,704   D 2,765,568
  safe-64   nz 256, ngf 256, ndf 64,  64x64     G 52,448,768  D 2,765,568
  safe-128  nz 256, ngf 256, ndf 128, 128x128   G 195,063,296 D 44,611,072

outputs under --out: tensorboard/ (train/loss_D, train/loss_G, train/D_x, train/D_G_z, lr/<optimizer>,
perf/samples_per_sec = images/s, samples),
samples/step_NNNNNNN.png, checkpoints/step_NNNNNNN.pt, summary.json.
Exit status: 0 done, 2 bad input (one line on stderr), 130 interrupted, 143 SIGTERM, 138 SIGUSR1 (the
summary still printed; a checkpoint is written at the step reached).
"""


integer, number = ConfigParser.integer, ConfigParser.number


def _workers(text: str) -> int:
    limit = max(64, 4 * (os.cpu_count() or 1))
    return integer(0, limit, f"an integer from 0 to {limit} (4 per CPU core here, at least 64)")(text)


def build_parser() -> ConfigParser:
    """The argument parser; ``--help`` documents every flag (a flag is spelled out: ``allow_abbrev`` is off, so
    the ones given on a resume command line are known)."""
    parser = ConfigParser("dcgan.py", description=DESCRIPTION, epilog=EPILOG)
    parser.bind(TrainerConfig, [
        Flag("device", help="device to train on: auto, cpu, cuda, hpu, NAME:INDEX, or any plugin's device "
                            "(default: $DEVPLUG_DEVICE, else auto = the best available; see `devplug devices`)"),
        Flag("precision", help=f"auto (the device plugin's best), {', '.join(precision_names())}, or a name the "
                               "device plugin knows, e.g. hmp on Gaudi (default: auto)"),
        Flag("compile", help="torch.compile both networks with the device plugin's backend (default: off)"),
        Flag("channels_last", boolean=True, default=None, convert=lambda on: "auto" if on is None else on,
             help="channels-last memory layout for both networks and the batches (default: the device plugin's "
                  "preference, e.g. on for the CPU, where convolutions run in it)"),
    ], group=parser.add_argument_group("device"))

    model = parser.add_argument_group("model")
    model.add_argument("--model", default="auto", choices=["auto", *PRESETS],
                       help=f"size preset (table below); auto = {AUTO_MODEL_EMBEDDED} for the embedded data, "
                            f"{AUTO_MODEL_OTHER} otherwise (default: auto)")
    model.add_argument("--nz", type=integer(1), help="latent vector size (overrides the preset)")
    model.add_argument("--ngf", type=integer(1), help="generator width (overrides the preset)")
    model.add_argument("--ndf", type=integer(1), help="discriminator width (overrides the preset)")
    model.add_argument("--image-size", type=integer(1),
                       help="square image size, a power of two from 16 to 1024 (overrides the preset; each "
                            "doubling adds one block to each network)")

    data = parser.add_argument_group("data")
    data.add_argument("--data", default=EMBEDDED, metavar="PATH|fake|shapes",
                      help="a folder of images (flat or one sub-folder per class); 'fake' for random images "
                           "(compute only, no data cost); 'shapes' for the embedded, generated data set of "
                           "colored shapes on gradients (default: shapes; write ./fake for a folder named fake)")
    data.add_argument("--cache-dir", type=ConfigParser.path, default=None,
                      help="where the decoded image cache of --data PATH lives "
                           f"(default: $XDG_CACHE_HOME/devplug/dcgan, here {default_cache_dir()})")
    data.add_argument("--no-cache", action="store_true",
                      help="decode the image files every epoch instead of caching them; hands the folder to the "
                           "device plugin's image loader (DALI on CUDA, HabanaDataLoader on Gaudi, where installed)")
    data.add_argument("--cache-only", action="store_true",
                      help="build the image cache for --data PATH and exit (prepare data before a long or "
                           "multi-process run)")
    data.add_argument("--workers", type=_workers, default=None,
                      help="data loader worker processes (default: the device plugin decides by timing a batch of "
                           "the data: none for the cache or the embedded data on a CPU, where they would compete "
                           "with training; workers for decoding); also caps the processes that build the cache "
                           "(default: every CPU core)")
    data.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                      help="pin host batches for faster copies (default: what the device plugin prefers)")
    data.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction, default=True,
                      help="keep loader workers alive between epochs (default: on)")
    data.add_argument("--prefetch-factor", type=integer(1), default=None,
                      help="batches each worker loads ahead (default: the device plugin's, 2 for torch's loader)")

    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=integer(1), default=None,
                       help="stop at this global step (counted across --resume)")
    train.add_argument("--epochs", type=integer(1), default=None,
                       help=f"stop after this many epochs (counted across --resume; default: {DEFAULT_EPOCHS} "
                            "when --steps is not given, else unlimited)")
    train.add_argument("--batch-size", type=integer(1), default=128,
                       help="images per step on each process (default: 128, as in the DCGAN paper)")
    train.add_argument("--lr", type=number(0, strict=True), default=2e-4, help="Adam learning rate (default: 2e-4)")
    train.add_argument("--beta1", type=number(), default=0.5, help="Adam beta1 (default: 0.5)")
    parser.bind(TrainerConfig, [
        Flag("nonfinite", help="a NaN/inf loss at a log point: stop with an error, warn, or ignore; a checkpoint "
                               "with non-finite weights is never written either way (default: raise)"),
        Flag("seed", default=0, help="seed for weights, noise, shuffling and the fixed sample noise (default: 0)"),
    ], group=train)

    out = parser.add_argument_group("outputs")
    parser.add_run_arguments(out, runs="runs/dcgan")
    out.add_argument("--sample-every", type=integer(1), default=250,
                     help="steps between fixed-noise sample grids (PNG + TensorBoard; default: 250)")
    parser.bind_checkpoints(out, save_every=1000)
    parser.bind(TrainerConfig, [
        Flag("log_every", help="steps between log points: the only steps that read values back from the device "
                               "(default: 50)"),
        Flag("price_per_hour", metavar="DOLLARS", type=number(0, strict=True),
             help="what the machine costs per hour; adds images per dollar (images/hour / price) to the summary"),
        Flag("profile", metavar="'steps A-B'", help="profile steps A to B, data wait included; trace in "
                                                    "OUT/tensorboard/profiler (TensorBoard, Perfetto)"),
    ], group=out)
    out.add_argument("--no-progress", action="store_true",
                     help="no progress bar; each log point prints one line instead")
    return parser


@attrs.frozen
class Settings:
    """The parsed flags plus what they resolve to."""

    args: argparse.Namespace
    model: str
    spec: ModelSpec
    data: str  # "shapes", "fake", or a folder path
    epochs: int | None
    steps: int | None
    out: Path
    resume: Path | None  # --resume: a checkpoint file, or a folder of them (a run folder's checkpoints/)
    cache_dir: Path
    trainer: TrainerConfig  # the Trainer's options: the flags bound to devplug.TrainerConfig
    auto_resume: bool = False  # --auto-resume: the newest intact checkpoint of --out, if any

    @property
    def data_is_folder(self) -> bool:
        """True when ``--data`` names a folder of images."""
        return self.data not in (EMBEDDED, FAKE)


def resolve(args: argparse.Namespace, *, now: datetime.datetime | None = None) -> Settings:
    """Turn parsed flags into `Settings`; invalid combinations raise `devplug.ConfigError`."""
    data = args.data
    if not data.strip():
        raise ConfigError("--data is empty; pass a folder of images, 'shapes' or 'fake' (write . for this folder)")
    model = args.model
    if model == "auto":
        model = AUTO_MODEL_EMBEDDED if data == EMBEDDED else AUTO_MODEL_OTHER
    preset = PRESETS[model]
    spec = ModelSpec(
        nz=args.nz or preset.nz,
        ngf=args.ngf or preset.ngf,
        ndf=args.ndf or preset.ndf,
        image_size=args.image_size or preset.image_size,
    ).check()
    if spec != preset:
        model = "custom"
    if not 0.0 <= args.beta1 < 1.0:
        raise ConfigError(f"--beta1 must be in [0, 1), got {args.beta1}")
    if args.cache_only and data in (EMBEDDED, FAKE):
        raise ConfigError("--cache-only needs --data PATH (a folder of images)")
    if args.cache_only and args.no_cache:
        raise ConfigError("--cache-only and --no-cache contradict each other")
    if data not in (EMBEDDED, FAKE):  # fail fast, before any device or model work
        folder = Path(data).expanduser()
        if not folder.exists():
            raise DataError(f"data folder {str(folder)!r} does not exist; pass a folder of images")
        if not folder.is_dir():
            raise DataError(f"data path {str(folder)!r} is not a folder; pass a folder of images")
    epochs = args.epochs
    if epochs is None and args.steps is None:
        epochs = DEFAULT_EPOCHS
    parser = build_parser()  # the same bindings as the parser that parsed args
    run = parser.run_folder(args, now=now)
    if data not in (EMBEDDED, FAKE) and run.out.resolve().is_relative_to(Path(data).expanduser().resolve()):
        raise ConfigError(f"--out {str(run.out)!r} is inside --data {data!r}: the sample images the run writes there "
                          "would become training images of the next run; pass an --out outside the data folder")
    policy = parser.build(CheckpointPolicy, args, directory=run.out / "checkpoints", at_end=True)
    config = parser.build(TrainerConfig, args, log_dir=str(run.out / "tensorboard"), progress=not args.no_progress,
                          checkpoints=policy)
    cache_dir = args.cache_dir.expanduser() if args.cache_dir is not None else default_cache_dir()
    return Settings(args=args, model=model, spec=spec, data=data, epochs=epochs, steps=args.steps, out=run.out,
                    resume=run.resume, cache_dir=cache_dir, trainer=config, auto_resume=run.auto_resume)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (``None``: ``sys.argv[1:]``); argparse exits with status 2 on a bad flag.

    ``args.explicit`` holds the destinations of the flags given on the command line or in ``--config`` (they
    override what a resumed checkpoint says).
    """
    return build_parser().parse(argv)

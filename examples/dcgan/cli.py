"""The command line of the DCGAN example: every flag, its default, and how flags become run settings."""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import attrs

from devplug import CheckpointError, ConfigError, DataError
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
Exit status: 0 done, 2 bad input (one line on stderr), 130 interrupted (summary still printed).
"""


#: Largest ``--seed``: torch seeds are 64-bit, and the loaders add the epoch to the seed.
MAX_SEED = 2**63 - 1


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one ``dcgan: error:`` line (status 2), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line and exit with status 2."""
        self.exit(2, f"dcgan: error: {' '.join(message.split())} (see --help)\n")


def _integer(text: str, low: int, high: int | None, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def _positive_int(text: str) -> int:
    return _integer(text, 1, None, "a positive integer")


def _non_negative_int(text: str) -> int:
    return _integer(text, 0, None, "an integer >= 0")


def _seed(text: str) -> int:
    return _integer(text, 0, MAX_SEED, f"an integer from 0 to {MAX_SEED}")


def _workers(text: str) -> int:
    limit = max(64, 4 * (os.cpu_count() or 1))
    return _integer(text, 0, limit, f"an integer from 0 to {limit} (4 per CPU core here, at least 64)")


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--help`` documents every flag."""
    parser = Parser(
        prog="dcgan.py", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # a flag is spelled out, so the ones given on a resume command line are known
    )
    device = parser.add_argument_group("device")
    device.add_argument("--device", default=None,
                        help="device to train on: auto, cpu, cuda, hpu, NAME:INDEX, or any plugin's device "
                             "(default: $DEVPLUG_DEVICE, else auto = the best available; see `devplug devices`)")
    device.add_argument("--precision", default="auto",
                        help=f"auto (the device plugin's best), {', '.join(precision_names())}, or a name the "
                             "device plugin knows, e.g. hmp on Gaudi (default: auto)")
    device.add_argument("--compile", action="store_true",
                        help="torch.compile both networks with the device plugin's backend")
    device.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                        help="channels-last memory layout for both networks and the batches (default: the "
                             "device plugin's preference, e.g. on for the CPU, where convolutions run in it)")

    model = parser.add_argument_group("model")
    model.add_argument("--model", default="auto", choices=["auto", *PRESETS],
                       help=f"size preset (table below); auto = {AUTO_MODEL_EMBEDDED} for the embedded data, "
                            f"{AUTO_MODEL_OTHER} otherwise (default: auto)")
    model.add_argument("--nz", type=_positive_int, help="latent vector size (overrides the preset)")
    model.add_argument("--ngf", type=_positive_int, help="generator width (overrides the preset)")
    model.add_argument("--ndf", type=_positive_int, help="discriminator width (overrides the preset)")
    model.add_argument("--image-size", type=_positive_int,
                       help="square image size, a power of two from 16 to 1024 (overrides the preset; each "
                            "doubling adds one block to each network)")

    data = parser.add_argument_group("data")
    data.add_argument("--data", default=EMBEDDED, metavar="PATH|fake|shapes",
                      help="a folder of images (flat or one sub-folder per class); 'fake' for random images "
                           "(compute only, no data cost); 'shapes' for the embedded, generated data set of "
                           "colored shapes on gradients (default: shapes; write ./fake for a folder named fake)")
    data.add_argument("--cache-dir", type=Path, default=None,
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
    data.add_argument("--prefetch-factor", type=_positive_int, default=None,
                      help="batches each worker loads ahead (default: the device plugin's, 2 for torch's loader)")

    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=_positive_int, default=None,
                       help="stop at this global step (counted across --resume)")
    train.add_argument("--epochs", type=_positive_int, default=None,
                       help=f"stop after this many epochs (counted across --resume; default: {DEFAULT_EPOCHS} "
                            "when --steps is not given, else unlimited)")
    train.add_argument("--batch-size", type=_positive_int, default=128,
                       help="images per step on each process (default: 128, as in the DCGAN paper)")
    train.add_argument("--lr", type=_positive_float, default=2e-4, help="Adam learning rate (default: 2e-4)")
    train.add_argument("--beta1", type=_finite_float, default=0.5, help="Adam beta1 (default: 0.5)")
    train.add_argument("--nonfinite", choices=["raise", "warn", "ignore"], default="raise",
                       help="a NaN/inf loss at a log point: stop with an error (default), warn, or ignore; "
                            "a checkpoint with non-finite weights is never written either way")
    train.add_argument("--seed", type=_seed, default=0,
                       help=f"seed for weights, noise, shuffling and the fixed sample noise, 0 to {MAX_SEED} "
                            "(default: 0)")
    train.add_argument("--resume", type=Path, default=None, metavar="PATH",
                       help="continue from a checkpoint file, or from the newest checkpoint of a run folder, at "
                            "its saved step (give the same model flags as the run that wrote it)")
    train.add_argument("--auto-resume", action="store_true",
                       help="resume from the newest checkpoint in --out if there is one, else start fresh: "
                            "what a job restarted by torchrun --max-restarts or a scheduler wants")

    out = parser.add_argument_group("outputs")
    out.add_argument("--out", type=Path, default=None,
                     help="run folder (default: runs/dcgan/<timestamp>; with --resume, the resumed run's folder)")
    out.add_argument("--log-every", type=_positive_int, default=50,
                     help="steps between log points: the only steps that read values back from the device "
                          "(default: 50)")
    out.add_argument("--sample-every", type=_positive_int, default=250,
                     help="steps between fixed-noise sample grids (PNG + TensorBoard; default: 250)")
    out.add_argument("--save-every", type=_positive_int, default=1000,
                     help="steps between checkpoints; one is also written at the end (default: 1000)")
    out.add_argument("--keep-checkpoints", type=_non_negative_int, default=3,
                     help="newest checkpoints to keep, 0 keeps all (default: 3)")
    out.add_argument("--price-per-hour", type=_positive_float, default=None, metavar="DOLLARS",
                     help="what the machine costs per hour; adds images per dollar (images/hour / price) to the "
                          "summary")
    out.add_argument("--profile", default=None, metavar="'steps A-B'",
                     help="profile steps A to B, data wait included; trace in OUT/tensorboard/profiler (TensorBoard, "
                          "Perfetto)")
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
    resume = resume_source(args.resume.expanduser()) if args.resume is not None else None
    if args.auto_resume:
        if args.resume is not None:
            raise ConfigError("--auto-resume and --resume contradict each other; give one")
        if args.out is None:
            raise ConfigError("--auto-resume needs --out, the run folder to look for checkpoints in")
    out = args.out
    if out is None:
        if resume is not None:
            folder = resume if resume.is_dir() else resume.parent
            out = folder.parent if folder.name == "checkpoints" else folder
        else:
            stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
            out = Path("runs") / "dcgan" / stamp
    cache_dir = args.cache_dir.expanduser() if args.cache_dir is not None else default_cache_dir()
    return Settings(args=args, model=model, spec=spec, data=data, epochs=epochs, steps=args.steps, out=out,
                    resume=resume, cache_dir=cache_dir, auto_resume=args.auto_resume)


def resume_source(path: Path) -> Path:
    """What ``--resume PATH`` resumes from: a checkpoint file, or a folder of them (a run folder's
    ``checkpoints/``), whose newest intact one the Trainer loads. A missing path fails now, before any work."""
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir() and (path / "checkpoints").is_dir():
        return path / "checkpoints"
    return path


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (``None``: ``sys.argv[1:]``); argparse exits with status 2 on a bad flag.

    ``args.explicit`` holds the destinations of the flags given on the command line (they override what a
    resumed checkpoint says).
    """
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(tokens)
    by_flag = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    args.explicit = {by_flag[t.split("=", 1)[0]] for t in tokens if t.split("=", 1)[0] in by_flag}
    return args

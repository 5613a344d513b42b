"""The command line of the language-model example: every flag, its default, and how flags become run settings."""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import attrs

from devplug import CheckpointError, ConfigError
from devplug.toolkit import precision_names

from .models import ModelSpec

DESCRIPTION = """\
Train a small decoder-only transformer language model on the bytes of Python's standard library, with devplug.

  python examples/lm.py                                         # a few minutes on a 2-core laptop CPU
  python examples/lm.py --device cuda --width 512 --layers 8 --context 256 --steps 5000
  torchrun --standalone --nproc-per-node 2 examples/lm.py --strategy fsdp   # weights sharded across 2 ranks

The text is every machine's own (the standard library's *.py files, held-out files for evaluation), so
nothing is downloaded. Everything device-specific (placement, optimizer implementation, mixed precision,
process groups, the sharding plan) comes from the devplug device plugin; nothing here names a device.
"""

EPILOG = """\
outputs under --out: checkpoints/step_NNNNNNN.pt (a folder of shards with --strategy fsdp),
tensorboard/ (train/loss, eval/loss, eval/perplexity, lr/lm), summary.json.
Exit status: 0 done, 2 bad input (one line on stderr), 130 interrupted, 143 SIGTERM, 138 SIGUSR1 (a
checkpoint is written at the step reached; --auto-resume continues from it).
"""

#: Largest ``--seed``: torch seeds are 64-bit, and the loaders add the epoch to the seed.
MAX_SEED = 2**63 - 1
STRATEGIES = ("auto", "ddp", "fsdp")


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one ``lm: error:`` line (status 2), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line and exit with status 2."""
        self.exit(2, f"lm: error: {' '.join(message.split())} (see --help)\n")


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


def _number(text: str, *, low: float, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < low or (strict and value == low):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {low:g}, got {text}")
    return value


def _positive_float(text: str) -> float:
    return _number(text, low=0.0, strict=True)


def _non_negative_float(text: str) -> float:
    return _number(text, low=0.0, strict=False)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--help`` documents every flag."""
    parser = Parser(prog="lm.py", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    device = parser.add_argument_group("device")
    device.add_argument("--device", default=None,
                        help="device to train on: auto, cpu, cuda, hpu, NAME:INDEX, or any plugin's device "
                             "(default: $DEVPLUG_DEVICE, else auto = the best available; see `devplug devices`)")
    device.add_argument("--precision", default="auto",
                        help=f"auto (the device plugin's best), {', '.join(precision_names())}, or a name the "
                             "device plugin knows (default: auto)")
    device.add_argument("--strategy", default="auto", choices=STRATEGIES,
                        help="auto: DDP when launched with more than one process, else one plain process; ddp; "
                             "fsdp: shard weights, gradients and optimizer state across the ranks, one unit per "
                             "transformer block, as the device plugin's sharding plan says (default: auto)")
    device.add_argument("--recompute", action="store_true",
                        help="activation checkpointing of every transformer block: keep only each block's input "
                             "and recompute the rest in backward (less memory, about a third more compute)")

    model = parser.add_argument_group("model")
    model.add_argument("--width", type=_positive_int, default=128, help="embedding width (default: 128)")
    model.add_argument("--layers", type=_positive_int, default=4, help="transformer blocks (default: 4)")
    model.add_argument("--heads", type=_positive_int, default=4,
                       help="attention heads; must divide --width (default: 4)")
    model.add_argument("--context", type=_positive_int, default=64,
                       help="bytes the model sees at once (default: 64)")
    model.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=True,
                       help="share the byte embedding with the output head (default: on)")

    data = parser.add_argument_group("data")
    data.add_argument("--workers", type=_non_negative_int, default=None,
                      help="data loader worker processes (default: the device plugin decides by timing a batch: "
                           "none on a CPU for this in-memory text, where they would compete with training)")
    data.add_argument("--corpus-mb", type=_positive_float, default=4.0,
                      help="megabytes (MiB) of standard library source to read, about a tenth of it held out for "
                           "evaluation (default: 4)")

    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=_positive_int, default=300,
                       help="optimizer steps to train to (counted across resumes; the learning-rate schedule ends "
                            "here; default: 300)")
    train.add_argument("--batch-size", type=_positive_int, default=32,
                       help="sequences per micro-batch on each process (default: 32)")
    train.add_argument("--accumulate", type=_positive_int, default=1,
                       help="micro-batches per optimizer step (gradient accumulation; default: 1)")
    train.add_argument("--lr", type=_positive_float, default=3e-3, help="peak AdamW learning rate (default: 3e-3)")
    train.add_argument("--min-lr", type=_non_negative_float, default=3e-4,
                       help="learning rate at the end of the cosine decay (default: 3e-4)")
    train.add_argument("--warmup", type=_non_negative_int, default=30,
                       help="steps of linear learning-rate warmup before the cosine decay (default: 30)")
    train.add_argument("--weight-decay", type=_non_negative_float, default=0.1,
                       help="AdamW weight decay (default: 0.1)")
    train.add_argument("--clip", type=_non_negative_float, default=1.0,
                       help="clip the gradient norm to this; 0: no clipping (default: 1.0)")
    train.add_argument("--seed", type=_seed, default=0,
                       help=f"seed for the weights and the data order, 0 to {MAX_SEED} (default: 0)")
    train.add_argument("--resume", type=Path, default=None, metavar="PATH",
                       help="continue from a checkpoint, or from the newest checkpoint of a run folder, at its "
                            "saved step (give the same model flags as the run that wrote it)")
    train.add_argument("--auto-resume", action="store_true",
                       help="resume from the newest checkpoint in --out if there is one, else start fresh: what a "
                            "job restarted by torchrun --max-restarts or a scheduler wants")

    evaluation = parser.add_argument_group("evaluation and sampling")
    evaluation.add_argument("--eval-every", type=_non_negative_int, default=100,
                            help="steps between evaluations on the held-out text (also before the first step and "
                                 "at the end); 0: at the end only (default: 100)")
    evaluation.add_argument("--eval-batches", type=_positive_int, default=8,
                            help="held-out windows per evaluation, in batches of --batch-size, split across the "
                                 "ranks (default: 8)")
    evaluation.add_argument("--prompt", default="def ",
                            help="text the model continues at the end (default: 'def ')")
    evaluation.add_argument("--sample-bytes", type=_non_negative_int, default=160,
                            help="bytes to generate after --prompt at the end; 0: none (default: 160)")
    evaluation.add_argument("--temperature", type=_non_negative_float, default=0.8,
                            help="sampling temperature (seeded by --seed); 0: greedy, the most likely byte each "
                                 "time (default: 0.8)")

    out = parser.add_argument_group("outputs")
    out.add_argument("--out", type=Path, default=None,
                     help="run folder (default: runs/lm/<timestamp>; with --resume, the resumed run's folder)")
    out.add_argument("--log-every", type=_positive_int, default=50,
                     help="steps between printed training losses: the only steps that read values back from the "
                          "device (default: 50)")
    out.add_argument("--save-every", type=_positive_int, default=200,
                     help="steps between checkpoints; one is also written at the end (default: 200)")
    out.add_argument("--keep-checkpoints", type=_non_negative_int, default=3,
                     help="newest checkpoints to keep, 0 keeps all (default: 3)")
    out.add_argument("--consolidate", type=Path, default=None, metavar="FILE",
                     help="at the end, write the final weights as one plain state_dict file that torch.load reads "
                          "(from the sharded checkpoint with --strategy fsdp)")
    return parser


@attrs.frozen
class Settings:
    """The parsed flags plus what they resolve to."""

    args: argparse.Namespace
    spec: ModelSpec
    out: Path
    resume: Path | None  # --resume: a checkpoint, or a folder of them (a run folder's checkpoints/)
    auto_resume: bool = False


def resolve(args: argparse.Namespace, *, now: datetime.datetime | None = None) -> Settings:
    """Turn parsed flags into `Settings`; invalid combinations raise `devplug.ConfigError`."""
    spec = ModelSpec(width=args.width, layers=args.layers, heads=args.heads, context=args.context,
                     tie_weights=args.tie_weights).check()
    if args.min_lr > args.lr:
        raise ConfigError(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}; the decay ends at --min-lr")
    if args.auto_resume:
        if args.resume is not None:
            raise ConfigError("--auto-resume and --resume contradict each other; give one")
        if args.out is None:
            raise ConfigError("--auto-resume needs --out, the run folder to look for checkpoints in")
    if args.consolidate is not None and args.consolidate.is_dir():
        raise ConfigError(f"--consolidate {str(args.consolidate)!r} is a folder; name the file to write")
    resume = resume_source(args.resume.expanduser()) if args.resume is not None else None
    out = args.out
    if out is None:
        if resume is not None:
            folder = resume if resume.is_dir() else resume.parent
            out = folder.parent if folder.name == "checkpoints" else folder
        else:
            out = Path("runs") / "lm" / (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Settings(args=args, spec=spec, out=out.expanduser(), resume=resume, auto_resume=args.auto_resume)


def resume_source(path: Path) -> Path:
    """What ``--resume PATH`` resumes from: a checkpoint (file, or folder of shards), or a run folder's newest."""
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir() and (path / "checkpoints").is_dir():
        return path / "checkpoints"
    return path


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (``None``: ``sys.argv[1:]``); a bad flag is one ``lm: error:`` line and exit status 2."""
    return build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))

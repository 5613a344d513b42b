"""The command line of the language-model example: every flag, its default, and how flags become run settings.

The Trainer's options and the checkpoint policy are devplug's own configs bound to flags
(`devplug.ConfigParser`): they parse, check and document themselves; this module adds the model's,
the data's and the evaluation's flags.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from devplug import CheckpointPolicy, ConfigError, ConfigParser, Flag, TrainerConfig
from devplug.toolkit import precision_names

from .models import ModelSpec

DESCRIPTION = """\
Train a small decoder-only transformer language model on the bytes of Python's standard library, with devplug.

  python examples/lm.py                                         # a few minutes on a 2-core laptop CPU
  python examples/lm.py --device cuda --width 512 --layers 8 --context 256 --steps 5000
  torchrun --standalone --nproc-per-node 2 examples/lm.py --strategy fsdp   # weights sharded across 2 ranks
  python examples/lm.py --config run.toml                       # flags from a file: steps = 1000

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

integer, number = ConfigParser.integer, ConfigParser.number


def build_parser() -> ConfigParser:
    """The argument parser; ``--help`` documents every flag."""
    parser = ConfigParser("lm.py", description=DESCRIPTION, epilog=EPILOG)
    device = parser.add_argument_group("device")
    parser.bind(TrainerConfig, [
        Flag("device", help="device to train on: auto, cpu, cuda, hpu, NAME:INDEX, or any plugin's device "
                            "(default: $DEVPLUG_DEVICE, else auto = the best available; see `devplug devices`)"),
        Flag("precision", help=f"auto (the device plugin's best), {', '.join(precision_names())} (fp8-mixed: fp8 "
                               "matrix multiplies where the device has them), or a name the device plugin knows "
                               "(default: auto)"),
        Flag("compile", help="torch.compile each transformer block (the whole model when not sharded) with the "
                             "backend the device plugin names; the summary says which (default: off)"),
        Flag("strategy", choices=("auto", "ddp", "fsdp", "tp", "fsdp+tp"),
             help="auto: DDP when launched with more than one process, else one plain process; ddp; fsdp: shard "
                  "weights, gradients and optimizer state across the ranks, one unit per transformer block, as the "
                  "device plugin's sharding plan says; tp: split each block's MLP across the ranks (tensor "
                  "parallel); fsdp+tp: tensor parallel in groups of --tp ranks, FSDP across the groups "
                  "(default: auto)"),
        Flag("tp", help="ranks that split each layer under --strategy tp or fsdp+tp (default: all of them)"),
    ], group=device)
    device.add_argument("--device-option", dest="device_options", action="append", type=device_option,
                        default=None, metavar="KEY=VALUE",
                        help="an option for the device plugin, repeatable; VALUE is read as JSON where it parses "
                             "(true, 3, \"x\", [\"head\"]), else as a string: fp8_recipe=rowwise, "
                             "fp8_all_gather=false on cuda, fp8=emulate on cpu (each plugin's docs list its options)")
    device.add_argument("--recompute", action="store_true",
                        help="activation checkpointing of every transformer block: keep only each block's input "
                             "and recompute the rest in backward (less memory, about a third more compute)")

    model = parser.add_argument_group("model")
    model.add_argument("--width", type=integer(1), default=128, help="embedding width (default: 128)")
    model.add_argument("--layers", type=integer(1), default=4, help="transformer blocks (default: 4)")
    model.add_argument("--heads", type=integer(1), default=4, help="attention heads; must divide --width (default: 4)")
    model.add_argument("--context", type=integer(1), default=64, help="bytes the model sees at once (default: 64)")
    model.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=True,
                       help="share the byte embedding with the output head (default: on)")

    data = parser.add_argument_group("data")
    data.add_argument("--workers", type=integer(0), default=None,
                      help="data loader worker processes (default: the device plugin decides by timing a batch: "
                           "none on a CPU for this in-memory text, where they would compete with training)")
    data.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                      help="pin host batches for faster copies (default: what the device plugin prefers)")
    data.add_argument("--corpus-mb", type=number(0, strict=True), default=4.0,
                      help="megabytes (MiB) of standard library source to read, about a tenth of it held out for "
                           "evaluation (default: 4)")

    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=integer(1), default=300,
                       help="optimizer steps to train to (counted across resumes; the learning-rate schedule ends "
                            "here; default: 300)")
    train.add_argument("--batch-size", type=integer(1), default=32,
                       help="sequences per micro-batch on each process (default: 32)")
    parser.bind(TrainerConfig, [
        Flag("accumulate_grad_batches", "--accumulate", help="micro-batches per optimizer step (gradient "
                                                             "accumulation)"),
        Flag("seed", default=0, help="seed for the weights and the data order (default: 0)"),
    ], group=train)
    train.add_argument("--lr", type=number(0, strict=True), default=3e-3,
                       help="peak AdamW learning rate (default: 3e-3)")
    train.add_argument("--min-lr", type=number(0), default=3e-4,
                       help="learning rate at the end of the cosine decay (default: 3e-4)")
    train.add_argument("--warmup", type=integer(0), default=30,
                       help="steps of linear learning-rate warmup before the cosine decay (default: 30)")
    train.add_argument("--weight-decay", type=number(0), default=0.1, help="AdamW weight decay (default: 0.1)")
    train.add_argument("--clip", type=number(0), default=1.0,
                       help="clip the gradient norm to this; 0: no clipping (default: 1.0)")

    evaluation = parser.add_argument_group("evaluation and sampling")
    evaluation.add_argument("--eval-every", type=integer(0), default=100,
                            help="steps between evaluations on the held-out text (also before the first step and "
                                 "at the end); 0: at the end only (default: 100)")
    evaluation.add_argument("--eval-batches", type=integer(1), default=8,
                            help="held-out windows per evaluation, in batches of --batch-size, split across the "
                                 "ranks (default: 8)")
    evaluation.add_argument("--prompt", default="def ", help="text the model continues at the end (default: 'def ')")
    evaluation.add_argument("--sample-bytes", type=integer(0), default=160,
                            help="bytes to generate after --prompt at the end; 0: none (default: 160)")
    evaluation.add_argument("--temperature", type=number(0), default=0.8,
                            help="sampling temperature (seeded by --seed); 0: greedy, the most likely byte each "
                                 "time (default: 0.8)")

    out = parser.add_argument_group("outputs")
    parser.add_run_arguments(out, runs="runs/lm")
    parser.bind(TrainerConfig, [
        Flag("log_every", help="steps between printed training losses: the only steps that read values back from "
                               "the device (default: 50)"),
    ], group=out)
    parser.bind_checkpoints(out, save_every=200)
    out.add_argument("--consolidate", type=ConfigParser.path, default=None, metavar="FILE",
                     help="at the end, write the final weights as one plain state_dict file that torch.load reads "
                          "(from the sharded checkpoint with --strategy fsdp)")
    return parser


def device_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as ``(KEY, VALUE)``: VALUE parsed as JSON where it parses, else the string itself."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. fp8_recipe=rowwise), got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def device_options(pairs: Iterable[tuple[str, Any]] | tuple[str, Any] | None) -> dict[str, Any]:
    """The ``--device-option`` pairs as the Trainer's ``device_options`` (a later KEY wins); a config file's single
    ``device-option = "KEY=VALUE"`` arrives as one pair."""
    if pairs is None:
        return {}
    if isinstance(pairs, tuple) and len(pairs) == 2 and isinstance(pairs[0], str):
        return {pairs[0]: pairs[1]}
    return dict(pairs)  # type: ignore[arg-type]


@attrs.frozen
class Settings:
    """The parsed flags plus what they resolve to: the model, the run folder, the Trainer's config."""

    args: argparse.Namespace
    spec: ModelSpec
    out: Path
    resume: Path | None  # --resume: a checkpoint, or a folder of them (a run folder's checkpoints/)
    trainer: TrainerConfig
    auto_resume: bool = False


def resolve(args: argparse.Namespace, *, now: datetime.datetime | None = None) -> Settings:
    """Turn parsed flags into `Settings`; invalid combinations raise `devplug.ConfigError`."""
    spec = ModelSpec(width=args.width, layers=args.layers, heads=args.heads, context=args.context,
                     tie_weights=args.tie_weights).check()
    if args.tp is not None and args.strategy not in ("tp", "fsdp+tp"):  # else it would be ignored without a word
        raise ConfigError(f"--tp {args.tp} splits layers only under --strategy tp or fsdp+tp (this run: --strategy "
                          f"{args.strategy}); add one of them or drop --tp")
    if args.min_lr > args.lr:
        raise ConfigError(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}; the decay ends at --min-lr")
    parser = build_parser()  # the same bindings as the parser that parsed args
    run = parser.run_folder(args, now=now)
    if args.consolidate is not None and args.consolidate.is_dir():
        raise ConfigError(f"--consolidate {str(args.consolidate)!r} is a folder; name the file to write")
    checkpoints = (run.out / "checkpoints").resolve()
    if args.consolidate is not None and (args.consolidate.resolve().is_relative_to(checkpoints)
                                         or fnmatch.fnmatch(args.consolidate.name, "step_*.pt")):
        raise ConfigError(f"--consolidate {str(args.consolidate)!r} would replace or sit among checkpoints (step_*.pt, "
                          f"or {str(run.out / 'checkpoints')!r}, which the run prunes); name a file outside them")
    policy = parser.build(CheckpointPolicy, args, directory=run.out / "checkpoints", at_end=True)
    config = parser.build(TrainerConfig, args, log_dir=str(run.out / "tensorboard"), progress=False,
                          checkpoints=policy, device_options=device_options(args.device_options))
    return Settings(args=args, spec=spec, out=run.out, resume=run.resume, trainer=config,
                    auto_resume=run.auto_resume)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (``None``: ``sys.argv[1:]``); a bad flag is one ``lm: error:`` line and exit status 2."""
    return build_parser().parse(argv)

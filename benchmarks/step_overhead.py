"""devplug's own cost per training step, component by component, against the same plain PyTorch loop.

The model is next to no compute (``Linear(8, 8)`` on a batch of 4), so what is left of a step is the Python
around it. Variants, each one epoch of ``--steps`` steps over the same in-memory batches, interleaved in
rounds (`_timing.interleaved_samples`) with a second plain loop as the A/A noise floor; each adds one
piece of devplug to the one before it:

- ``raw``: ``x.to(device)``, forward, loss, ``backward``, ``step``, ``zero_grad(set_to_none=True)``,
  ``losses.append(loss.detach())`` (what a raw loop keeps instead of ``.item()``);
- ``to_device``: the batch moved by ``trainer.to_device`` instead;
- ``loop``: the batches drawn from ``trainer.dataloader`` inside ``trainer.epochs()`` (the epoch's
  bookkeeping, the data-wait clock, the stop check, the position), each moved by the Trainer's loader;
- ``step``: also ``trainer.autocast()``, ``trainer.backward``, ``trainer.step``;
- ``log``: also ``trainer.log(loss=loss)`` every step instead of the list (a log point every
  ``--log-every`` steps, as a run has);
- with ``--no-op-plugin``, ``log+no-op``: the whole loop with a device-neutral plugin whose ``devplug_region`` and
  ``devplug_mark_step`` do nothing and which says so (``devplug_step_marks``), as the CUDA plugin does without
  profiling; ``log+unstated``: the same plugin without saying so, whose hooks are then called in every step (their
  component is the difference to ``log``).

The table gives each variant's µs/step, its paired ratio to ``raw`` (median over rounds of the ratio in
the same round) and the overhead over ``raw``; the component column is the difference to the row above.
Each row also gives the Python function calls per step (``sys.setprofile``, counted once, untimed): a
figure no other tenant of the machine can move, and the thing the overhead is made of.

On a busy machine a step's compute is far noisier than devplug's few µs, so ``--no-compute`` times the
same ladder with the tensor work taken out (a loss whose ``backward`` and an optimizer whose ``step`` do
nothing, the batch already on the device): what is left is the Python of each side alone.
``--profile`` instead runs the full devplug loop under cProfile and prints where its time goes.
The model runs on one intra-op thread (``--threads``): its ops are too small for more to help.

Run: python benchmarks/step_overhead.py [--steps 2000] [--rounds 9] [--log-every 100] [--no-compute] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from _timing import interleaved_samples, paired_ratio

import devplug

AA = "raw (A/A)"


class Batches:
    """An iterable of ready batches (not a Sequence, so the Trainer uses it as the author's own loader)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class NoLoss:
    """A stand-in loss whose ``backward`` does nothing (``--no-compute``)."""

    def backward(self) -> None:
        """Nothing to differentiate."""

    def detach(self) -> NoLoss:
        """Itself."""
        return self


class NoOptimizer:
    """A stand-in optimizer whose ``step`` and ``zero_grad`` do nothing (``--no-compute``)."""

    param_groups: list[dict[str, Any]] = [{"lr": 1e-3, "params": []}]

    def step(self) -> None:
        """Nothing to update."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No gradients to drop."""


def make_batches(steps: int, batch: int = 4, width: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of (inputs, targets) on the host."""
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, width, generator=generator), torch.randn(batch, width, generator=generator))
            for _ in range(steps)]


def variants(args: argparse.Namespace) -> tuple[dict[str, Callable[[], None]], list[devplug.Trainer]]:
    """The timed callables (one epoch each) and the trainers to close afterwards."""
    batches = make_batches(args.steps)
    device = torch.device("cpu")
    compute = not args.no_compute
    logged = torch.tensor(1.0)  # what --no-compute logs (a loss computed elsewhere)
    trainers: list[devplug.Trainer] = []

    def model_and_opt(trainer: devplug.Trainer | None) -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        if not compute:
            return (lambda x, y: NoLoss()), NoOptimizer()
        if trainer is None:
            model = model.to(device)
            opt: Any = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        else:
            model = trainer.setup(model)
            opt = trainer.optimizer("adam", model.parameters(), lr=1e-3, fused=True)
        return (lambda x, y: torch.nn.functional.mse_loss(model(x), y)), opt

    def raw() -> Callable[[], None]:
        forward, opt = model_and_opt(None)
        losses: list[Any] = []

        def epoch() -> None:
            losses.clear()
            for x, y in batches:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = forward(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.detach() if compute else logged.detach())

        return epoch

    def trainer(plugin: Any = None) -> devplug.Trainer:
        # --no-compute has no FLOPs to count: a counter would wait for them at every batch, as no real run does
        pm = None if plugin is None else devplug.create_plugin_manager(extra_plugins=[("no-op marks", plugin)])
        made = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=args.log_every,
                               stop_signals=(), count_flops=compute, plugin_manager=pm)
        trainers.append(made)
        return made

    def to_device() -> Callable[[], None]:
        t = trainer()
        forward, opt = model_and_opt(t)
        losses: list[Any] = []

        def epoch() -> None:
            losses.clear()
            for batch in batches:
                x, y = t.to_device(batch)
                loss = forward(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.detach() if compute else logged.detach())

        return epoch

    def loop(with_step: bool, with_log: bool, plugin: Any = None) -> Callable[[], None]:
        t = trainer(plugin)
        forward, opt = model_and_opt(t)
        loader = t.dataloader(Batches(batches))
        epochs = t.epochs(2**62)
        losses: list[Any] = []

        def epoch() -> None:
            next(epochs)
            losses.clear()
            for x, y in loader:
                if with_step:
                    with t.autocast():
                        loss = forward(x, y)
                    t.backward(loss)
                    t.step(opt)
                else:
                    loss = forward(x, y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                if with_log:
                    t.log(loss=loss if compute else logged)
                else:
                    losses.append(loss.detach() if compute else logged.detach())

        return epoch

    built: dict[str, Callable[[], None]] = {
        "raw": raw(), AA: raw(), "to_device": to_device(), "loop": loop(False, False),
        "step": loop(True, False), "log": loop(True, True)}
    if args.no_op_plugin:
        built["log+no-op"] = loop(True, True, NoOpMarks(stated=True))
        built["log+unstated"] = loop(True, True, NoOpMarks(stated=False))
    return built, trainers


class NoOpMarks:
    """A device-neutral plugin answering region and mark_step as no-ops, as the CUDA plugin does without profiling;
    ``stated``: it says so through ``devplug_step_marks`` (else it is taken to mark, and called every step)."""

    def __init__(self, stated: bool) -> None:
        if stated:
            self.devplug_step_marks = devplug.hookimpl(lambda device: devplug.StepMarks(regions=False, steps=False))

    @devplug.hookimpl
    def devplug_region(self, device: devplug.Device, name: str) -> Any:
        return contextlib.nullcontext()

    @devplug.hookimpl
    def devplug_mark_step(self, device: devplug.Device, phase: devplug.Phase) -> None:
        return None


def calls_per_step(epoch: Callable[[], None], steps: int) -> float:
    """Python function calls (generator resumptions included) per step of one more run of ``epoch``."""
    counts: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[event] += 1

    sys.setprofile(count)
    try:
        epoch()
    finally:
        sys.setprofile(None)
    return counts["call"] / steps


def profile(args: argparse.Namespace) -> None:
    """The full devplug loop (``log`` variant) under cProfile: where its time goes."""
    built, trainers = variants(args)
    epoch = built["log"]
    epoch()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.rounds):
        epoch()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    for t in trainers:
        t.close()


def main() -> None:
    """Time the variants interleaved and print the per-component table (or, with --profile, a profile)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="steps per timed epoch")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (paired medians)")
    parser.add_argument("--log-every", type=int, default=100, help="the Trainer's log_every")
    parser.add_argument("--no-compute", action="store_true", help="take the tensor work out: devplug's Python alone")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--no-op-plugin", action="store_true",
                        help="also the whole loop with a neutral plugin whose region and mark_step are no-ops, stating "
                             "so (log+no-op) and not (log+unstated)")
    parser.add_argument("--profile", action="store_true", help="profile the devplug loop instead of timing")
    parser.add_argument("--top", type=int, default=30, help="rows of the profile")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1 or args.log_every < 1 or args.threads < 1:
        parser.error("--steps, --rounds, --log-every and --threads must be positive")
    torch.set_num_threads(args.threads)
    if args.profile:
        profile(args)
        return
    built, trainers = variants(args)
    samples = interleaved_samples(built, rounds=args.rounds, warmup=1)
    calls = {name: calls_per_step(epoch, args.steps) for name, epoch in built.items()}
    for t in trainers:
        t.close()
    raw = statistics.median(samples["raw"]) / args.steps * 1e6
    work = "no tensor work (--no-compute)" if args.no_compute else "Linear(8, 8), batch 4, fp32, Adam(fused=True)"
    print(f"{work}; cpu, {args.threads} thread(s); {args.steps} steps per timed epoch, {args.rounds} rounds, "
          f"log_every={args.log_every}")
    print(f"{'variant':<11} {'µs/step':>9} {'time / raw':>11} {'overhead µs':>12} {'component µs':>13} "
          f"{'py calls/step':>14}")
    previous: float | None = None
    for name in built:
        ratio = paired_ratio(samples, name, "raw")
        us = statistics.median(samples[name]) / args.steps * 1e6
        overhead = (ratio - 1) * raw
        component = "" if previous is None or name == AA else f"{overhead - previous:>+13.2f}"
        print(f"{name:<11} {us:>9.2f} {ratio:>11.4f} {overhead:>+12.2f} {component:>13} {calls[name]:>14.2f}")
        if name != AA and not name.startswith("log+"):  # log+...: the difference to the whole loop (log)
            previous = overhead


if __name__ == "__main__":
    main()

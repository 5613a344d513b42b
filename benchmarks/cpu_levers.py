"""Do torch.compile and channels_last pay on the CPU? The DCGAN step and an MLP step, fp32, with warm-up costs.

Variants, each a Trainer of its own (``Trainer(device="cpu", precision="32-true", compile=..., channels_last=...)``,
so the levers go through the CPU plugin exactly as ``examples/dcgan.py --compile --channels-last`` uses them):
``eager``, ``eager (A/A)`` (a second, identical eager Trainer: its ratio to ``eager`` is the noise floor),
``channels_last``, ``compile`` (``devplug_compile``: torch.compile with its default Inductor backend) and
``compile+channels_last``. The MLP has no 4-D tensor, so its channels_last variants would time eager again:
they are left out.

Workloads: ``dcgan`` is the example's own D+G training step (``DCGANStep``: G forward, D on real and fake,
D step, G step, the plugin's Adam), SYNTHETIC (one batch of the embedded shapes kept on the device), at the
example's defaults on the CPU (``--model auto`` with the embedded data: ``tiny-32``; ``--batch-size`` 128);
``mlp`` is peers.py's MLP (64 -> 128 -> 10, batch 32, cross-entropy, Adam), a step short enough that per-step
overhead, which compilation can remove, shows.

Why in ONE process, interleaved, and not one process per variant: on this shared 2-core machine the noise
that matters is other tenants' load, which drifts over seconds to minutes. Interleaved rounds (``_timing``:
each round every variant runs one block, in a seeded shuffled order) put all variants under the same drift,
and ratios are *paired* (the median over rounds of variant / eager in the same round), which cancels it; one
process per variant would time each variant under a different load (interleaving whole processes would need
a compilation per round). What one process shares between variants: torch's intra-op thread pool and the
oneDNN primitive cache (keyed by shape and layout, so neither variant's kernels are another's) and Inductor's
caches: compiled kernels are cached by their code, so the second compiled variant could reuse a kernel the
first compiled; its reported warm-up is then a lower bound. The Inductor on-disk cache is a fresh temporary
folder (``--inductor-cache default`` keeps torch's own), so compile warm-up is what a first run pays.

Warm-up is excluded from the steady-state timing but reported: each variant's first ``--warmup-steps`` steps
are timed one by one before any round (after one untimed step of a throwaway eager Trainer, which absorbs the
process's own one-time costs); ``warm-up s`` = their sum - that many steady-state steps (for the compiled
variants: the compilation). ``repays after`` = (variant's warm-up - eager's) / (eager's step - variant's
step): the steps after which the variant's run has caught up with eager ("never" where it is not faster).
Every variant's timed block holds the same number of steps, sized on eager to about ``--block-seconds`` (blocks
of 1, 2, 4, ... eager steps until one takes a quarter of that).

Compute limit: one eager step's FLOPs counted with ``torch.utils.flop_counter.FlopCounterMode`` (as devplug's
MFU does: every matmul and convolution, forward and backward; a compiled module computes the same FLOPs);
achieved GFLOP/s = FLOPs per step / seconds per step, and ``% peak`` its share of the CPU plugin's peak for
fp32 (``devplug_peak_flops``: physical cores x clock x FLOP/cycle from the CPU's features), printed with its
derivation.

Verdict per lever: ``pays`` when its speed vs eager exceeds 1 + the A/A floor, where the floor is the largest
per-round deviation of ``eager (A/A)`` from ``eager`` (at least 1 %); ``costs`` when below 1 - floor; else
``within noise``.

Run: python benchmarks/cpu_levers.py [--workloads dcgan,mlp] [--model tiny-32] [--batch-size 128]
     [--mlp-batch-size 32] [--rounds 5] [--block-seconds 1.0] [--warmup-steps 3] [--variants all]
     [--inductor-cache fresh|default]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _dcgan import PRESETS, DCGANStep, ShapesDataset, to_unit_range
from _timing import interleaved_samples, paired_ratio
from torch import nn

import devplug
from devplug.plugins.cpu.peaks import peak_flops

EAGER, AA = "eager", "eager (A/A)"
#: Variant name -> (compile, channels_last).
VARIANTS: dict[str, tuple[bool, bool]] = {
    EAGER: (False, False),
    AA: (False, False),
    "channels_last": (False, True),
    "compile": (True, False),
    "compile+channels_last": (True, True),
}
WORKLOADS = ("dcgan", "mlp")
#: The smallest noise floor a verdict uses, even when the A/A pair happened to agree more closely.
MIN_FLOOR = 0.01


def make_trainer(compile_: bool, channels_last: bool) -> devplug.Trainer:
    """A CPU Trainer in fp32 with the two levers as given (nothing logged, no FLOP counting of its own)."""
    return devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, log_every=10**9,
                           count_flops=False, compile=compile_, channels_last=channels_last)


class DCGANWorkload:
    """The example's D+G step on one batch of embedded shapes kept on the device (SYNTHETIC)."""

    def __init__(self, trainer: devplug.Trainer, model: str, batch: int) -> None:
        spec = PRESETS[model]
        self.trainer = trainer
        self.step_fn = DCGANStep(trainer, spec)
        shapes = ShapesDataset(spec.image_size)
        self.real = to_unit_range(trainer.to_device(torch.stack([shapes[i][0] for i in range(batch)])))
        self.last: dict[str, torch.Tensor] = {}

    def step(self) -> None:
        """One training iteration."""
        self.last = self.step_fn(self.real)

    def finite(self) -> bool:
        """True when the last step's losses are finite."""
        return all(math.isfinite(float(v.detach())) for v in self.last.values())


class MLPWorkload:
    """peers.py's MLP (64 -> 128 -> 10): forward, cross-entropy, backward, the plugin's Adam, on one batch."""

    def __init__(self, trainer: devplug.Trainer, batch: int) -> None:
        torch.manual_seed(0)
        self.trainer = trainer
        self.model = trainer.setup(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)), name="mlp")
        self.opt = trainer.optimizer("adam", self.model.parameters(), lr=1e-3)
        self.x = trainer.to_device(torch.randn(batch, 64))
        self.y = trainer.to_device(torch.randint(0, 10, (batch,)))
        self.criterion = nn.CrossEntropyLoss()
        self.loss = torch.zeros(())

    def step(self) -> None:
        """One training iteration."""
        with self.trainer.autocast():
            self.loss = self.criterion(self.model(self.x), self.y)
        self.trainer.backward(self.loss)
        self.trainer.step(self.opt)

    def finite(self) -> bool:
        """True when the last loss is finite."""
        return math.isfinite(float(self.loss.detach()))


Workload = DCGANWorkload | MLPWorkload


def build(workload: str, trainer: devplug.Trainer, args: argparse.Namespace) -> Workload:
    """The workload ``workload`` on ``trainer``."""
    if workload == "dcgan":
        return DCGANWorkload(trainer, args.model, args.batch_size)
    return MLPWorkload(trainer, args.mlp_batch_size)


class LeverRun:
    """One variant: its Trainer and workload, its warm-up steps timed one by one, then blocks of steps."""

    def __init__(self, workload: str, variant: str, args: argparse.Namespace) -> None:
        compile_, channels_last = VARIANTS[variant]
        self.trainer = make_trainer(compile_, channels_last)
        self.work = build(workload, self.trainer, args)
        self.warmup_times: list[float] = []
        self.steps = 1

    def timed_step(self) -> float:
        """One step, synchronised, and its seconds."""
        start = time.perf_counter()
        self.work.step()
        self.trainer.synchronize()
        return time.perf_counter() - start

    def warm_up(self, steps: int) -> None:
        """Time the first ``steps`` steps one by one."""
        self.warmup_times = [self.timed_step() for _ in range(steps)]

    def steps_for(self, seconds: float) -> int:
        """How many steps take about ``seconds``: blocks of 1, 2, 4, ... steps until one takes a quarter of it."""
        count = 1
        while True:
            start = time.perf_counter()
            for _ in range(count):
                self.work.step()
            self.trainer.synchronize()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / 4 or count >= 2**20:
                return max(1, round(count * seconds / elapsed))
            count *= 2

    def block(self) -> None:
        """``steps`` steps, then wait for the device."""
        for _ in range(self.steps):
            self.work.step()
        self.trainer.synchronize()


def count_flops(run: LeverRun) -> float:
    """FLOPs of one (eager) step, counted the way devplug's MFU counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        run.work.step()
    return float(counter.get_total_flops())


def fmt_repay(steps: float | None) -> str:
    """``repays after`` column: a step count, or why there is none."""
    if steps is None:
        return "never"
    if steps <= 0:
        return "at once"
    count = math.ceil(steps)
    return f"{count:,} step{'s' if count > 1 else ''}"


def measure(workload: str, args: argparse.Namespace, variants: list[str], peak: float) -> dict[str, Any]:
    """Warm up and time ``variants`` of ``workload`` interleaved; print the table; return the figures."""
    # Absorb the process's one-time costs (thread pool, allocator, first oneDNN use) outside every variant.
    primer = LeverRun(workload, EAGER, args)
    primer.timed_step()
    del primer
    runs: dict[str, LeverRun] = {}
    for variant in variants:
        try:
            run = LeverRun(workload, variant, args)
            run.warm_up(args.warmup_steps)
        except Exception as exc:  # e.g. torch.compile without a working C++ compiler: say so, time the rest
            print(f"{workload}: {variant} does not run here ({type(exc).__name__}: {str(exc).splitlines()[0]})")
            continue
        runs[variant] = run
    # One block length for all, sized on eager (the levers move a step by tens of per cent, so blocks stay
    # comparable; a single step timed per variant during a co-tenant's burst would size them badly).
    steps = runs[EAGER].steps_for(args.block_seconds)
    for run in runs.values():
        run.steps = steps
    flops = count_flops(runs[EAGER])
    samples = interleaved_samples({v: r.block for v, r in runs.items()}, rounds=args.rounds, warmup=0)
    per_step = {v: [t / runs[v].steps for t in times] for v, times in samples.items()}
    step_s = {v: statistics.median(times) for v, times in per_step.items()}
    speed = {v: 1.0 / paired_ratio(per_step, v, EAGER) for v in runs}
    aa_rounds = [a / e for a, e in zip(per_step[AA], per_step[EAGER], strict=True)] if AA in runs else []
    floor = max([MIN_FLOOR, *(abs(r - 1.0) for r in aa_rounds)])
    warm = {v: sum(r.warmup_times) - len(r.warmup_times) * step_s[v] for v, r in runs.items()}

    items = args.batch_size if workload == "dcgan" else args.mlp_batch_size
    what = (f"DCGAN D+G step, {args.model}, batch {args.batch_size}" if workload == "dcgan"
            else f"MLP 64-128-10 step, batch {args.mlp_batch_size}")
    plural = "s" if steps > 1 else ""
    print(f"\n{what}: {flops / 1e9:.4g} GFLOP per step (FlopCounterMode); {steps} step{plural} per timed block")
    header = (f"{'variant':<24}{'ms/step':>10}{'items/s':>10}{'vs eager':>10}{'GFLOP/s':>10}{'% peak':>10}"
              f"{'warm-up s':>11}{'1st step s':>11}  repays after")
    print(header)
    for v, run in runs.items():
        gain = step_s[EAGER] - step_s[v]
        extra = warm[v] - warm[EAGER]
        repay = None if v in (EAGER, AA) or gain <= 0 else extra / gain
        achieved = flops / step_s[v]
        print(f"{v:<24}{step_s[v] * 1e3:>10.2f}{items / step_s[v]:>10.1f}{speed[v]:>9.2f}x{achieved / 1e9:>10.3g}"
              f"{achieved / peak * 100:>9.3g}%{warm[v]:>11.2f}{run.warmup_times[0]:>11.2f}  "
              f"{'-' if v in (EAGER, AA) else fmt_repay(repay)}")
    compiled = [v for v in runs if VARIANTS[v][0]]
    if len(compiled) > 1:
        print(f"(warm-up of {', '.join(compiled[1:])}: after {compiled[0]} compiled the same networks in this "
              "process, so kernels it shares are reused: a lower bound)")
    spread = f"{min(aa_rounds):.3f}-{max(aa_rounds):.3f}" if aa_rounds else "n/a"
    print(f"A/A floor: eager (A/A)/eager per round {spread} -> floor {floor * 100:.1f}% "
          f"(speed-ups within it are noise); losses finite: {all(r.work.finite() for r in runs.values())}")
    for v in runs:
        if v in (EAGER, AA):
            continue
        verdict = "pays" if speed[v] > 1 + floor else ("costs" if speed[v] < 1 - floor else "within noise")
        print(f"{workload}: {v} {speed[v]:.2f}x eager -> {verdict}")
    return {"flops": flops, "step_s": step_s, "speed": speed, "warmup_s": warm, "floor": floor}


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, time each workload's variants, print the tables and verdicts."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="dcgan,mlp", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--model", default="tiny-32", choices=list(PRESETS), help="DCGAN preset (default tiny-32)")
    parser.add_argument("--batch-size", type=int, default=128, help="DCGAN batch (default 128, the example's)")
    parser.add_argument("--mlp-batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=1.0, help="target length of one timed block")
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps timed one by one before the rounds")
    parser.add_argument("--variants", default="all",
                        help=f"comma-separated, of {', '.join(VARIANTS)} (eager and its A/A always run)")
    parser.add_argument("--inductor-cache", choices=["fresh", "default"], default="fresh",
                        help="fresh: an empty temporary Inductor cache, so compile warm-up is a first run's")
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    for flag in ("batch_size", "mlp_batch_size", "rounds", "warmup_steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if not args.block_seconds > 0:
        parser.error("--block-seconds must be positive")
    chosen = list(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    for v in chosen:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")

    peak = peak_flops(torch.float32)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"CPU levers: fp32, {torch.get_num_threads()} threads, torch {torch.__version__}, {args.rounds} interleaved "
          f"rounds, load average {load:.2f}; peak {peak.value / 1e9:.1f} GFLOP/s ({peak.source}: {peak.detail})")
    with tempfile.TemporaryDirectory(prefix="devplug-inductor-") as cache:
        if args.inductor_cache == "fresh":
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache))
        for workload in workloads:
            variants = [v for v in VARIANTS if v in (EAGER, AA) or v in chosen]
            if workload == "mlp":
                variants = [v for v in variants if not VARIANTS[v][1]]  # no 4-D tensors: channels_last is eager
            measure(workload, args, variants, peak.value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

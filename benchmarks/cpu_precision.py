"""Does the CPU plugin's precision "auto" pay? The DCGAN step in bf16-mixed vs 32-true (and 16-mixed) on the CPU.

The CPU plugin turns ``precision="auto"`` into ``bf16-mixed`` on CPUs with native bf16 (x86 AMX or
AVX512-BF16, Arm BF16) and into ``32-true`` elsewhere. This times the example's full D+G training step
(SYNTHETIC in the IO / SYNTHETIC / FULL method: one batch kept on the device, no loading) under each precision, one
Trainer per precision, interleaved in one process, and prints the ratios to ``32-true``.

``16-mixed`` (fp16 autocast + GradScaler) runs on the CPU but has few fast fp16 kernels there, so it is
an order of magnitude slower; by default it is timed on the smallest model only (``--fp16-models``).
Each variant's block holds as many steps as fill about ``--block-seconds`` (calibrated on a warm-up
step), so slow and fast variants get comparable timing blocks; figures are per step.

``--upstream-g-step`` also times each precision with pytorch/examples' G step (``DCGANStep(freeze_d=False)``: D's
weight gradients computed in the G step and thrown away), next to the example's (D frozen while G trains), and
prints what freezing D saves; ``--aa`` adds a second, identical ``32-true`` Trainer whose ratio is the noise floor.

Run: python benchmarks/cpu_precision.py [--models tiny-32,naive-64] [--batch-size 64] [--rounds 5]
     [--precisions 32-true,bf16-mixed,16-mixed] [--fp16-models tiny-32|all|none] [--block-seconds 1.5]
     [--upstream-g-step] [--aa]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from _dcgan import PRESETS, DCGANStep, ShapesDataset, to_unit_range
from _timing import interleaved, report

import devplug
from devplug.plugins.cpu.plugin import cpu_flags, has_native_bf16

BASELINE = "32-true"
UPSTREAM = "(upstream G step)"


class PrecisionRun:
    """One precision's Trainer and DCGAN step on a fixed batch; ``block()`` runs ``steps`` steps and syncs."""

    def __init__(self, model: str, precision: str, batch: int, block_seconds: float, freeze_d: bool = True) -> None:
        spec = PRESETS[model]
        self.trainer = devplug.Trainer(device="cpu", precision=precision, seed=0, progress=False, log_every=10**9)
        self.step = DCGANStep(self.trainer, spec, freeze_d=freeze_d)
        shapes = ShapesDataset(spec.image_size)
        self.real = to_unit_range(self.trainer.to_device(torch.stack([shapes[i][0] for i in range(batch)])))
        self.last = self.step(self.real)  # first step: allocator, oneDNN primitive creation
        start = time.perf_counter()
        self.last = self.step(self.real)  # second step: calibrates the block length
        self.steps = max(1, round(block_seconds / (time.perf_counter() - start)))

    def block(self) -> None:
        """``steps`` training steps, then wait for the device."""
        for _ in range(self.steps):
            self.last = self.step(self.real)
        self.trainer.synchronize()

    def finite(self) -> bool:
        """True when the last step's losses and D outputs are finite numbers."""
        return all(math.isfinite(float(v.detach())) for v in self.last.values())


def main() -> None:
    """Time each precision's DCGAN step, interleaved, per model; print ratios and the verdict on "auto"."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-32,naive-64", help=f"comma-separated, of {', '.join(PRESETS)}")
    parser.add_argument("--precisions", default="32-true,bf16-mixed,16-mixed")
    parser.add_argument("--fp16-models", default="tiny-32",
                        help="models on which 16-mixed is timed too: comma-separated, 'all' or 'none'")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=1.5, help="target length of one timed block")
    parser.add_argument("--upstream-g-step", action="store_true",
                        help="also time each precision with pytorch/examples' G step (D's weight gradients computed)")
    parser.add_argument("--aa", action="store_true", help="time 32-true twice: the ratio of the two is the noise floor")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    for model in models:
        if model not in PRESETS:
            parser.error(f"unknown model {model!r}; choose from {', '.join(PRESETS)}")
    fp16_models = set(PRESETS) if args.fp16_models == "all" else set(args.fp16_models.split(",")) - {"none"}
    precisions = [p for p in args.precisions.split(",") if p]
    if BASELINE not in precisions:
        precisions.insert(0, BASELINE)

    auto = devplug.Trainer(device="cpu", precision="auto", progress=False).precision.name
    bf16_flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16", "bf16"})
    print(f"CPU precision: DCGAN D+G step on the CPU, batch {args.batch_size}, {torch.get_num_threads()} threads, "
          f"{args.rounds} interleaved rounds; native bf16: {has_native_bf16()} ({', '.join(bf16_flags) or 'no flag'})"
          f", so precision 'auto' -> {auto}")
    for model in models:
        runs: dict[str, PrecisionRun] = {}
        for precision in precisions:
            if precision == "16-mixed" and model not in fp16_models:
                continue
            variants = [(precision, True)]
            if args.upstream_g_step:
                variants.append((f"{precision} {UPSTREAM}", False))
            if args.aa and precision == BASELINE:
                variants.append((f"{BASELINE} (A/A)", True))
            for name, freeze_d in variants:
                try:
                    runs[name] = PrecisionRun(model, precision, args.batch_size, args.block_seconds, freeze_d)
                except Exception as exc:  # a precision this torch cannot run on the CPU: say so, time the rest
                    print(f"{model}: {precision} does not run here ({type(exc).__name__}: {exc})")
                    break
        medians = interleaved({p: r.block for p, r in runs.items()}, rounds=args.rounds, warmup=0)
        per_step = {p: t / runs[p].steps for p, t in medians.items()}
        blocks = ", ".join(f"{p} {r.steps}" for p, r in runs.items())
        print(report(f"\n{model}: median per step (steps per block: {blocks})", per_step, BASELINE,
                     unit="s/step", items=args.batch_size))
        finite = all(r.finite() for r in runs.values())
        if "bf16-mixed" in per_step:
            gain = per_step[BASELINE] / per_step["bf16-mixed"]
            verdict = "pays" if gain > 1.05 else ("is neutral" if gain >= 0.95 else "costs")
            print(f"{model}: bf16-mixed/32-true = {gain:.2f}x -> bf16 autocast {verdict} here "
                  f"(losses finite in every precision: {finite})")
        if f"{BASELINE} (A/A)" in per_step:
            print(f"{model}: A/A: 32-true timed twice differs by "
                  f"{abs(per_step[BASELINE] / per_step[f'{BASELINE} (A/A)'] - 1) * 100:.1f}%: the noise floor")
        for precision in precisions:
            if precision in per_step and f"{precision} {UPSTREAM}" in per_step:
                print(f"{model}: {precision}: D frozen in the G step is "
                      f"{per_step[f'{precision} {UPSTREAM}'] / per_step[precision]:.2f}x the speed of {UPSTREAM}")
        if "16-mixed" in per_step:
            print(f"{model}: 16-mixed/32-true = {per_step[BASELINE] / per_step['16-mixed']:.3f}x "
                  "(fp16 has no fast CPU path: never a CPU default)")


if __name__ == "__main__":
    main()

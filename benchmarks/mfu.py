"""MFU two ways: a training step's achieved FLOP/s over the device's peak, and over a plain GEMM's rate.

The datasheet view: MFU, the step's achieved FLOP/s over the peak the device plugin reports for the
precision in use (``devplug_peak_flops``: a GPU's datasheet figure, a CPU's cores × clock × FLOP per cycle
from its features), printed with the one line that says how the peak was obtained. The achievable view:
the same achieved FLOP/s over the rate of a plain square GEMM (``a @ b``) in the run's number format on
the same device, measured in the same run: the share of the device's best plain kernel the step gets.

Workloads, each on a Trainer of its own per precision (``--precisions``, default ``32-true,bf16-mixed``),
with the device plugin's choices (its optimizer, autocast, preferred layout): ``dcgan`` is the DCGAN
example's D+G step (``DCGANStep``, preset ``--model``, batch ``--batch-size``, one batch of the embedded
shapes kept on the device); ``lm`` is the language-model example's step (``LanguageModel``, width, layers,
heads, context and batch of the example's defaults, next-byte cross-entropy, AdamW) on one batch of
random bytes. FLOPs per step are counted the way devplug's MFU counts them: the Trainer counts its
second step with ``torch.utils.flop_counter.FlopCounterMode`` (every matmul and convolution, forward and
backward); the first three steps run through ``trainer.epochs()`` so ``trainer.summary()`` gives the
FLOPs and the peak; then steps are timed in blocks.

Timing: the steps and the GEMM (``--gemm-size``, 2048² on a CPU, 8192² elsewhere; of the precision's
compute dtype; fp32 under torch's matmul settings as the Trainer left them, TF32 or not) run interleaved in
rounds (``_timing``), each timed block ending with ``trainer.synchronize()``, so load from other processes
hits both alike; ``of GEMM`` is the median over rounds of the step's achieved rate over the GEMM's rate in
the same round. Achieved, MFU and the GEMM rate are medians.

Run: python benchmarks/mfu.py [--device cpu] [--precisions 32-true,bf16-mixed] [--workloads dcgan,lm]
     [--rounds 5] [--block-seconds 0.5] [--gemm-size N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _dcgan import PRESETS, DCGANStep, ShapesDataset, to_unit_range
from _timing import interleaved_samples

import devplug
from devplug import toolkit

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES) not in sys.path:  # the LM example's package, lm, is the folder examples/lm/
    sys.path.insert(0, str(EXAMPLES))

from lm.models import LanguageModel, ModelSpec  # noqa: E402
from lm.train import next_byte_loss  # noqa: E402

WORKLOADS = ("dcgan", "lm")
#: The number formats a precision multiplies in, by its compute dtype.
FORMATS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def rate(value: float) -> str:
    """``value`` FLOP/s as devplug's summary prints it (``"166.2 GFLOP/s"``)."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}FLOP/s"
    return f"{value:.4g} FLOP/s"


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype ``precision`` multiplies in (float32 for a name no precision is registered under)."""
    known = toolkit.find_precision(precision)
    return known.compute_dtype if known is not None else torch.float32


class Workload:
    """One training step on one batch kept on the device; ``step()`` runs it, ``batch`` is its samples."""

    def __init__(self, trainer: devplug.Trainer, batch: int, step: Callable[[torch.Tensor], Any],
                 data: torch.Tensor, what: str) -> None:
        self.trainer, self.batch, self._step, self.data, self.what = trainer, batch, step, data, what
        self.steps = 1

    def step(self) -> None:
        """One training iteration on the kept batch."""
        self._step(self.data)

    def count(self) -> dict[str, Any]:
        """Three steps through ``trainer.epochs()`` (the Trainer counts the second's FLOPs); the run's summary."""
        loader = self.trainer.dataloader(torch.utils.data.TensorDataset(self.data.cpu()), batch_size=self.batch,
                                         num_workers=0)
        for _ in self.trainer.epochs(3, max_steps=3):
            for (batch,) in loader:
                self._step(batch)
        self.trainer.synchronize()
        return dict(self.trainer.summary())

    def size_block(self, seconds: float) -> None:
        """Make a block about ``seconds`` long: 1, 2, 4, ... steps until one block takes a quarter of it."""
        count = 1
        while True:
            start = time.perf_counter()
            for _ in range(count):
                self.step()
            self.trainer.synchronize()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / 4 or count >= 2**16:
                self.steps = max(1, round(count * seconds / elapsed))
                return
            count *= 2

    def block(self) -> None:
        """``steps`` steps, then wait for the device."""
        for _ in range(self.steps):
            self.step()
        self.trainer.synchronize()


def make_trainer(device: str, precision: str) -> devplug.Trainer:
    """A Trainer with the plugin's choices that counts one step's FLOPs and logs nothing in between."""
    return devplug.Trainer(device=device, precision=precision, seed=0, progress=False, log_every=10**9,
                           channels_last="auto", loggers=[])


def dcgan(device: str, precision: str, args: argparse.Namespace) -> Workload:
    """The DCGAN example's D+G step on one batch of the embedded shapes."""
    trainer = make_trainer(device, precision)
    spec = PRESETS[args.model]
    step = DCGANStep(trainer, spec)
    shapes = ShapesDataset(spec.image_size)
    real = to_unit_range(trainer.to_device(torch.stack([shapes[i][0] for i in range(args.batch_size)])))
    return Workload(trainer, args.batch_size, step, real, f"DCGAN {args.model}, batch {args.batch_size}")


def lm(device: str, precision: str, args: argparse.Namespace) -> Workload:
    """The language-model example's step (next-byte loss, AdamW) on one batch of random bytes."""
    trainer = make_trainer(device, precision)
    spec = ModelSpec(width=args.lm_width, layers=args.lm_layers, heads=args.lm_heads, context=args.lm_context)
    model = trainer.setup(LanguageModel(spec), name="lm")
    optimizer = trainer.optimizer("adamw", model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

    def step(batch: torch.Tensor) -> None:
        with trainer.autocast():
            loss = next_byte_loss(model, batch)
        trainer.backward(loss)
        trainer.step(optimizer)

    tokens = torch.randint(0, 256, (args.lm_batch, spec.context + 1), generator=torch.Generator().manual_seed(0))
    return Workload(trainer, args.lm_batch, step, trainer.to_device(tokens),
                    f"LM {spec.width}x{spec.layers}, ctx {spec.context}, batch {args.lm_batch}")


class Gemm:
    """Blocks of a plain square ``a @ b`` in one dtype on the device, synchronised at the end."""

    def __init__(self, trainer: devplug.Trainer, dtype: torch.dtype, size: int) -> None:
        self.trainer, self.size = trainer, size
        self.a = torch.full((size, size), 0.5, dtype=dtype, device=trainer.torch_device)
        self.b = torch.full((size, size), 0.25, dtype=dtype, device=trainer.torch_device)
        self.steps = 1

    def step(self) -> None:
        """One matmul."""
        self.a @ self.b

    size_block = Workload.size_block
    block = Workload.block

    @property
    def flops(self) -> float:
        """FLOPs of one matmul."""
        return 2.0 * self.size**3


def host_line(device: str) -> str:
    """The machine in one line: the CPU's model and matmul features, or the accelerator's name."""
    if device != "cpu":
        module = torch.get_device_module(device)
        name = module.get_device_name() if hasattr(module, "get_device_name") else device
        return f"{name}, torch {torch.__version__}"
    model, flags = "CPU", set()
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        model, flags = fields.get("model name", model), set(fields.get("flags", "").split())
    except OSError:
        pass
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16") if f in flags]
    return f"{model} ({' '.join(shown) or 'no AVX2'}), {torch.get_num_threads()} threads, torch {torch.__version__}"


def measure(precision: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Time each workload and the GEMM of ``precision``'s format interleaved; one row per workload."""
    builders = {"dcgan": dcgan, "lm": lm}
    works = {name: builders[name](args.device, precision, args) for name in args.workloads}
    summaries = {name: work.count() for name, work in works.items()}
    dtype = compute_dtype(precision)
    gemm = Gemm(next(iter(works.values())).trainer, dtype, args.gemm_size)
    gemm.block()  # warm-up
    for runner in (*works.values(), gemm):
        runner.size_block(args.block_seconds)
    variants: dict[str, Callable[[], None]] = {name: work.block for name, work in works.items()}
    variants["gemm"] = gemm.block
    samples = interleaved_samples(variants, rounds=args.rounds, warmup=0)
    gemm_rates = [gemm.flops * gemm.steps / s for s in samples["gemm"]]
    rows = []
    for name, work in works.items():
        summary = summaries[name]
        flops = summary.get("flops_per_sample", 0.0) * work.batch
        achieved = [flops * work.steps / s for s in samples[name]]
        peak = summary.get("peak_flops")
        rows.append({
            "precision": precision, "format": FORMATS.get(dtype, str(dtype)), "what": work.what,
            "step_ms": statistics.median(samples[name]) / work.steps * 1e3, "achieved": statistics.median(achieved),
            "peak": peak, "source": summary.get("peak_source", "none"), "peak_line": summary.get("peak"),
            "mfu": statistics.median(achieved) / peak if peak else None, "gemm": statistics.median(gemm_rates),
            "of_gemm": statistics.median(a / g for a, g in zip(achieved, gemm_rates, strict=True)),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, measure every precision, print one table and the peak lines."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="the Trainer's device (default cpu; e.g. cuda)")
    parser.add_argument("--precisions", default="32-true,bf16-mixed", help="comma-separated precision settings")
    parser.add_argument("--workloads", default="dcgan,lm", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--model", default="tiny-32", choices=list(PRESETS), help="DCGAN preset (default tiny-32)")
    parser.add_argument("--batch-size", type=int, default=128, help="DCGAN batch (default 128, the example's)")
    parser.add_argument("--lm-width", type=int, default=128)
    parser.add_argument("--lm-layers", type=int, default=4)
    parser.add_argument("--lm-heads", type=int, default=4)
    parser.add_argument("--lm-context", type=int, default=64)
    parser.add_argument("--lm-batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=0.5, help="target length of one timed block")
    parser.add_argument("--gemm-size", type=int, default=0, help="square GEMM size (default 2048 on a CPU, else 8192)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 0.2 s blocks (a GPU run in well under 60 s)")
    args = parser.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    precisions = [p for p in args.precisions.split(",") if p]
    for w in args.workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    for flag in ("batch_size", "lm_width", "lm_layers", "lm_heads", "lm_context", "lm_batch", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.lm_width % args.lm_heads:
        parser.error("--lm-width must be a multiple of --lm-heads")
    if not args.block_seconds > 0 or args.gemm_size < 0 or not args.workloads or not precisions:
        parser.error("--block-seconds must be positive, --gemm-size at least 0, and a workload and a precision given")
    if args.quick:
        args.rounds, args.block_seconds = min(args.rounds, 3), min(args.block_seconds, 0.2)
    args.gemm_size = args.gemm_size or (2048 if args.device == "cpu" else 8192)

    try:
        rows = [row for precision in precisions for row in measure(precision, args)]
    except devplug.DevplugError as exc:  # an unknown device or a precision it refuses: one line
        print(f"mfu.py: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"MFU two ways on {args.device}: {host_line(args.device)}; {args.rounds} interleaved rounds, "
          f"load average {load:.2f}")
    gemm_head = f"GEMM {args.gemm_size}²"
    print(f"{'precision':<11}{'step':<36}{'ms/step':>9}{'achieved':>15}{'peak':>15}  {'source':<10}{'MFU':>7}"
          f"{gemm_head:>16}{'of GEMM':>9}")
    for r in rows:
        peak = rate(r["peak"]) if r["peak"] else "unknown"
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "-"
        print(f"{r['precision']:<11}{r['what']:<36}{r['step_ms']:>9.2f}{rate(r['achieved']):>15}"
              f"{peak:>15}  {r['source']:<10}{mfu:>7}{rate(r['gemm']):>16}{r['of_gemm'] * 100:>8.1f}%")
    for line in dict.fromkeys(r["peak_line"] for r in rows if r["peak_line"]):
        print(f"peak: {line}")
    print("MFU: achieved over the peak (the datasheet view); of GEMM: achieved over a plain GEMM of the same "
          "format on this device, same rounds (the achievable view)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""devplug vs a raw PyTorch loop, Lightning Fabric and HF Accelerate: the same step, side by side.

Two workloads, each written once against a small adapter interface (``_peers.py``) that each framework
implements the way its documentation writes a loop:

- ``mlp``: a 2-layer MLP on a small batch, where the step is short and per-step framework overhead shows;
- ``dcgan``: the example's own DCGAN step (``DCGANStep``: D on real and fake, D step, G step).

Each workload runs in two settings, each in a process of its own (Accelerate's state is process-wide):

- ``same``: identical numerics: fp32, torch's Adam with the same flags, a loader without worker
  processes: the difference to ``raw`` is framework overhead, reported in µs per step;
- ``best``: each framework's best settings for the device (bf16 autocast where the device computes bf16
  natively, fused Adam; devplug's defaults): the speed a user gets.

Within a process the frameworks' variants take turns in interleaved rounds (shuffled each round), and
``raw`` runs twice (``raw`` and ``raw (A/A)``): their ratio is this run's noise floor. Ratios are *paired*:
the median over rounds of (variant's time / raw's time in the same round). A timed call is one epoch of
``--steps`` steps through the framework's loader, ended by a device synchronisation; on the CPU
(``torch.synchronize`` is a no-op there) the clock reads follow the step's last kernel anyway.

Run: python benchmarks/peers.py [--workload mlp,dcgan] [--setting same,best] [--rounds 15] [--device auto]
     [--mlp-steps 200] [--dcgan-steps 4] [--model tiny-32] [--batch-size 64] [--adapters raw,fabric,...]
     python benchmarks/peers.py --scaling [--rounds 5]   # raw vs devplug over batch sizes and model sizes
Peers that cannot be imported (``pip install -e '.[bench]'`` brings Fabric and Accelerate; ``make bench``
installs it) are named and skipped; the others run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _dcgan import PRESETS, DCGANStep
from _peers import AccelerateAdapter, Adapter, DevplugAdapter, FabricAdapter, RawTorch, synchronize
from _timing import interleaved_samples, paired_ratio
from torch import nn
from torch.utils.data import TensorDataset

import devplug

HERE = Path(__file__).resolve().parent
ADAPTERS: dict[str, type[Adapter]] = {"raw": RawTorch, "fabric": FabricAdapter, "accelerate": AccelerateAdapter,
                                      "devplug": DevplugAdapter}
AA = "raw (A/A)"
BEST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class MLPWorkload:
    """A 2-layer MLP classifier (64 → 128 → 10, batch 32): a step of tens of µs of compute."""

    def __init__(self, adapter: Adapter, steps: int, batch_size: int = 32) -> None:
        torch.manual_seed(0)
        self.adapter = adapter
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        self.model = adapter.setup(model, "mlp")
        self.opt = adapter.optimizer("adam", self.model.parameters(), lr=1e-3)
        data = TensorDataset(torch.randn(steps * batch_size, 64), torch.randint(0, 10, (steps * batch_size,)))
        self.loader = adapter.loader(data, batch_size)
        self.criterion = nn.CrossEntropyLoss()

    def epoch(self) -> None:
        """One epoch: every batch through forward, loss, backward, step."""
        adapter, model, opt, criterion = self.adapter, self.model, self.opt, self.criterion
        for x, y in adapter.epoch(self.loader):
            with adapter.autocast():
                loss = criterion(model(x), y)
            adapter.backward(loss)
            adapter.step(opt)


class DCGANWorkload:
    """The example's own DCGAN step (``DCGANStep`` from ``examples/dcgan.py``) on in-memory images, any adapter."""

    def __init__(self, adapter: Adapter, steps: int, batch_size: int, model: str) -> None:
        torch.manual_seed(0)
        self.adapter = adapter
        self.step = DCGANStep(adapter, PRESETS[model])  # type: ignore[arg-type]  # the adapter reads like a Trainer
        size = self.step.spec.image_size
        images = torch.rand(steps * batch_size, 3, size, size) * 2 - 1
        self.loader = adapter.loader(TensorDataset(images, torch.zeros(steps * batch_size)), batch_size)

    def epoch(self) -> None:
        """One epoch of DCGAN iterations."""
        for real, _ in self.adapter.epoch(self.loader):
            self.step(real)


def build(name: str, args: argparse.Namespace, device: torch.device, best_dtype: torch.dtype | None) -> Any:
    """The workload ``args.workload`` driven by adapter ``name`` (its constructor may raise ImportError)."""
    adapter = ADAPTERS[name](device, args.setting, best_dtype)
    if args.workload == "mlp":
        return adapter, MLPWorkload(adapter, args.mlp_steps)
    return adapter, DCGANWorkload(adapter, args.dcgan_steps, args.batch_size, args.model)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Time one workload in one setting, every importable framework interleaved; the results as a dict."""
    probe = devplug.Trainer(device=args.device, precision=args.best_precision, progress=False, stop_signals=())
    device, best_dtype = probe.torch_device, BEST_DTYPES.get(probe.precision.name)
    probe.close()
    variants: dict[str, Callable[[], None]] = {}
    adapters: dict[str, Adapter] = {}
    missing: dict[str, str] = {}
    for name in args.adapters.split(","):
        try:
            adapter, workload = build(name, args, device, best_dtype)
        except ImportError as exc:
            missing[name] = f"not installed ({exc.name or exc}); pip install -e '.[bench]'"
            continue
        adapters[name] = adapter

        def call(workload: Any = workload) -> None:
            workload.epoch()
            synchronize(device)

        variants[name] = call
        if name == "raw":
            _, aa_workload = build(name, args, device, best_dtype)
            variants[AA] = lambda w=aa_workload: (w.epoch(), synchronize(device))
    steps = args.mlp_steps if args.workload == "mlp" else args.dcgan_steps
    samples = interleaved_samples(variants, rounds=args.rounds, warmup=2)
    result = {
        "workload": args.workload, "setting": args.setting, "device": str(device), "steps": steps,
        "rounds": args.rounds, "missing": missing,
        "described": {name: adapter.describe() for name, adapter in adapters.items()},
        "us_per_step": {name: statistics.median(s) / steps * 1e6 for name, s in samples.items()},
        "vs_raw": {name: paired_ratio(samples, name, "raw") for name in samples},
    }
    for adapter in adapters.values():
        adapter.close()
    return result


def print_table(result: dict[str, Any]) -> None:
    """One workload/setting: µs per step, paired time ratio to raw, the overhead per step in µs."""
    raw = result["us_per_step"]["raw"]
    print(f"\n{result['workload']} · {result['setting']} · {result['device']} · {result['steps']} steps per timed "
          f"epoch · {result['rounds']} rounds")
    print(f"{'variant':<12} {'µs/step':>11} {'time / raw':>11} {'overhead µs/step':>17}   runs")
    for name, us in result["us_per_step"].items():
        ratio = result["vs_raw"][name]
        described = result["described"].get(name, "the same as raw") if name != AA else "raw again (noise floor)"
        print(f"{name:<12} {us:>11.1f} {ratio:>11.4f} {(ratio - 1) * raw:>+17.1f}   {described}")
    for name, why in result["missing"].items():
        print(f"{name:<12} skipped: {why}")


def main() -> int:
    """Run each workload × setting in its own process (or, with --one, this one) and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mlp,dcgan", help="mlp, dcgan, or both comma-separated")
    parser.add_argument("--setting", default="same,best", help="same (identical numerics), best, or both")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (paired medians)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--best-precision", default="auto",
                        help="precision of the best setting (default: what devplug's plugin picks for the device)")
    parser.add_argument("--mlp-steps", type=int, default=200, help="MLP steps per timed epoch")
    parser.add_argument("--dcgan-steps", type=int, default=4, help="DCGAN steps per timed epoch")
    parser.add_argument("--model", default="tiny-32", help="DCGAN model preset (tiny-32, naive-64, safe-64)")
    parser.add_argument("--batch-size", type=int, default=64, help="DCGAN batch size")
    parser.add_argument("--adapters", default=",".join(ADAPTERS), help="which of raw, fabric, accelerate, devplug")
    parser.add_argument("--scaling", action="store_true",
                        help="instead: raw vs devplug on the DCGAN step over batch sizes 8-256 (tiny-32) and model "
                             "sizes tiny-32 to safe-64 (batch 16), fp32 identical numerics, one table")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # run one workload/setting here
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return 0
    results = scaling(args) if args.scaling else compare(args)
    if results is None:
        return 1
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def run_child(args: argparse.Namespace, **changes: Any) -> dict[str, Any] | None:
    """``run_one`` in a fresh process with ``changes`` over ``args``; None (and the error printed) on failure."""
    values = {**vars(args), **changes}
    command = [sys.executable, __file__, "--one"]
    for flag in ("workload", "setting", "adapters", "rounds", "device", "best_precision", "mlp_steps", "dcgan_steps",
                 "model", "batch_size"):
        command += [f"--{flag.replace('_', '-')}", str(values[flag])]
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
    if done.returncode != 0:
        print(f"{' '.join(command[2:])} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Every workload × setting, one process each, a table each."""
    results = []
    for workload in args.workload.split(","):
        for setting in args.setting.split(","):
            result = run_child(args, workload=workload, setting=setting)
            if result is None:
                return None
            results.append(result)
            print_table(result)
    return results


#: (model, batch size) pairs of the scaling table: batch sizes on the smallest model, then model sizes.
SCALING = [("tiny-32", 8), ("tiny-32", 32), ("tiny-32", 64), ("tiny-32", 128), ("tiny-32", 256),
           ("naive-64", 16), ("safe-64", 16)]


def scaling(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Raw vs devplug (identical numerics) over batch and model sizes: how the overhead ratio moves with the work."""
    print(f"DCGAN step, raw PyTorch vs devplug, fp32 and the same Adam (setting 'same'), {args.rounds} rounds each")
    print(f"{'model':<10} {'batch':>5} {'steps/block':>11} {'raw ms/step':>12} {'devplug ms/step':>16} "
          f"{'devplug/raw':>12} {'A/A':>7} {'overhead µs/step':>17}", flush=True)
    results = []
    for model, batch in SCALING:
        steps = max(2, 512 // batch) if model == "tiny-32" else 1
        result = run_child(args, workload="dcgan", setting="same", adapters="raw,devplug", model=model,
                           batch_size=batch, dcgan_steps=steps)
        if result is None:
            return None
        results.append(result)
        us, ratio = result["us_per_step"], result["vs_raw"]
        print(f"{model:<10} {batch:>5} {steps:>11} {us['raw'] / 1e3:>12.2f} {us['devplug'] / 1e3:>16.2f} "
              f"{ratio['devplug']:>12.4f} {ratio[AA]:>7.4f} {(ratio['devplug'] - 1) * us['raw']:>+17.1f}", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())

"""Where each framework's time per step goes: the peers' step under torch.profiler and cProfile, side by side.

``peers.py`` says how much each framework adds per step; this says where. For each adapter (raw, Fabric,
Accelerate, devplug) it builds the same workload as ``peers.py`` (``--workload mlp|dcgan``, ``--setting
same|best``), runs two warm-up epochs, then one epoch under ``torch.profiler`` (CPU and, on a GPU, CUDA
activity) and one under ``cProfile``, and prints per step:

- host time (wall clock of the profiled-free epoch that follows, divided by its steps);
- Python function calls (cProfile's count) and the five functions with the most own time;
- device runtime calls (``cuda*``/``hip*`` runtime events: launches, copies; the most frequent by name) and
  synchronisations
  (``*Synchronize`` events, plus ``aten::item``/``aten::_local_scalar_dense``, which stall the host);
- the ten operators with the most own CPU time.

Run: python benchmarks/profile_step.py [--device auto] [--workload mlp] [--setting same] [--steps 50]
     [--adapters raw,fabric,accelerate,devplug] [--out DIR]   # DIR gets one Chrome trace per adapter
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _peers import synchronize  # noqa: E402
from peers import BEST_DTYPES, build  # noqa: E402

import devplug  # noqa: E402


def _runtime_counts(prof: profile) -> tuple[Counter[str], int]:
    """(device runtime calls by name, synchronising calls) among the profiled events."""
    calls: Counter[str] = Counter()
    syncs = 0
    for event in prof.events():
        name = event.name
        if name.startswith(("cuda", "hip")) and not name.startswith("cudaGetDevice"):
            calls[name] += 1
            if "Synchronize" in name:
                syncs += 1
        elif name in ("aten::_local_scalar_dense",):
            syncs += 1
    return calls, syncs


def profile_adapter(name: str, args: argparse.Namespace, device: torch.device, best_dtype: Any) -> dict[str, Any]:
    """Profile one adapter's epoch of the workload; a dict of per-step figures and two text tables."""
    adapter, workload = build(name, args, device, best_dtype)
    steps = args.mlp_steps if args.workload == "mlp" else args.dcgan_steps
    for _ in range(2):
        workload.epoch()
    synchronize(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        workload.epoch()
        synchronize(device)
    calls, syncs = _runtime_counts(prof)
    ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    if args.out:
        prof.export_chrome_trace(str(Path(args.out) / f"trace-{args.workload}-{name}.json"))
    profiler = cProfile.Profile()
    profiler.enable()
    workload.epoch()
    synchronize(device)
    profiler.disable()
    stats = pstats.Stats(profiler)
    python_calls = stats.total_calls  # type: ignore[attr-defined]
    top = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:5]  # type: ignore[attr-defined]
    top_lines = [f"    {tt * 1e6 / steps:8.1f} µs/step  {nc / steps:6.1f} calls/step  {Path(f).name}:{line} {fn}"
                 for (f, line, fn), (_, nc, tt, _, _) in top]
    started = time.perf_counter()
    workload.epoch()
    synchronize(device)
    host = (time.perf_counter() - started) / steps
    adapter.close()
    by_name = ", ".join(f"{call} {count / steps:.1f}" for call, count in calls.most_common(6))
    return {"name": name, "us_per_step": host * 1e6, "python_calls": python_calls / steps,
            "runtime_calls": sum(calls.values()) / steps, "runtime_by_name": by_name, "syncs": syncs / steps,
            "top": top_lines, "ops": ops}


def main() -> int:
    """Profile each importable adapter in turn and print the per-step figures, then the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workload", default="mlp", choices=["mlp", "dcgan"])
    parser.add_argument("--setting", default="same", choices=["same", "best"])
    parser.add_argument("--steps", type=int, default=50, help="steps per profiled epoch")
    parser.add_argument("--model", default="tiny-32", help="DCGAN preset")
    parser.add_argument("--batch-size", type=int, default=64, help="DCGAN batch size")
    parser.add_argument("--adapters", default="raw,fabric,accelerate,devplug")
    parser.add_argument("--out", default="", help="folder for one Chrome trace per adapter")
    args = parser.parse_args()
    args.mlp_steps = args.dcgan_steps = args.steps
    probe = devplug.Trainer(device=args.device, progress=False, stop_signals=())
    device, best_dtype = probe.torch_device, BEST_DTYPES.get(probe.precision.name)
    probe.close()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.adapters.split(","):
        try:
            results.append(profile_adapter(name, args, device, best_dtype))
        except ImportError as exc:
            print(f"{name}: skipped, not installed ({exc.name or exc})")
    print(f"\n{args.workload} · {args.setting} · {device} · {args.steps} steps · torch {torch.__version__}")
    print(f"{'adapter':<11} {'host µs/step':>13} {'Python calls':>13} {'runtime calls':>14} {'syncs':>7}   (per step)")
    for r in results:
        print(f"{r['name']:<11} {r['us_per_step']:>13.1f} {r['python_calls']:>13.1f} {r['runtime_calls']:>14.1f} "
              f"{r['syncs']:>7.2f}")
    for r in results:
        print(f"\n== {r['name']}: device runtime calls per step by name: {r['runtime_by_name'] or 'none'}")
        print(f"== {r['name']}: functions with the most own time (cProfile)")
        print("\n".join(r["top"]))
        print(f"== {r['name']}: operators with the most own CPU time (torch.profiler, one epoch)")
        print(r["ops"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

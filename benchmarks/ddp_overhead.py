"""DDP communication overhead: the same step with and without the gradient all-reduce, side by side.

A common way to measure communication overhead is to switch DDP's communication off (a ``--noddp`` run)
and compare with the normal run on synthetic data. Here every rank runs, interleaved in one job:

- ``sync``: the normal DDP step (forward, backward with bucketed all-reduce overlapped, optimizer);
- ``no_sync``: the same step inside ``trainer.no_sync(model)``, so DDP skips the all-reduce: compute only;
- ``local``: the unwrapped module (no DDP hooks at all), for reference.

Data is one cached synthetic batch per rank (SYNTHETIC in the IO / SYNTHETIC / FULL method: compute on
cached data), so input loading does not count. Each block of steps starts after a barrier (outside the
timing); a rank's time for a block ends after its device is synchronised; the reported time of a block is
the slowest rank's. Ratios are medians over interleaved rounds, never absolute claims.

Run: python benchmarks/ddp_overhead.py [--world-size 2] [--steps 20] [--rounds 5] [--width 1024]
     [--layers 4] [--batch-size 64] [--bucket-cap-mb 25] [--device cpu]
On CPU the ranks use gloo over loopback; with --device cuda/hpu, launch one rank per device instead
(torchrun --nproc-per-node N benchmarks/ddp_overhead.py --device cuda) and --world-size is ignored.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from _ranks import join_as, run_ranks

import devplug

MODES = ("sync", "no_sync", "local")


def build_model(width: int, layers: int) -> torch.nn.Module:
    """An MLP whose gradients are large enough for communication to matter (``layers`` × width²)."""
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))


def run_rank(rank: int, world_size: int, port: int | None, args: argparse.Namespace) -> None:
    """One rank: time interleaved blocks of each mode; rank 0 prints the table.

    ``port`` is the rendezvous port of spawned ranks; ``None`` when a launcher set the variables.
    """
    join_as(rank, world_size, port)
    torch.set_num_threads(args.threads)
    options: dict[str, Any] = {"bucket_cap_mb": args.bucket_cap_mb} if args.bucket_cap_mb else {}
    trainer = devplug.Trainer(device=args.device, precision="32-true", seed=0, progress=False, log_every=10**9,
                              **options)
    if not trainer.launch.distributed:
        raise SystemExit("ddp_overhead needs at least 2 ranks (--world-size 2, or launch it with torchrun)")
    model = trainer.setup(build_model(args.width, args.layers), name="mlp")
    local = model.module  # the module DistributedDataParallel wraps
    opt = trainer.optimizer("sgd", model.parameters(), lr=1e-3, momentum=0.9)
    x = trainer.to_device(torch.randn(args.batch_size, args.width))
    y = trainer.to_device(torch.randint(0, 10, (args.batch_size,)))

    def step(module: torch.nn.Module) -> None:
        with trainer.autocast():
            loss = torch.nn.functional.cross_entropy(module(x), y)
        trainer.backward(loss)
        trainer.step(opt)

    def block(mode: str) -> float:
        dist.barrier()
        trainer.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            if mode == "sync":
                step(model)
            elif mode == "no_sync":
                with trainer.no_sync(model):
                    step(model)
            else:
                step(local)
        trainer.synchronize()
        return (time.perf_counter() - start) / args.steps

    for mode in MODES:  # warm-up: allocator, DDP bucket rebuild on the first synced step
        block(mode)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            times[mode].append(block(mode))
    gathered: list[Any] = [None] * trainer.world_size
    dist.all_gather_object(gathered, times)
    if trainer.is_main_process:
        slowest = {m: [max(rank_times[m][i] for rank_times in gathered) for i in range(args.rounds)] for m in MODES}
        print(report(trainer, local, args, {m: statistics.median(v) for m, v in slowest.items()}))
    trainer.close()
    dist.destroy_process_group()


def report(trainer: devplug.Trainer, local: torch.nn.Module, args: argparse.Namespace,
           median: dict[str, float]) -> str:
    """The side-by-side table and the overhead ratios."""
    params = sum(p.numel() for p in local.parameters())
    bucket = f"{args.bucket_cap_mb} MiB" if args.bucket_cap_mb else "DDP default (25 MiB)"
    lines = [
        f"DDP communication overhead: {trainer.world_size} ranks on {trainer.device} "
        f"({dist.get_backend()}), MLP {args.layers}x{args.width} "
        f"({params / 1e6:.1f} M parameters, {params * 4 / 2**20:.0f} MiB of fp32 gradients), "
        f"batch {args.batch_size}/rank, bucket {bucket}, {args.steps} steps x {args.rounds} interleaved rounds",
        f"{'mode':<10} {'median ms/step':>15} {'samples/s (all ranks)':>22} {'time vs no_sync':>16}",
    ]
    for mode in MODES:
        per_step = median[mode]
        lines.append(f"{mode:<10} {per_step * 1e3:>15.2f} {args.batch_size * trainer.world_size / per_step:>22.0f} "
                     f"{per_step / median['no_sync']:>15.2f}x")
    ratio = median["sync"] / median["no_sync"]
    share = 1 - median["no_sync"] / median["sync"]
    lines.append(f"sync/no_sync = {ratio:.2f}x: gradient all-reduce adds {ratio - 1:.0%} to the compute-only step "
                 f"({share:.0%} of the synced step is communication not hidden behind backward)")
    return "\n".join(lines)



def main() -> None:
    """Spawn the gloo ranks (or run as one rank of a torchrun job) and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--bucket-cap-mb", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    args = parser.parse_args()
    run_ranks(run_rank, args, parser)


if __name__ == "__main__":
    main()

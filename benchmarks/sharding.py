"""Sharded (FSDP) against replicated (DDP) training, and a blocking against an asynchronous sharded save.

Every rank runs, interleaved in one job:

- ``ddp`` and ``fsdp``: the same MLP step (forward, backward, AdamW) under ``Trainer(strategy="ddp")`` and
  ``Trainer(strategy="fsdp")``; each block of steps starts after a barrier, ends after the device is
  synchronised, and counts as the slowest rank's time. Per-rank memory is the bytes of the parameters,
  gradients and optimizer state each rank holds (its local shards under FSDP), read from the tensors.
- ``save`` and ``async save``: how long the loop stands still for ``trainer.save(path)`` against
  ``trainer.save(path, async_save=True)`` under FSDP (the async write is waited for by a ``load`` of the
  same checkpoint before the next round, outside the timing).

Ratios are medians over the interleaved rounds, with the two DDP halves of each round compared as an
A/A noise floor. On the CPU the ranks use gloo over loopback.

Run: python benchmarks/sharding.py [--world-size 2] [--steps 10] [--rounds 5] [--width 1024] [--layers 4]
     [--batch-size 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _ranks import join_as, run_ranks

import devplug


def build_model(width: int, layers: int) -> torch.nn.Module:
    """An MLP of ``layers`` width×width blocks (each a sharding unit under FSDP)."""
    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))


def local_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the parameters, gradients and optimizer state this rank holds (local shards of DTensors)."""

    def size(tensor: Any) -> int:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return int(local.numel() * local.element_size()) if isinstance(local, torch.Tensor) else 0

    total = sum(size(p) + (size(p.grad) if p.grad is not None else 0) for p in model.parameters())
    return total + sum(size(v) for state in optimizer.state.values() for v in state.values())


class Variant:
    """One strategy's trainer, model, optimizer and a cached batch."""

    def __init__(self, strategy: str, args: argparse.Namespace) -> None:
        self.trainer = devplug.Trainer(device=args.device, precision="32-true", strategy=strategy, seed=0,
                                       progress=False, stop_signals=(), count_flops=False, log_every=10**9)
        self.model = self.trainer.setup(build_model(args.width, args.layers), name="mlp",
                                        **({"shard": [torch.nn.Linear]} if strategy == "fsdp" else {}))
        self.optimizer = self.trainer.optimizer("adamw", self.model.parameters(), lr=1e-4)
        self.x = self.trainer.to_device(torch.randn(args.batch_size, args.width))
        self.y = self.trainer.to_device(torch.randint(0, 10, (args.batch_size,)))

    def steps(self, count: int) -> float:
        """Seconds per step over ``count`` steps, the clock started after a barrier."""
        dist.barrier()
        self.trainer.synchronize()
        start = time.perf_counter()
        for _ in range(count):
            with self.trainer.autocast():
                loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
            self.trainer.backward(loss)
            self.trainer.step(self.optimizer)
        self.trainer.synchronize()
        return (time.perf_counter() - start) / count


def run_rank(rank: int, world_size: int, port: int | None, args: argparse.Namespace) -> None:
    """One rank: interleaved rounds of DDP, FSDP and the two saves; rank 0 prints the table."""
    join_as(rank, world_size, port)
    torch.set_num_threads(args.threads)
    ddp, fsdp = Variant("ddp", args), Variant("fsdp", args)
    for variant in (ddp, fsdp):  # warm-up: allocator, first buckets, the shards' first gathers
        variant.steps(2)
    memory = {"ddp": local_bytes(ddp.model, ddp.optimizer), "fsdp": local_bytes(fsdp.model, fsdp.optimizer)}
    times: dict[str, list[float]] = {"ddp": [], "ddp (A/A)": [], "fsdp": [], "save": [], "async save": []}
    folder = Path(args.out or tempfile.mkdtemp(prefix="devplug-sharding-")) if rank == 0 else None
    shared = [str(folder) if folder is not None else None]
    dist.broadcast_object_list(shared, src=0)
    target = Path(shared[0] or ".") / "checkpoint"
    for _ in range(args.rounds):
        times["ddp"].append(ddp.steps(args.steps))
        times["fsdp"].append(fsdp.steps(args.steps))
        times["ddp (A/A)"].append(ddp.steps(args.steps))
        for name, asynchronous in (("save", False), ("async save", True)):
            dist.barrier()
            start = time.perf_counter()
            fsdp.trainer.save(target, async_save=asynchronous)
            times[name].append(time.perf_counter() - start)
        fsdp.trainer.load(target)  # waits for the async write, outside the timing; the state is the one saved
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, times)
    if rank == 0:
        slowest = {k: [max(r[k][i] for r in gathered) for i in range(args.rounds)] for k in times}
        print(report(slowest, memory, args, world_size))
    for variant in (ddp, fsdp):
        variant.trainer.close()
    dist.destroy_process_group()


def report(slowest: dict[str, list[float]], memory: dict[str, int], args: argparse.Namespace,
           world_size: int) -> str:
    """The side-by-side table: median times, their ratios, and the per-rank bytes."""
    median = {k: statistics.median(v) for k, v in slowest.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(slowest[a], slowest[b], strict=True))

    params = sum(p.numel() for p in build_model(args.width, args.layers).parameters())
    return "\n".join([
        f"sharding: {world_size} ranks on {args.device}, MLP {args.layers}x{args.width} ({params / 1e6:.1f} M "
        f"parameters), AdamW fp32, batch {args.batch_size}/rank, {args.steps} steps x {args.rounds} "
        "interleaved rounds (slowest rank)",
        f"{'variant':<12} {'median':>12} {'vs ddp':>8}",
        f"{'ddp':<12} {median['ddp'] * 1e3:>9.2f} ms {1.0:>8.3f}",
        f"{'ddp (A/A)':<12} {median['ddp (A/A)'] * 1e3:>9.2f} ms {paired('ddp (A/A)', 'ddp'):>8.3f}",
        f"{'fsdp':<12} {median['fsdp'] * 1e3:>9.2f} ms {paired('fsdp', 'ddp'):>8.3f}",
        f"per-rank parameters + gradients + AdamW state: ddp {memory['ddp'] / 2**20:.1f} MiB, fsdp "
        f"{memory['fsdp'] / 2**20:.1f} MiB ({memory['fsdp'] / memory['ddp']:.3f} of ddp)",
        f"sharded save, the loop's stall: blocking {median['save'] * 1e3:.1f} ms, async "
        f"{median['async save'] * 1e3:.1f} ms ({paired('async save', 'save'):.3f} of blocking)",
    ])



def main() -> None:
    """Spawn the gloo ranks (or run as one rank of a torchrun job) and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--out", default=None, help="folder for the checkpoints (default: a temporary one)")
    args = parser.parse_args()
    run_ranks(run_rank, args, parser)


if __name__ == "__main__":
    main()

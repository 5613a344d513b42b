"""What the manifest of a sharded checkpoint costs against the save and the load it is part of.

One process shards an MLP over a group of one (``Trainer(strategy="fsdp")``). In each round, in
alternating order: ``trainer.save(path)`` (twice: the second is the A/A noise floor), ``trainer.load(path)``,
and the manifest's own work on that folder: every file read and hashed with SHA-256, as a save does once
the shards are written and a load does before it reads anything. Medians over the rounds; the manifest's
share of a save and of a load is its time over theirs (both timings include it). The page cache is warm
(the files were just written), as on a save followed by a resume.

Run: python benchmarks/sharded_digests.py [--width 1024] [--layers 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import devplug


def build(width: int, layers: int) -> tuple[devplug.Trainer, torch.nn.Module]:
    """A sharded MLP with AdamW moments (one step taken), on a group of one."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(layers)]
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, strategy="fsdp", seed=0)
    model = trainer.setup(torch.nn.Sequential(*blocks), name="mlp", shard=[torch.nn.Sequential])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-3)
    trainer.backward(model(torch.randn(8, width)).pow(2).mean())
    trainer.step(opt)
    return trainer, model


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def hash_folder(folder: Path) -> int:
    """Read and hash every file of ``folder`` as the manifest does; the bytes hashed."""
    total = 0
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != "manifest.json":
            hasher = hashlib.sha256()
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    hasher.update(chunk)
                    total += len(chunk)
            hasher.hexdigest()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    trainer, _model = build(args.width, args.layers)
    folder = Path(tempfile.mkdtemp(prefix="devplug-digests-"))
    times: dict[str, list[float]] = {k: [] for k in ("save", "save A/A", "load", "manifest")}
    actions: dict[str, Callable[[], object]] = {
        "save": lambda: trainer.save(folder / "ckpt"), "save A/A": lambda: trainer.save(folder / "ckpt"),
        "load": lambda: trainer.load(folder / "ckpt"), "manifest": lambda: hash_folder(folder / "ckpt")}
    try:
        trainer.save(folder / "ckpt")
        size = hash_folder(folder / "ckpt")
        for n in range(args.rounds):
            for kind in (list(actions) if n % 2 == 0 else list(reversed(actions))):
                times[kind].append(timed(actions[kind]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    noise = statistics.median(a / b for a, b in zip(times["save A/A"], times["save"], strict=True))
    print(f"checkpoint: {size / 2**20:.1f} MiB in {args.rounds} rounds; manifest (read + SHA-256 of every file) "
          f"{median['manifest'] * 1e3:.0f} ms = {size / median['manifest'] / 2**20:.0f} MiB/s")
    for what in ("save", "load"):
        share = statistics.median(m / t for m, t in zip(times["manifest"], times[what], strict=True))
        print(f"{what}: {median[what] * 1e3:.0f} ms, of which the manifest {share:.0%} "
              f"(without it: {1 / (1 - share):.2f}x faster at most); A/A noise floor {noise:.2f}x")


if __name__ == "__main__":
    main()

"""What a host sync per step costs: `loss.item()` every step vs devplug's `trainer.log()` (read every 50).

On a CPU the "device" is the host, so the difference is small here; on CUDA and lazy-mode Gaudi a
per-step `.item()` stalls the host until the device drains, which is why
performance guides advise printing quantities less often. Run with --device to compare.

Run: python benchmarks/sync_free_logging.py [--device cpu] [--steps 100]
"""

from __future__ import annotations

import argparse

import torch
from _timing import interleaved, report

import devplug


def main() -> None:
    """Train a small MLP both ways, interleaved, and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    trainer = devplug.Trainer(device=args.device, precision="32-true", progress=False, log_every=50)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)))
    opt = trainer.optimizer("adam", model.parameters(), lr=1e-3)
    x = trainer.to_device(torch.randn(256, 512))
    y = trainer.to_device(torch.randint(0, 10, (256,)))

    def step() -> torch.Tensor:
        with trainer.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        trainer.backward(loss)
        trainer.step(opt)
        return loss

    def item_every_step() -> None:
        for _ in range(args.steps):
            step().item()
        trainer.synchronize()

    def trainer_log() -> None:
        for _ in range(args.steps):
            trainer.global_step += 1
            trainer.log(loss=step())
        trainer.synchronize()

    medians = interleaved({"loss.item() every step": item_every_step, "trainer.log (every 50)": trainer_log})
    print(report(f"{args.steps} steps on {trainer.device}", medians, "loss.item() every step"))


if __name__ == "__main__":
    main()

"""Ranks of a tensor-parallel job: what they report as samples/s (tests/core/observe/test_throughput_meter.py).

Every rank of a tensor-parallel group reads the same batches, so the job's samples/s is one rank's rate times
the data-parallel groups, not times the processes, and one device does its share of a sample's FLOPs. Prints one
JSON line per rank: the summary's samples/s over this rank's own mean rate, each log point's samples/s over this
rank's rate between log points, the FLOPs counted per sample, the share of them one device is credited with at
this rank's rate, and MFU over achieved FLOP/s (the peak given is 1e12).
"""

from __future__ import annotations

import json
import sys

import torch

import devplug


def main() -> None:
    strategy = sys.argv[1]
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[], log_every=2,
                              strategy=strategy, stop_signals=(), peak_flops=1e12)
    torch.manual_seed(0)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)),
                          **({"tp_plan": {"0": "colwise", "2": "rowwise"}} if strategy == "tp" else {}))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(64, 6)), batch_size=4, num_workers=0)
    laps: list[float] = []
    meter = trainer.throughput
    lap = meter.lap
    meter.lap = lambda: laps.append(lap()) or laps[-1]  # type: ignore[method-assign]
    logged = []
    for _ in trainer.epochs(1, max_steps=6):
        for (x,) in loader:
            trainer.backward(model(x).square().mean())
            trainer.step(opt)
            point = trainer.log(loss=0.0)
            if point is not None:
                logged.append(point["samples_per_sec"] / laps[-1])
    summary = trainer.summary()
    trainer.close()
    print(json.dumps({"summary": summary["samples_per_sec"] / meter.mean_rate, "logged": logged,
                      "flops_per_sample": summary["flops_per_sample"],
                      "device_share": summary["achieved_flops"] / (summary["flops_per_sample"] * meter.mean_rate),
                      "mfu": summary["mfu"] * 1e12 / summary["achieved_flops"]}), flush=True)


if __name__ == "__main__":
    main()

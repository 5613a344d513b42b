"""Does the CPU plugin's optimizer choice pay? torch Adam: default (for-loop) vs foreach vs fused.

Run: python benchmarks/cpu_optimizers.py [--params-m 20] [--tensors 200]
"""

from __future__ import annotations

import argparse

import torch
from _timing import interleaved, report


def main() -> None:
    """Time 10 optimizer steps of each implementation over the same parameter set."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params-m", type=float, default=20, help="parameters in millions")
    parser.add_argument("--tensors", type=int, default=200, help="number of parameter tensors")
    args = parser.parse_args()
    torch.manual_seed(0)
    per = int(args.params_m * 1e6 / args.tensors)
    variants = {}
    for label, kwargs in {
        "Adam (for-loop)": {"foreach": False},
        "Adam (foreach)": {"foreach": True},
        "Adam (fused=True)  <- devplug cpu": {"fused": True},
    }.items():
        params = [torch.nn.Parameter(torch.randn(per)) for _ in range(args.tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.Adam(params, lr=1e-3, **kwargs)

        def run(opt=opt) -> None:
            for _ in range(10):
                opt.step()

        variants[label] = run
    medians = interleaved(variants, rounds=5)
    print(report(f"10 Adam steps, {args.params_m:g}M parameters in {args.tensors} tensors, "
                 f"{torch.get_num_threads()} threads", medians, "Adam (for-loop)"))


if __name__ == "__main__":
    main()

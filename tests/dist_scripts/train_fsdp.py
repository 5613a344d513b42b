"""Two ranks under a torchrun-like launch: DDP and FSDP train the same model on the same data, and resume.

Run by tests/distributed/test_fsdp.py through ``common.run_ranks``. In one process group, one Trainer after another:

1. ``ddp``: strategy="ddp", STEPS steps, a plain checkpoint after step 3;
2. ``fsdp``: strategy="fsdp" (each Block a unit), STEPS steps, a sharded checkpoint after step 3 and an
   asynchronous one after the last step;
3. ``fsdp_resume``: strategy="fsdp" with activation checkpointing, resumed from the sharded checkpoint;
4. ``fsdp_from_ddp``: strategy="fsdp", resumed from DDP's plain checkpoint.

Each phase records its global-batch losses, the bytes this rank holds for parameters, gradients and
optimizer state, and its full weights.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from fsdp_model import ADAMW, STEPS, Block, full_weights, lm_loss, local_bytes, make_lm, rank_batch

import devplug

SAVE_AFTER = 3


def train_step(trainer: devplug.Trainer, model: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor,
               after_backward: Callable[[], None] | None = None) -> tuple[float, float]:
    """One training step on this rank's ``tokens`` (every run here trains with it); the global-batch loss and the
    gradient norm before clipping. ``after_backward`` looks at the gradients before they are clipped."""
    with trainer.accumulate(model):
        loss = lm_loss(model, tokens)
        trainer.backward(loss)
        if after_backward is not None:
            after_backward()
        norm = float(trainer.clip_grad_norm(opt, 1.0))
        trainer.step(opt)
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return float(mean) / trainer.world_size, norm


def run(strategy: str, out: Path, *, save: str | None = None, resume: str | None = None, asynchronous: bool = False,
        recompute: bool = False) -> dict:
    """Train (or resume and finish) one run; what it recorded."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, strategy=strategy)
    options = {"shard": [Block]} if strategy == "fsdp" else {}
    if recompute:
        options["activation_checkpointing"] = [Block]
    model = trainer.setup(make_lm(0), name="lm", **options)
    opt = trainer.optimizer("adamw", model.parameters(), **ADAMW)
    first, record = 0, {"losses": {}, "implementation": trainer.optimizer_implementation(opt)}
    if resume:
        first = trainer.load(out / resume)["step"]
        record["loaded"] = full_weights(trainer._modules["lm"])

    def measure() -> None:  # after the last step's backward: the bytes this rank holds for weights and gradients
        record["param_bytes"] = local_bytes(model.parameters())
        record["grad_bytes"] = local_bytes(p.grad for p in model.parameters() if p.grad is not None)

    for step in range(first, STEPS):
        tokens = rank_batch(step, trainer.rank, trainer.world_size)
        loss, norm = train_step(trainer, model, opt, tokens, after_backward=measure if step == STEPS - 1 else None)
        record.setdefault("norms", []).append(norm)
        record["losses"][step] = loss
        if save and step + 1 == SAVE_AFTER:
            trainer.save(out / save, step=step + 1)
    record["state_bytes"] = local_bytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    record["final"] = full_weights(trainer._modules["lm"])
    if asynchronous:
        trainer.save(out / f"{strategy}_end", async_save=True, step=STEPS)
    trainer.close()
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = {
        "ddp": run("ddp", args.out, save="ddp3.pt"),
        "fsdp": run("fsdp", args.out, save="fsdp3", asynchronous=True),
        "fsdp_resume": run("fsdp", args.out, resume="fsdp3", recompute=True),
        "fsdp_from_ddp": run("fsdp", args.out, resume="ddp3.pt"),
    }
    torch.save(results, args.out / f"rank{os.environ['RANK']}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

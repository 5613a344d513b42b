"""Tensor parallel (and FSDP × tensor parallel) ranks training the LM example's network, saving and resuming.

Run by tests/distributed/test_tensor_parallel.py through ``common.run_ranks``: ``--strategy tp|fsdp+tp --tp N``
trains ``--steps`` steps with gradient clipping and two-micro-batch accumulation, saves a sharded checkpoint
after ``--save-after`` steps, and records the global-batch losses, gradient norms and full weights; with
``--resume`` it loads a checkpoint first (any strategy's) and finishes the run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # run as a script: the LM example
import devplug

from lm.models import Block, LanguageModel, ModelSpec

SPEC = ModelSpec(width=64, layers=2, heads=4, context=16)
BATCH = 8
ADAMW = {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-4}


def make_model() -> LanguageModel:
    """The network, its weights drawn from seed 0."""
    torch.manual_seed(0)
    return LanguageModel(SPEC)


def batch(step: int, part: int = 0, parts: int = 1) -> torch.Tensor:
    """Share ``part`` of ``parts`` of global batch ``step`` (BATCH sequences of context + 1 bytes)."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, 256, (BATCH, SPEC.context + 1), generator=g)
    per = BATCH // parts
    return tokens[part * per:(part + 1) * per]


def loss_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-byte cross-entropy averaged over the positions."""
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))


def train(trainer: devplug.Trainer, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range,
          part: int, parts: int, save=None) -> dict:
    """Each step two micro-batches (accumulated), clipping at 1.0; the global losses and norms per step."""
    losses, norms = {}, {}
    for step in steps:
        tokens = batch(step, part, parts)
        total = torch.zeros(())
        for half in tokens.chunk(2):
            with trainer.accumulate(model):
                loss = loss_of(model, half) / 2
                trainer.backward(loss)
                total += loss.detach()
        norms[step] = float(trainer.clip_grad_norm(opt, 1.0))
        trainer.step(opt)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
            total /= dist.get_world_size()  # the ranks of one tensor-parallel group hold the same loss
        losses[step] = float(total)
        if save is not None and step + 1 == save[1]:
            trainer.save(save[0], step=step + 1)
    return {"losses": losses, "norms": norms}


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state as plain tensors (DTensors gathered)."""
    out = {}
    for name, value in module.state_dict().items():
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = value.detach().clone()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--tp", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-after", type=int, default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, strategy=args.strategy,
                              tp=args.tp)
    options = {"shard": [Block]} if "fsdp" in args.strategy else {}
    model = trainer.setup(make_model(), name="lm", **options)
    opt = trainer.optimizer("adamw", model.parameters(), **ADAMW)
    first = trainer.load(args.out / args.resume)["step"] if args.resume else 0
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp or world
    save = (args.out / f"{args.name}_{args.save_after}", args.save_after) if args.save_after else None
    record = train(trainer, model, opt, range(first, args.steps), rank // tp, world // tp, save)
    record["final"] = full_weights(model)
    record["reason"] = trainer._strategy.reason
    record["local_numel"] = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    trainer.close()
    torch.save(record, args.out / f"{args.name}_rank{os.environ['RANK']}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Tensor parallel (and FSDP × tensor parallel) ranks training the LM example's network, saving and resuming.

Run by tests/distributed/test_tensor_parallel.py through ``common.run_ranks``: ``--strategy tp|fsdp+tp --tp N``
trains ``--steps`` steps with gradient clipping and two-micro-batch accumulation, saves a sharded checkpoint
after ``--save-after`` steps, and records the global-batch losses, gradient norms and full weights; with
``--resume`` it loads a checkpoint first (any strategy's) and finishes the run.

Further runs share the launch (the process group stays joined between trainers, and a launch costs more
than a short run): ``--compile-steps N`` then trains a fresh model N steps with ``Trainer(compile=True)``
under ``--compile-strategy`` (the run's own by default), and ``--sequence-steps N`` trains one under
``--sequence-strategy`` (default ``"tp"``; ``--sequence-tp`` its tensor-parallel size) with `SEQUENCE_PLAN`,
saving after ``--sequence-save`` steps.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch._dynamo.utils
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # run as a script: the LM example
import devplug

from lm.models import Block, LanguageModel, ModelSpec

SPEC = ModelSpec(width=64, layers=2, heads=4, context=16)
BATCH = 8
ADAMW = {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-4}

#: Sequence parallel for the LM block, whose residual stream stays whole (attention needs every position):
#: each norm works on this rank's half of the positions, and each neighbour takes the split layout as
#: torch's SequenceParallel documentation says: the MLP's first layer gathers it (colwise from Shard(1)), its
#: last reduce-scatters into it (rowwise to Shard(1)) and the MLP's output is gathered whole for the residual;
#: the attention's projection and the head gather their input whole.
SEQUENCE_PLAN = {
    "blocks.*.norm_attention": "sequence",
    "blocks.*.qkv": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
    "blocks.*.norm_mlp": "sequence",
    "blocks.*.mlp.0": ColwiseParallel(input_layouts=Shard(1)),
    "blocks.*.mlp.2": RowwiseParallel(output_layouts=Shard(1)),
    "blocks.*.mlp": PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate()),
    "norm": "sequence",
    "head": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
}


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
    counters = torch._dynamo.utils.counters  # torch.compile's: graphs compiled, graph breaks met
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    graphs_after_first_step = None
    for step in steps:
        if step == steps.start + 1:  # graphs compiled by then: a later new one is a recompile
            graphs_after_first_step = counters["stats"]["unique_graphs"] - graphs
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
    return {"losses": losses, "norms": norms, "graph_breaks": sum(counters["graph_break"].values()) - breaks,
            "graphs": counters["stats"]["unique_graphs"] - graphs, "graphs_after_first_step": graphs_after_first_step}


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
    parser.add_argument("--compile-steps", type=int, default=0)
    parser.add_argument("--compile-strategy", default=None)
    parser.add_argument("--compile-tp", type=int, default=None)
    parser.add_argument("--sequence-steps", type=int, default=0)
    parser.add_argument("--sequence-save", type=int, default=None)
    parser.add_argument("--sequence-strategy", default="tp")
    parser.add_argument("--sequence-tp", type=int, default=None)
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
    if args.compile_steps:
        record["compiled"] = compiled_run(args.compile_strategy or args.strategy, args.compile_tp,
                                          args.compile_steps)
    if args.sequence_steps:
        record["sequence"] = sequence_run(args.out / f"{args.name}_sequence_{args.sequence_save}",
                                          args.sequence_save, args.sequence_steps, args.sequence_strategy,
                                          args.sequence_tp)
    torch.save(record, args.out / f"{args.name}_rank{os.environ['RANK']}.pt")
    dist.destroy_process_group()


def _data_parallel_share(strategy: str, tp: int | None) -> tuple[int, int]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if strategy in ("tp", "fsdp+tp"):
        tp = tp or world
        return rank // tp, world // tp
    return rank, world


def compiled_run(strategy: str, tp: int | None, steps: int) -> dict:
    """A fresh model trained ``steps`` steps with the device plugin's compile under ``strategy``."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, strategy=strategy, tp=tp,
                              compile=True)
    options = {"shard": [Block]} if "fsdp" in strategy else {}
    model = trainer.setup(make_model(), name="lm", **options)
    opt = trainer.optimizer("adamw", model.parameters(), **ADAMW)
    record = train(trainer, model, opt, range(steps), *_data_parallel_share(strategy, tp))
    record["summary"] = trainer.summary()["compiled"]["lm"]
    record["reason"] = trainer._strategy.reason
    trainer.close()
    return record


def sequence_run(path: Path, save: int, steps: int, strategy: str = "tp", tp: int | None = None) -> dict:
    """A fresh model trained ``steps`` steps under ``strategy`` (tensor parallel, or FSDP × tensor parallel) with
    `SEQUENCE_PLAN`, saved after ``save``."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, strategy=strategy, tp=tp)
    options = {"shard": [Block]} if "fsdp" in strategy else {}
    model = trainer.setup(make_model(), name="lm", tp_plan=SEQUENCE_PLAN, **options)
    opt = trainer.optimizer("adamw", model.parameters(), **ADAMW)
    record = train(trainer, model, opt, range(steps), *_data_parallel_share(strategy, tp), (path, save))
    record["reason"] = trainer._strategy.reason
    record["final"] = full_weights(model)
    record["norm_placements"] = str(model.blocks[0].norm_mlp.weight.placements)
    trainer.close()
    return record


if __name__ == "__main__":
    main()

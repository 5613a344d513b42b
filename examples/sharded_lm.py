"""A small transformer language model trained with its weights sharded across ranks (PyTorch's FSDP).

Runs anywhere: one process (a process group of one), or many with a launcher::

    python examples/sharded_lm.py --steps 20
    torchrun --standalone --nproc-per-node 8 examples/sharded_lm.py --device cuda --precision bf16-mixed

Each rank holds 1/N of the parameters, gradients and AdamW state; the device plugin picks the mixed
precision policy and the optimizer kernel (``trainer.sharding``). The run saves a sharded checkpoint (a plain file
``CHECKPOINT.pt`` without sharding), resumes from the sharded one with ``--resume`` on any number of
ranks, with or without sharding, and ``--consolidate FILE`` writes the weights as one plain file at the end.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import devplug
from devplug import toolkit


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP, each with a residual connection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    """Token embedding, ``layers`` blocks, a final norm and a head over the vocabulary."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--strategy", default="fsdp", choices=("fsdp", "ddp", "auto"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step")
    parser.add_argument("--checkpoint", default="sharded_lm_checkpoint")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--consolidate", default=None, help="write the final weights as one file here")
    parser.add_argument("--recompute", action="store_true", help="activation checkpointing of every block")
    args = parser.parse_args()

    trainer = devplug.Trainer(device=args.device, precision=args.precision, strategy=args.strategy, seed=0,
                              log_every=5, progress=False)
    model = trainer.setup(LM(args.vocab, args.width, args.layers, heads=4), name="lm",
                          shard=[Block] if args.strategy == "fsdp" else None,
                          activation_checkpointing=[Block] if args.recompute else None)
    opt = trainer.optimizer("adamw", model.parameters(), lr=3e-3)
    first = trainer.load(args.checkpoint)["step"] if args.resume else 0
    if trainer.is_main_process:
        plan = trainer.sharding.reason if trainer.sharding else "no sharding"
        print(f"{trainer.world_size} rank(s), strategy {trainer.strategy}, "
              f"optimizer {trainer.optimizer_implementation(opt)}; {plan}")
    data = torch.Generator().manual_seed(1000 + trainer.rank)  # each rank its own sequences
    for step in range(first, args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch_size, args.context + 1), generator=data)
        tokens = trainer.to_device(tokens.sort(dim=1).values)  # a learnable pattern: sorted tokens
        with trainer.accumulate(model):
            with trainer.autocast():
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab).float(),
                                                   tokens[:, 1:].reshape(-1))
            trainer.backward(loss)
            trainer.clip_grad_norm(opt, 1.0)
            trainer.step(opt)
        if trainer.is_main_process and (step + 1) % 5 == 0:
            print(f"step {step + 1}: loss {loss.item():.3f}")
    # sharded: a folder every rank writes into; otherwise one file (rank 0)
    trainer.save(args.checkpoint if trainer.sharding else f"{args.checkpoint}.pt", step=args.steps)
    trainer.close()
    if args.consolidate and trainer.is_main_process and trainer.strategy == "fsdp":
        toolkit.consolidate_checkpoint(args.checkpoint, args.consolidate)
        print(f"weights in one file: {args.consolidate}")


if __name__ == "__main__":
    main()

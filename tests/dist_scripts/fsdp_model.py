"""A small transformer-ish language model and its data, shared by the FSDP tests and tests/dist_scripts/train_fsdp.py.

Every parameter's first dimension is even, so FSDP splits each exactly in two over two ranks. Imported as
``dist_scripts.fsdp_model`` by tests and as ``fsdp_model`` by the scripts here, so it must not import pytest.
"""

from __future__ import annotations

from typing import Any

import torch

VOCAB, WIDTH, CONTEXT, BATCH, STEPS = 32, 16, 12, 8, 6
#: The AdamW options every run trains with. eps well above the noise-level gradients (the key bias of attention
#: has none mathematically), so Adam does not blow rounding differences between reduction orders up to
#: learning-rate-sized steps.
ADAMW = {"lr": 1e-2, "weight_decay": 0.01, "eps": 1e-4}


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, each with a residual connection (no dropout)."""

    def __init__(self, width: int = WIDTH, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyLM(torch.nn.Module):
    """Embedding, two blocks, a final norm and a head over the vocabulary."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
        self.norm, self.head = torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_lm(seed: int = 0) -> TinyLM:
    """The model, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return TinyLM()


def batches(steps: int = STEPS) -> torch.Tensor:
    """``steps`` global batches of token sequences (steps × BATCH × CONTEXT+1), the same in every process."""
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, VOCAB, (steps, BATCH, CONTEXT + 1), generator=g)


def rank_batch(step: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s equal share of global batch ``step``: the concatenation over ranks is the whole batch."""
    per = BATCH // world_size
    return batches()[step, rank * per:(rank + 1) * per]


def lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, averaged over the batch's positions."""
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def local_bytes(tensors) -> int:
    """Bytes this process holds for ``tensors`` (a DTensor counts its local shard only)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state as plain CPU tensors (a sharded one gathered: a collective under FSDP)."""
    out = {}
    for name, value in module.state_dict().items():
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = value.detach().cpu().clone()
    return out


class Picky:
    """An object registered for checkpointing that reads only the states of its own version; it takes the value
    before it checks the version, so a refusal leaves it half-loaded unless the Trainer puts it back."""

    def __init__(self) -> None:
        self.value, self.version = 0, 1

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]
        if state["version"] != self.version:
            raise ValueError("this version cannot read that state")

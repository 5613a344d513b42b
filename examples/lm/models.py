"""The network: a pre-norm decoder-only transformer over bytes, and greedy or temperature sampling from it.

`Block` (causal self-attention through ``scaled_dot_product_attention``, then a GELU MLP, each behind a
LayerNorm and a residual connection) is the unit the example shards (``trainer.setup(shard=[Block])``)
and recomputes (``activation_checkpointing=[Block]``). `LanguageModel` adds token and learned position
embeddings, a final LayerNorm and a head over the 256 byte values, optionally tied to the token embedding.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import nn

from devplug import ConfigError

#: Tokens are bytes.
VOCAB = 256


@attrs.frozen
class ModelSpec:
    """The sizes that define the network (a checkpoint resumes only into the same ones)."""

    width: int
    layers: int
    heads: int
    context: int
    tie_weights: bool = True

    def check(self) -> ModelSpec:
        """The spec itself, or a `devplug.ConfigError` naming the flag to change."""
        if self.width % self.heads:
            raise ConfigError(f"--width {self.width} is not a multiple of --heads {self.heads}; each head gets "
                              "width / heads channels")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The sizes as plain values (for the summary and checkpoints)."""
        return attrs.asdict(self)


class Block(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP (4x wide), each added to the residual stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm_attention, self.norm_mlp = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.projection = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (batch, time, width) to the same shape; position t attends to positions <= t only."""
        batch, time, width = x.shape
        q, k, v = (self.qkv(self.norm_attention(x)).view(batch, time, 3, self.heads, width // self.heads)
                   .permute(2, 0, 3, 1, 4))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, time, width))
        return x + self.mlp(self.norm_mlp(x))


class LanguageModel(nn.Module):
    """Byte and position embeddings, ``layers`` blocks, a final LayerNorm, logits over the 256 byte values."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.context = spec.context
        self.embed = nn.Embedding(VOCAB, spec.width)
        self.position = nn.Embedding(spec.context, spec.width)
        self.blocks = nn.ModuleList(Block(spec.width, spec.heads) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(spec.width)
        self.head = nn.Linear(spec.width, VOCAB, bias=False)
        self.apply(_init)
        for block in self.blocks:  # GPT-2's scaling of the residual projections by depth
            assert isinstance(block, Block)
            for layer in (block.projection, block.mlp[2]):
                assert isinstance(layer, nn.Linear)
                nn.init.normal_(layer.weight, std=0.02 / (2 * spec.layers) ** 0.5)
        if spec.tie_weights:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (batch, time, 256) for ``tokens`` (batch, time), time <= context."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _init(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def count_parameters(module: nn.Module) -> int:
    """Trainable parameters, a tied weight counted once."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters() if p.requires_grad}.values())


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int, *, context: int, temperature: float,
             generator: torch.Generator) -> torch.Tensor:
    """``prompt`` (a 1-D tensor of bytes on the model's device) continued by ``new_tokens`` bytes.

    ``temperature`` 0 takes the most likely byte (greedy); above 0 samples from the softmax of the logits
    divided by it, drawing from ``generator`` (a CPU generator: the training RNG is not touched, and every
    rank draws the same bytes, which a sharded model needs: each forward is a collective).
    """
    tokens = prompt.view(1, -1)
    for _ in range(new_tokens):
        logits = model(tokens[:, -context:])[0, -1].float()
        if temperature == 0:
            following = logits.argmax().view(1, 1)
        else:
            probabilities = torch.softmax(logits / temperature, dim=-1).cpu()
            following = torch.multinomial(probabilities, 1, generator=generator).view(1, 1).to(tokens.device)
        tokens = torch.cat([tokens, following], dim=1)
    return tokens[0]

"""DCGAN generator and discriminator (pytorch/examples' architecture), sized by `ModelSpec`.

The networks are built for any power-of-two image size from 16 to 1024: the generator starts from a
4×4 map and doubles it per transposed convolution; the discriminator halves the image down to 4×4 and
ends in a 4×4 convolution that returns one **logit** per image (no sigmoid: the loss is
``BCEWithLogitsLoss``, which autocast keeps in fp32, unlike ``BCELoss``).

At 64×64 the layer widths are exactly pytorch/examples' DCGAN (``ngf*8 … ngf``, ``ndf … ndf*8``);
each doubling of the image size adds one block to each network and doubles the widest layer, which is
how the 128×128 ``safe-128`` preset is built.
"""

from __future__ import annotations

import itertools
import math

import attrs
import torch
from torch import nn

from devplug import ConfigError

MIN_IMAGE_SIZE = 16
MAX_IMAGE_SIZE = 1024


@attrs.frozen
class ModelSpec:
    """Sizes of a DCGAN: latent size ``nz``, generator/discriminator widths, square image size."""

    nz: int
    ngf: int
    ndf: int
    image_size: int
    channels: int = 3

    def check(self) -> ModelSpec:
        """Raise `devplug.ConfigError` if the networks cannot be built for these sizes."""
        for name in ("nz", "ngf", "ndf"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"--{name} must be a positive integer, got {value}")
        size = self.image_size
        if size < MIN_IMAGE_SIZE or size > MAX_IMAGE_SIZE or size & (size - 1):
            raise ConfigError(
                f"image size {size} is not supported: the DCGAN networks need a power of two from "
                f"{MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} (e.g. 32, 64, 128)"
            )
        return self

    @property
    def blocks(self) -> int:
        """Stride-2 (transposed) convolutions between 4×4 and the image size: 4 at 64×64, 5 at 128×128."""
        return int(math.log2(self.image_size)) - 2

    def as_dict(self) -> dict[str, int]:
        """The sizes as plain ints (stored in checkpoints)."""
        return attrs.asdict(self)


#: ``naive-64`` is pytorch/examples' DCGAN; ``safe-64`` widens its generator, ``safe-128`` widens both networks and
#: adds a block to each; ``tiny-32`` learns the embedded data in minutes on a laptop CPU. Trainable parameters
#: (G / D): 296,896 / 167,808; 3,576,704 / 2,765,568; 52,448,768 / 2,765,568; 195,063,296 / 44,611,072.
PRESETS: dict[str, ModelSpec] = {
    "tiny-32": ModelSpec(nz=64, ngf=32, ndf=32, image_size=32),
    "naive-64": ModelSpec(nz=100, ngf=64, ndf=64, image_size=64),
    "safe-64": ModelSpec(nz=256, ngf=256, ndf=64, image_size=64),
    "safe-128": ModelSpec(nz=256, ngf=256, ndf=128, image_size=128),
}


class Generator(nn.Module):
    """Latent ``(N, nz, 1, 1)`` → image ``(N, channels, S, S)`` in [-1, 1] (tanh)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        spec.check()
        widths = [spec.ngf * 2 ** (spec.blocks - 1 - i) for i in range(spec.blocks)]  # e.g. 8,4,2,1 × ngf
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(spec.nz, widths[0], 4, 1, 0, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(True),
        ]
        for c_in, c_out in itertools.pairwise(widths):
            layers += [nn.ConvTranspose2d(c_in, c_out, 4, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(True)]
        layers += [nn.ConvTranspose2d(widths[-1], spec.channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Generate images from latent vectors."""
        return self.main(z)


class Discriminator(nn.Module):
    """Image ``(N, channels, S, S)`` → one real/fake **logit** per image, shape ``(N,)``."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        spec.check()
        widths = [spec.ndf * 2**i for i in range(spec.blocks)]  # e.g. 1,2,4,8 × ndf
        layers: list[nn.Module] = [nn.Conv2d(spec.channels, widths[0], 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)]
        for c_in, c_out in itertools.pairwise(widths):
            layers += [nn.Conv2d(c_in, c_out, 4, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.LeakyReLU(0.2, True)]
        layers += [nn.Conv2d(widths[-1], 1, 4, 1, 0, bias=False)]
        self.main = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Real/fake logits (apply a sigmoid for D(x) as a probability)."""
        return self.main(x).flatten()


def dcgan_init(module: nn.Module) -> None:
    """DCGAN weight init (use with ``model.apply``): conv N(0, 0.02); batch-norm weight N(1, 0.02), bias 0."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def build_models(spec: ModelSpec) -> tuple[Generator, Discriminator]:
    """A DCGAN-initialised generator and discriminator for ``spec`` (on the CPU, before ``trainer.setup``)."""
    generator, discriminator = Generator(spec), Discriminator(spec)
    generator.apply(dcgan_init)
    discriminator.apply(dcgan_init)
    return generator, discriminator


def parameter_counts(spec: ModelSpec) -> tuple[int, int]:
    """Trainable parameters of the generator and the discriminator for ``spec``, counted without building them."""
    spec.check()
    widths_g = [spec.ngf * 2 ** (spec.blocks - 1 - i) for i in range(spec.blocks)]
    generator = spec.nz * widths_g[0] * 16 + 2 * widths_g[0] + widths_g[-1] * spec.channels * 16
    generator += sum(c_in * c_out * 16 + 2 * c_out for c_in, c_out in itertools.pairwise(widths_g))
    widths_d = [spec.ndf * 2**i for i in range(spec.blocks)]
    discriminator = spec.channels * widths_d[0] * 16 + widths_d[-1] * 16
    discriminator += sum(c_in * c_out * 16 + 2 * c_out for c_in, c_out in itertools.pairwise(widths_d))
    return generator, discriminator


def count_parameters(model: nn.Module) -> int:
    """Trainable elements across all parameters (what the presets' parameter counts refer to)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

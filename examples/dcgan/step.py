"""One DCGAN training iteration on a devplug Trainer (`DCGANStep`), and the scaling of its input batches.

The iteration is the model author's own (a GAN needs two optimizers and manual control); the Trainer
supplies everything device-specific: placement, the optimizer implementation, mixed precision, step
marking and, under ``torchrun``, DDP. The benchmarks time this same class.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

import devplug

from .models import ModelSpec, build_models, count_parameters


def to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """Images scaled to [-1, 1] on the device: uint8 batches (cache, embedded, fake) are scaled here,
    float batches (a plugin's own image loader) already are."""
    if images.dtype == torch.uint8:
        return images.float().div_(127.5).sub_(1.0)
    return images.float()


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """``module``'s parameters take no gradient inside the block: a backward through what it computed there
    gives gradients to its inputs only, skipping its weight gradients (about a third of its backward)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class DCGANStep:
    """One DCGAN iteration on a Trainer: D on real and fake images, then G (BCE-with-logits, Adam).

    Builds both networks with DCGAN init on the CPU and hands them to the Trainer, which places them
    (and converts, compiles or DDP-wraps them as the plugin and flags say); both optimizers come from
    the plugin's optimizer factory. ``step(real)`` takes a batch already on the device, in [-1, 1].
    ``freeze_d=False`` is pytorch/examples' step, which also computes D's weight gradients in the G step (and
    throws them away): the same training, more work (a benchmark compares the two).
    """

    def __init__(self, trainer: devplug.Trainer, spec: ModelSpec, *, lr: float = 2e-4, beta1: float = 0.5,
                 freeze_d: bool = True) -> None:
        self.trainer, self.spec, self.freeze_d = trainer, spec, freeze_d
        generator, discriminator = build_models(spec)
        self.params_g, self.params_d = count_parameters(generator), count_parameters(discriminator)
        self.net_g = trainer.setup(generator, name="generator")
        self.net_d = trainer.setup(discriminator, name="discriminator")
        self.opt_g = trainer.optimizer("adam", self.net_g.parameters(), lr=lr, betas=(beta1, 0.999))
        self.opt_d = trainer.optimizer("adam", self.net_d.parameters(), lr=lr, betas=(beta1, 0.999))
        self.criterion = nn.BCEWithLogitsLoss()  # D returns logits: autocast-safe, unlike BCELoss after a sigmoid

    def __call__(self, real: torch.Tensor) -> dict[str, torch.Tensor]:
        """One iteration; returns the values to log, left on the device (read back at log points only)."""
        trainer, device, criterion = self.trainer, self.trainer.torch_device, self.criterion
        net_g, net_d, batch = self.net_g, self.net_d, real.shape[0]
        # Each process takes its own slice of one noise draw: distinct noise per process, while every
        # process's RNG stays in step (so one checkpoint's RNG state fits all of them).
        noise = torch.randn(trainer.world_size * batch, self.spec.nz, 1, 1, device=device)
        noise = noise[trainer.rank * batch:(trainer.rank + 1) * batch]
        ones, zeros = torch.ones(batch, device=device), torch.zeros(batch, device=device)

        # (1) Discriminator: real → 1, fake → 0.
        with trainer.autocast():
            fake = net_g(noise)
            logits_real = net_d(real)
            logits_fake = net_d(fake.detach())
            loss_d = criterion(logits_real, ones) + criterion(logits_fake, zeros)
        self.opt_d.zero_grad(set_to_none=True)  # drop the previous D step's gradients
        trainer.backward(loss_d)
        trainer.step(self.opt_d)

        # (2) Generator: make D call the fakes real. Only G steps here, so D computes no weight gradients
        # (pytorch/examples computes them and discards them at the next zero_grad): a twelfth of the step's
        # FLOPs. G's gradients are the same either way.
        with frozen(net_d) if self.freeze_d else contextlib.nullcontext(), trainer.autocast():
            loss_g = criterion(net_d(fake), ones)
        trainer.backward(loss_g)
        trainer.step(self.opt_g)
        return {
            "loss_D": loss_d,
            "loss_G": loss_g,
            "D_x": torch.sigmoid(logits_real.detach()).mean(),
            "D_G_z": torch.sigmoid(logits_fake.detach()).mean(),
        }

    def implementation(self) -> str:
        """The optimizer implementation the device plugin chose (the same for G and D)."""
        return self.trainer.optimizer_implementation(self.opt_g)

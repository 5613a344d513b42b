#!/usr/bin/env python
"""The DCGAN example at its smallest: pytorch/examples' DCGAN loop, with devplug doing the device work.

    python examples/dcgan/minimal.py --steps 20            # a quick look, best device here
    python examples/dcgan/minimal.py --device cuda         # one epoch of 32,000 images on a GPU
    torchrun --nproc-per-node 4 examples/dcgan/minimal.py --device cuda

It trains the tiny-32 model on the embedded data set (colored shapes on gradients, generated on the fly:
nothing to download) and writes sample grids, TensorBoard logs and a checkpoint under --out. Everything
device-specific (where tensors live, the optimizer implementation, mixed precision, the data loader, step
marking, DDP under torchrun) is a devplug call. train.py, beside this file, is the same loop with every
option: image folders and their cache, resume, input checks, the run summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as a file: import this folder as the package dcgan, not its modules as top-level ones
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
from torch import nn

import devplug
from devplug.toolkit import precision_names

from dcgan.embedded_data import ShapesDataset
from dcgan.models import PRESETS, build_models


def parse_args() -> argparse.Namespace:
    """The few flags of the minimal example."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="auto, cpu, cuda, hpu, ... (default: $DEVPLUG_DEVICE or auto)")
    parser.add_argument("--precision", default="auto", help=f"auto (the device's best), {', '.join(precision_names())}")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of 32,000 images (default: 1)")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--batch-size", type=int, default=128, help="images per step and process (default: 128)")
    parser.add_argument("--lr", type=float, default=2e-4, help="Adam learning rate (default: 2e-4)")
    parser.add_argument("--beta1", type=float, default=0.5, help="Adam beta1 (default: 0.5)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights, noise and shuffling (default: 0)")
    parser.add_argument("--sample-every", type=int, default=250, help="steps between sample grids (default: 250)")
    parser.add_argument("--out", type=Path, default=Path("runs/dcgan-minimal"), help="output folder")
    args = parser.parse_args()
    for flag, value in (("--epochs", args.epochs), ("--sample-every", args.sample_every)):
        if value < 1:  # the Trainer checks the others; 0 here would train nothing, or divide by zero
            raise devplug.ConfigError(f"{flag} must be a positive integer, got {value}")
    return args


def main() -> int:
    """Train the tiny-32 DCGAN on the embedded shapes; samples, logs and a checkpoint go to --out. The exit status."""
    args = parse_args()
    spec = PRESETS["tiny-32"]  # nz 64, ngf 32, ndf 32, 32x32 images
    trainer = devplug.Trainer(device=args.device, precision=args.precision, seed=args.seed,
                              log_dir=str(args.out / "tensorboard"), log_every=50)
    device = trainer.torch_device

    generator, discriminator = build_models(spec)  # DCGAN init, on the CPU
    net_g = trainer.setup(generator, name="generator")  # to the device (and DDP under torchrun)
    net_d = trainer.setup(discriminator, name="discriminator")
    opt_g = trainer.optimizer("adam", net_g.parameters(), lr=args.lr, betas=(args.beta1, 0.999))  # the fastest Adam
    opt_d = trainer.optimizer("adam", net_d.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    criterion = nn.BCEWithLogitsLoss()  # D returns logits: safe under autocast, unlike BCELoss after a sigmoid
    loader = trainer.dataloader(ShapesDataset(spec.image_size), batch_size=args.batch_size, shuffle=True,
                                drop_last=True)
    fixed_noise = trainer.to_device(torch.randn(64, spec.nz, 1, 1))

    def save_samples(path: Path) -> None:
        with torch.no_grad(), trainer.autocast():
            trainer.log_images("samples", net_g(fixed_noise), nrow=8, path=str(path))

    for _epoch in trainer.epochs(args.epochs, max_steps=args.steps):
        for real, _labels in loader:  # uint8 batches, already on the device
            real = real.float().div_(127.5).sub_(1.0)  # to [-1, 1], like the generator's tanh
            batch = real.shape[0]
            # One noise draw for all processes, each taking its own slice: distinct fakes, RNGs in step.
            noise = torch.randn(trainer.world_size * batch, spec.nz, 1, 1, device=device)
            noise = noise[trainer.rank * batch:(trainer.rank + 1) * batch]
            ones, zeros = torch.ones(batch, device=device), torch.zeros(batch, device=device)

            # (1) Discriminator: real → 1, fake → 0.
            with trainer.autocast():
                fake = net_g(noise)
                logits_real, logits_fake = net_d(real), net_d(fake.detach())
                loss_d = criterion(logits_real, ones) + criterion(logits_fake, zeros)
            opt_d.zero_grad(set_to_none=True)  # the generator's backward left gradients in D
            trainer.backward(loss_d)
            trainer.step(opt_d)

            # (2) Generator: make D call the fakes real.
            with trainer.autocast():
                loss_g = criterion(net_d(fake), ones)
            trainer.backward(loss_g)
            trainer.step(opt_g)  # also zeroes G's gradients after the step

            # Values stay on the device until a log point (every 50 steps): no host sync per step.
            trainer.log(loss_D=loss_d, loss_G=loss_g, D_x=torch.sigmoid(logits_real.detach()).mean(),
                        D_G_z=torch.sigmoid(logits_fake.detach()).mean())
            if trainer.global_step % args.sample_every == 0:
                save_samples(args.out / "samples" / f"step_{trainer.global_step:07d}.png")

    # Ctrl-C, SIGTERM or SIGUSR1 end trainer.epochs() after the current step: the run still saves and samples.
    checkpoint = trainer.save(args.out / f"step_{trainer.global_step:07d}.pt")  # main process; None elsewhere
    save_samples(args.out / "samples" / "last.png")  # after the save: sampling in train mode moves G's norm stats
    summary = trainer.summary()
    trainer.close()
    if trainer.is_main_process:
        print(f"{summary['steps']} steps on {summary['device']} ({summary['precision']}), "
              f"{summary.get('samples_per_sec', 0.0):,.0f} images/s; checkpoint {checkpoint}; "
              f"samples in {args.out / 'samples'}")
    return trainer.exit_code

if __name__ == "__main__":
    try:
        sys.exit(main())
    except devplug.DevplugError as exc:  # bad input (a device, a flag value): one line and status 2
        print(f"minimal.py: error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)

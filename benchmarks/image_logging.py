"""What logging a sample grid costs: plain torchvision + TensorBoard vs devplug's ``trainer.log_images``.

The question: how long does one fixed-noise sample grid (64 images of 64x64, the DCGAN example's) take to
reach a PNG file and TensorBoard, counting the event writer's background thread (its time holds the GIL, so
the training thread waits as long)? Variants, interleaved in one process, each timed call = one grid written
and the event file flushed:

- ``plain``: what pytorch/examples' DCGAN does plus a TensorBoard image, as a plain-PyTorch author writes it:
  ``torchvision.utils.save_image`` to the file, ``SummaryWriter.add_image(make_grid(...))`` to TensorBoard
  (which encodes the grid a second time and checksums each record in Python: tensorboard's own writer, put
  back for these calls);
- ``devplug``: ``trainer.log_images(tag, images, path=...)`` (one PNG encoding, that file's bytes in the event
  file, record checksums in C via google-crc32c where installed);
- ``devplug (A/A)``: the same again, whose ratio to ``devplug`` is this run's noise floor.

``--content noise`` (the default) logs uniform noise, what a GAN draws at its first steps and the worst case
for PNG (incompressible, ~700 KB); ``--content smooth`` logs smooth gradients (a trained model's samples
compress far better). Prints the medians, ratios to ``plain``, the PNG sizes and the CPU model.

Run: python benchmarks/image_logging.py [--rounds 7] [--content noise|smooth]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile

import torch
from _timing import interleaved, report

import devplug


def _images(content: str) -> torch.Tensor:
    """64 RGB 64x64 images in [-1, 1]: uniform noise, or smooth gradients with a little noise."""
    generator = torch.Generator().manual_seed(0)
    if content == "noise":
        return torch.rand(64, 3, 64, 64, generator=generator) * 2 - 1
    ramp = torch.linspace(-1, 1, 64)
    base = (ramp[None, None, :, None] * torch.rand(64, 3, 1, 1, generator=generator)
            + ramp[None, None, None, :] * torch.rand(64, 3, 1, 1, generator=generator))
    return (base + 0.02 * torch.randn(64, 3, 64, 64, generator=generator)).clamp(-1, 1)


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    """Time the variants interleaved and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--content", choices=("noise", "smooth"), default="noise")
    args = parser.parse_args()

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboards_own
    from tensorboard.summary.writer import record_writer
    from torch.utils.tensorboard import SummaryWriter
    from torchvision.utils import make_grid, save_image

    images = _images(args.content)
    folder = tempfile.mkdtemp(prefix="image-logging-")
    trainers = {name: devplug.Trainer(device="cpu", log_dir=os.path.join(folder, name), progress=False)
                for name in ("devplug", "devplug (A/A)")}
    for trainer in trainers.values():
        trainer.log_images("warm", images[:1])  # creates the writer (and sets up the C checksums)
    devplugs_checksum = record_writer.masked_crc32c
    plain_writer = SummaryWriter(os.path.join(folder, "plain"))
    png, plain_png = os.path.join(folder, "grid.png"), os.path.join(folder, "plain.png")

    def plain() -> None:
        record_writer.masked_crc32c = tensorboards_own  # what tensorboard does on its own
        try:
            save_image(images, plain_png, nrow=8, normalize=True, value_range=(-1, 1))
            plain_writer.add_image("samples", make_grid(images, nrow=8, normalize=True, value_range=(-1, 1)))
            plain_writer.flush()
        finally:
            record_writer.masked_crc32c = devplugs_checksum

    def with_devplug(trainer: devplug.Trainer) -> None:
        trainer.log_images("samples", images, path=png)
        trainer._reporter.writer.flush()  # wait for the event writer's thread, as plain() does

    medians = interleaved({"plain": plain, **{name: (lambda t=t: with_devplug(t)) for name, t in trainers.items()}},
                          rounds=args.rounds)
    plain_writer.close()
    for trainer in trainers.values():
        trainer.close()
    native = getattr(devplugs_checksum, "devplug_native", False)
    print(report(f"one 8x8 grid of 64x64 {args.content} images to a PNG file and TensorBoard ({_cpu()}; "
                 f"PNG {os.path.getsize(plain_png) / 1e3:,.0f} KB plain, {os.path.getsize(png) / 1e3:,.0f} KB devplug; "
                 f"devplug's checksums in {'C' if native else 'Python'})",
                 medians, "plain", unit="s"))


if __name__ == "__main__":
    main()

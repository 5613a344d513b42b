"""Data-loading parallelism: loader throughput vs worker processes and pinned memory.

IO only (loading alone, no compute): the Trainer's loader over an image folder decoded every epoch (an
``ImageFolderSource``, no cache: the slow path of a DCGAN trained on a folder of photos, where every
480×360 JPEG is opened, decoded and resized for each batch), batches arriving on the device, no model.
One loader per setting, all with persistent workers, timed in interleaved blocks; after each block the
epoch is read to its end untimed so that no loader's workers are busy while another is timed. Without
``--data`` a temporary folder of photo-like 480×360 JPEGs is written first.

``pin_memory`` only matters for copies to an accelerator: torch ignores it (with a warning) when there is
none, so on the CPU the pinned variants are left out unless ``--pin-memory both`` asks for them.

Run: python benchmarks/workers.py [--data PATH] [--workers 0,1,2] [--pin-memory auto|both|on|off]
     [--batch-size 64] [--batches 10] [--rounds 5] [--image-size 64] [--device auto]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from _dcgan import EpochDriver, make_demo_folder
from _timing import interleaved, report

import devplug
from devplug.toolkit import list_images


def main() -> None:
    """One Trainer loader per (workers, pin_memory) setting, timed interleaved; images/s and ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--data", default=None, help="a folder of images (default: a temporary demo folder)")
    parser.add_argument("--demo-images", type=int, default=256, help="JPEGs written when --data is not given")
    parser.add_argument("--workers", default="0,1,2", help="comma-separated worker counts")
    parser.add_argument("--pin-memory", default="auto", choices=["auto", "both", "on", "off"],
                        help="auto: both on an accelerator, off on the CPU")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=10, help="batches per timed block")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image-size", type=int, default=64,
                        help="resize/crop size (default 64: naive-64, the example's model for folders)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devplug-bench-") as tmp:
        try:
            run(args, Path(tmp))
        except devplug.DevplugError as exc:  # a missing or empty folder, an unknown device
            raise SystemExit(f"workers: error: {exc}") from None


def run(args: argparse.Namespace, tmp: Path) -> None:
    """The benchmark proper; ``tmp`` holds the demo folder."""
    note = ""
    if args.data is None:
        root = tmp / "images"
        seconds = make_demo_folder(root, args.demo_images)
        note = f"wrote {args.demo_images} photo-like 480x360 JPEGs in {seconds:.1f} s"
    else:
        root = Path(args.data).expanduser()
    images = len(list_images(root))
    trainer = devplug.Trainer(device=args.device, precision="32-true", seed=0, progress=False, log_every=10**9)
    accelerated = trainer.torch_device.type != "cpu" and torch.accelerator.is_available()
    pins = {"auto": [False, True] if accelerated else [False], "both": [False, True], "on": [True],
            "off": [False]}[args.pin_memory]
    if args.pin_memory == "both" and not accelerated:
        warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator", category=UserWarning)
    source = devplug.ImageFolderSource(str(root), image_size=args.image_size)
    driver = EpochDriver(trainer)
    streams = {}
    for workers in (int(w) for w in args.workers.split(",") if w != ""):
        for pin in pins:
            label = f"workers={workers}" + (f", pin_memory={pin}" if len(pins) > 1 else "")
            loader = trainer.dataloader(source, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                        num_workers=workers, pin_memory=pin, persistent_workers=True)
            streams[label] = driver.stream(loader)

    def block(label: str) -> Callable[[], None]:
        stream = streams[label]

        def read() -> None:
            for _ in range(args.batches):
                stream.next()
            trainer.synchronize()

        return read

    variants = {label: block(label) for label in streams}
    after = {label: stream.finish_epoch for label, stream in streams.items()}
    medians = {k: t / args.batches for k, t in interleaved(variants, rounds=args.rounds, after=after).items()}
    print(f"Loader workers, IO only: {root} ({images} images{'; ' + note if note else ''}) decoded "
          f"every epoch to {args.image_size}x{args.image_size}, batch {args.batch_size}, to {trainer.device}; "
          f"{os.cpu_count()} CPUs; {args.batches} batches per block x {args.rounds} interleaved rounds")
    for label, stream in streams.items():
        print(f"{label:<40} {stream.loader.implementation}")
    if not accelerated:
        print("(no accelerator: batches stay in host memory, pinning would be a no-op)")
    print(report("median per batch", medians, next(iter(medians)), unit="s/batch", items=args.batch_size))
    best = min(medians, key=medians.__getitem__)
    print(f"fastest: {best}, {medians[next(iter(medians))] / medians[best]:.2f}x the first setting")


if __name__ == "__main__":
    main()

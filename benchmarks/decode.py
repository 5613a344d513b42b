"""Decoding photo-like JPEGs to training size: reduced-scale (DCT) decoding vs a full decode, speed and quality.

One process, no loader: each variant decodes every file of a folder of photo-like 480×360 JPEGs (the size
of the photos in a typical DCGAN image folder) to ``--image-size`` (default 64), interleaved in rounds;
figures are images/s per process and speed relative to the decoder ``ImageFolderDataset`` used before
reduced-scale decoding (full decode, torchvision ``Resize`` + ``CenterCrop``, ``ToTensor`` + ``Normalize``).
Variants:

- ``before``: that decoder (the example's ``--no-cache`` path until reduced-scale decoding);
- ``before (A/A)``: the same again, for this run's noise floor;
- ``full decode``: ``load_rgb(draft=False)``: full-resolution decode, one antialiased resize of the crop box;
- ``reduced, margin 2``: ``load_rgb`` as shipped: the DCT scale 1/2, 1/4 or 1/8 that keeps the short side at
  least 2× the target (360 → 180 for 64), then the same resize;
- ``reduced, margin 1``: the most aggressive scale (short side ≥ 1× the target: 360 → 90 for 64);
- ``after: ImageFolderDataset``: what ``--no-cache`` runs now (``load_rgb`` + normalisation to a float tensor).

Quality: PSNR (dB) of each decoder's 8-bit output against the full decode, over all files (mean, worst).

Run: python benchmarks/decode.py [--images 200] [--content photo|detailed] [--image-size 64] [--rounds 5]
     [--data PATH]
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _before import before_decoder
from _dcgan import make_demo_folder, prepare_cache
from _timing import interleaved, report

import devplug
from devplug.toolkit import ImageFolderDataset, available_cpus, list_images, load_rgb


def make_detailed_folder(root: Path, count: int, width: int = 480, height: int = 360, seed: int = 1) -> None:
    """``count`` 480×360 JPEGs with sharp edges and 1-2 px lines (hard cases for reduced-scale decoding)."""
    from PIL import Image, ImageDraw

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        image = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(0, 256, 3)))
        draw = ImageDraw.Draw(image)
        for _ in range(40):
            x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
            x1, y1 = x0 + int(rng.integers(5, 120)), y0 + int(rng.integers(5, 120))
            color = tuple(int(c) for c in rng.integers(0, 256, 3))
            if rng.random() < 0.5:
                draw.rectangle((x0, y0, x1, y1), fill=color)
            else:
                draw.ellipse((x0, y0, x1, y1), fill=color)
        for _ in range(60):
            points = [int(v) for v in rng.integers(0, (width, height, width, height))]
            draw.line(points, fill=tuple(int(c) for c in rng.integers(0, 256, 3)), width=int(rng.integers(1, 3)))
        image.save(root / f"detailed_{index:05d}.jpg", quality=90)


def with_margin(margin: int, image_size: int) -> Callable[[Path], np.ndarray]:
    """``load_rgb`` decoding JPEGs down to ``margin`` × the target size."""

    def decode(path: Path) -> np.ndarray:
        return load_rgb(path, image_size, margin=margin)

    return decode


def as_uint8(pixels: Any) -> np.ndarray:
    """(S, S, 3) uint8 from a decoder's output (a normalised CHW tensor or an HWC uint8 array)."""
    if isinstance(pixels, torch.Tensor):
        return ((pixels * 0.5 + 0.5) * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    return pixels


def psnr(reference: np.ndarray, other: np.ndarray) -> float:
    """Peak signal-to-noise ratio of 8-bit images, in dB (inf when identical)."""
    mse = float(np.mean((reference.astype(np.float64) - other.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def main() -> None:
    """Write (or take) the JPEG folder, check quality, time the decoders interleaved, print rates and ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="a folder of images (default: a temporary demo folder)")
    parser.add_argument("--images", type=int, default=200, help="JPEGs written when --data is not given")
    parser.add_argument("--content", default="photo", choices=["photo", "detailed"],
                        help="demo JPEGs: photo-like colour fields with grain (benchmarks/_dcgan.py, the default), "
                             "or sharp shapes and thin lines (hard cases for reduced-scale decoding)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-build", action="store_true", help="skip timing the DCGAN example's cache build")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devplug-bench-") as tmp:
        note = ""
        if args.data is None:
            root = Path(tmp) / "images"
            if args.content == "photo":
                make_demo_folder(root, args.images)
            else:
                make_detailed_folder(root, args.images)
            note = f"; {args.images} {args.content} 480x360 JPEGs written for this run"
        else:
            root = Path(args.data).expanduser()
        run(root, args.image_size, args.rounds, note)
        if not args.no_build:
            time_cache_build(root, args.image_size, max(1, args.rounds // 2), Path(tmp))


def run(root: Path, size: int, rounds: int, note: str) -> None:
    """The benchmark proper on the images in ``root``."""
    paths = [path for path, _ in list_images(root)]
    dataset = ImageFolderDataset(devplug.ImageFolderSource(str(root), image_size=size))
    position = {path: index for index, path in enumerate(paths)}
    decoders: dict[str, Callable[[Path], Any]] = {
        "before": before_decoder(size),
        "before (A/A)": before_decoder(size),
        "full decode": lambda path: load_rgb(path, size, draft=False),
        "reduced, margin 2": with_margin(2, size),
        "reduced, margin 1": with_margin(1, size),
        "after: ImageFolderDataset": lambda path: dataset._load(position[path])[0],
    }
    reference = [load_rgb(path, size, draft=False) for path in paths]
    quality = {}
    for name, decode in decoders.items():
        values = [psnr(ref, as_uint8(decode(path))) for ref, path in zip(reference, paths, strict=True)]
        finite = [v for v in values if math.isfinite(v)]
        quality[name] = (float(np.mean(finite)) if finite else math.inf, min(values))

    def everything(decode: Callable[[Path], Any]) -> Callable[[], None]:
        def one_pass() -> None:
            for path in paths:
                decode(path)

        return one_pass

    medians = interleaved({name: everything(decode) for name, decode in decoders.items()}, rounds=rounds)
    print(f"JPEG decoding to {size}x{size}, one process: {root} ({len(paths)} files{note}); "
          f"{torch.get_num_threads()} torch threads; {rounds} interleaved rounds")
    print(report("median per pass over the folder", medians, "before", unit="s", items=len(paths)))
    print("quality vs the full decode (PSNR, dB; inf = identical):")
    for name, (mean, worst) in quality.items():
        print(f"  {name:<38} mean {mean:6.1f}   worst {worst:6.1f}")
    spread = abs(medians["before"] / medians["before (A/A)"] - 1)
    speedup = medians["before"] / medians["after: ImageFolderDataset"]
    print(f"A/A: the same decoder timed twice differs by {spread:.0%}: ratios closer to 1 than that are noise")
    print(f"--no-cache decoding: {speedup:.2f}x the images/s of before, at {quality['reduced, margin 2'][0]:.1f} dB "
          "PSNR against a full decode")


def time_cache_build(root: Path, size: int, rounds: int, tmp: Path) -> None:
    """The DCGAN example's one-off cache build (decode + write) with 0, 1 and every core's worker processes."""
    cores = available_cpus()
    count = len(list_images(root))

    def build(workers: int) -> Callable[[], None]:
        def one() -> None:
            target = tmp / f"cache-{workers}"
            dataset, _report = prepare_cache(root, size, target, workers=workers)
            dataset.close()
            shutil.rmtree(target)

        return one

    variants = {"in this process (workers=0)": build(0), "1 worker (the old default on 2 cores)": build(1),
                f"every core ({cores} workers, the default now)": build(cores)}
    medians = interleaved(variants, rounds=rounds, warmup=1)
    print(report(f"DCGAN cache build of {count} files to {size}x{size} (reduced-scale decode + write)", medians,
                 "in this process (workers=0)", unit="s", items=count))


if __name__ == "__main__":
    main()

"""What bounds DCGAN training here: the data loader (IO) or the training step (SYNTHETIC)?

The IO / SYNTHETIC / FULL method: three measurements of the example's training, interleaved in one
process (machine noise hits all alike):

- ``IO``: the Trainer's data loader alone; batches arrive on the device, no model runs;
- ``SYNTHETIC``: the example's full D+G training step on one batch kept on the device (no loading);
- ``FULL``: both, as ``examples/dcgan.py`` trains (next batch, scale to [-1, 1], step).

Training is input-bound when IO delivers fewer images/s than SYNTHETIC consumes, else compute-bound;
FULL/SYNTHETIC says how much of the compute-only rate real training keeps, and FULL/min(IO, SYNTHETIC)
how well loading overlaps compute (1.0: perfectly; less: the two compete, e.g. for CPU cores). With ``--data PATH`` (or
``folder-demo``: a temporary folder of 480×360 JPEGs written first) both data paths of the example are
measured: the uint8 memory-mapped cache (decoded once) and decoding every file every epoch (an
``ImageFolderSource`` through ``trainer.dataloader``, i.e. ``--no-cache``). The device is synchronised
before each clock read; each timed block of a loader ends where it stands and the epoch is then read to
its end untimed, so no worker is busy while another variant is timed.

Run: python benchmarks/dcgan_throughput.py [--device auto] [--model tiny-32] [--batch-size 64] [--steps 20]
     [--rounds 5] [--data shapes|fake|folder-demo|PATH] [--workers N|N,M,...] [--precision auto] [--aa]
     [--decode-before]
``--workers 0,1,2`` compares loaders with those worker counts side by side; ``--aa`` times SYNTHETIC twice
to show this run's noise floor; ``--decode-before`` adds decoding every epoch as the torch loader did before
reduced-scale decoding (full-resolution decode, torchvision resize), to compare with reduced-scale decoding in one run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _before import BeforeImageFolder
from _dcgan import (
    PRESETS,
    BatchStream,
    DCGANStep,
    EpochDriver,
    FakeImages,
    ShapesDataset,
    make_demo_folder,
    prepare_cache,
    to_unit_range,
)
from _timing import interleaved, report

import devplug

EMBEDDED_NAMES = ("shapes", "embedded")


def bound_line(label: str, medians: dict[str, float], io: str, full: str) -> str:
    """The IO / SYNTHETIC / FULL verdict for one data path: which of IO and SYNTHETIC bounds FULL."""
    io_rate, syn_rate, full_rate = (1 / medians[k] for k in (io, "SYNTHETIC", full))
    verdict = "input-bound" if io_rate < syn_rate else "compute-bound"
    return (f"{label}: IO/SYNTHETIC = {io_rate / syn_rate:.2f}x, FULL/SYNTHETIC = {full_rate / syn_rate:.2f}x, "
            f"FULL/min(IO, SYNTHETIC) = {full_rate / min(io_rate, syn_rate):.2f}x -> {verdict}")


def main() -> None:
    """Build the Trainer, model and loader(s) the example would; time IO, SYNTHETIC and FULL interleaved."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--model", default="tiny-32", choices=list(PRESETS))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="batches per timed block")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median is reported)")
    parser.add_argument("--data", default="shapes",
                        help="shapes (embedded, default), fake, folder-demo, or a folder of images")
    parser.add_argument("--workers", default=None,
                        help="loader worker processes, or a comma-separated list to compare side by side; "
                             "'auto' is the Trainer's default (the device plugin measures the source and decides)")
    parser.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                        help="default: what the device plugin prefers")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="image cache of --data PATH (default: a temporary folder)")
    parser.add_argument("--demo-images", type=int, default=320, help="JPEGs written for --data folder-demo")
    parser.add_argument("--decode-before", action="store_true",
                        help="with a folder: also time decoding every epoch the way ImageFolderDataset did before "
                             "reduced-scale decoding (full decode + torchvision resize) as '(decode-before)', "
                             "side by side")
    parser.add_argument("--aa", action="store_true",
                        help="also time SYNTHETIC a second time as 'SYNTHETIC (A/A)': the two differ by noise "
                             "only, which shows how far apart equal things land on this machine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devplug-bench-") as tmp:
        try:
            run(args, Path(tmp))
        except devplug.DevplugError as exc:  # a missing or empty folder, an unknown device or precision
            raise SystemExit(f"dcgan_throughput: error: {exc}") from None


def run(args: argparse.Namespace, tmp: Path) -> None:
    """The benchmark proper; ``tmp`` holds the demo folder and the default cache."""
    spec = PRESETS[args.model]
    size, batch = spec.image_size, args.batch_size
    trainer = devplug.Trainer(device=args.device, precision=args.precision, seed=0, progress=False,
                              log_every=10**9)
    step = DCGANStep(trainer, spec)
    worker_counts: list[int | None] = [None if w.strip() == "auto" else int(w)
                                       for w in (args.workers or "auto").split(",")]
    sources: dict[str, tuple[Any, str]] = {}  # data kind ("" or "cache"/"decode") -> (data source, description)
    notes: list[str] = []
    if args.data in EMBEDDED_NAMES:
        # One timed block = one epoch, so the epoch can end between blocks (same per-image cost as 32,000 images).
        dataset: Any = ShapesDataset(size, length=batch * args.steps)
        sources[""] = dataset, f"embedded shapes ({size}x{size}, drawn per batch; epoch = one block)"
    elif args.data == "fake":
        sources[""] = FakeImages(size, length=batch * args.steps), f"fake (random {size}x{size} uint8 pool)"
    else:
        root = Path(args.data).expanduser()
        if args.data == "folder-demo":
            root = tmp / "images"
            seconds = make_demo_folder(root, args.demo_images)
            notes.append(f"folder-demo: wrote {args.demo_images} JPEGs of 480x360 to {root} in {seconds:.1f} s")
        workers = worker_counts[-1] if worker_counts[-1] is not None else min(8, max(0, (os.cpu_count() or 1) - 1))
        cached, cache_report = prepare_cache(root, size, args.cache_dir or tmp / "cache", workers=workers)
        notes.append(cache_report.describe() + " (one-off, not in the figures below)")
        if len(cached) < batch:
            raise SystemExit(f"{root} has {len(cached)} readable images, fewer than one batch of {batch}")
        sources["cache"] = cached, f"uint8 memmap cache of {root} ({len(cached)} images at {size}x{size})"
        sources["decode"] = (devplug.ImageFolderSource(str(root), image_size=size),
                             f"{root} decoded and resized every epoch (ImageFolderSource, no cache)")
        if args.decode_before:
            sources["decode-before"] = (BeforeImageFolder(root, size),
                                        f"{root} decoded every epoch as before reduced-scale decoding "
                                        "(full decode, torchvision)")
    driver = EpochDriver(trainer)
    # label -> stream; labels look like " (cache, workers=2)", or "" for one data source and one worker count
    streams: dict[str, BatchStream] = {}
    for kind, (source, description) in sources.items():
        for workers in worker_counts:
            parts = [kind] if kind else []
            parts += [f"workers={'auto' if workers is None else workers}"] if len(worker_counts) > 1 else []
            label = f" ({', '.join(parts)})" if parts else ""
            loader = trainer.dataloader(source, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
                                        pin_memory=args.pin_memory)
            streams[label] = driver.stream(loader)
            tuned = f" [{loader.choice.reason}]" if loader.choice.reason else ""
            notes.append(f"data{label}: {description}; loader {loader.implementation}{tuned}")
    first = next(iter(streams.values()))
    images, _labels = first.next()
    fixed = to_unit_range(images)  # SYNTHETIC's one batch, kept on the device
    first.finish_epoch()

    def io(label: str) -> Callable[[], None]:
        stream = streams[label]

        def run_io() -> None:
            for _ in range(args.steps):
                stream.next()
            trainer.synchronize()

        return run_io

    def synthetic() -> None:
        for _ in range(args.steps):
            step(fixed)
        trainer.synchronize()

    def full(label: str) -> Callable[[], None]:
        stream = streams[label]

        def run_full() -> None:
            for _ in range(args.steps):
                real, _labels = stream.next()
                step(to_unit_range(real))
            trainer.synchronize()

        return run_full

    variants: dict[str, Callable[[], None]] = {f"IO{label}": io(label) for label in streams}
    variants["SYNTHETIC"] = synthetic
    if args.aa:
        variants["SYNTHETIC (A/A)"] = synthetic
    variants.update({f"FULL{label}": full(label) for label in streams})
    after = {f"{kind}{label}": stream.finish_epoch for label, stream in streams.items() for kind in ("IO", "FULL")}
    medians = {name: t / args.steps for name, t in interleaved(variants, rounds=args.rounds, after=after).items()}

    print(f"DCGAN throughput (IO: loading alone, SYNTHETIC: compute on cached data, FULL: both) on {trainer.device} "
          f"(plugin {trainer.device.plugin_name}), "
          f"precision {trainer.precision.name} [{trainer.precision.description}], {torch.get_num_threads()} threads")
    print(f"model {args.model} (G {step.params_g:,} / D {step.params_d:,} parameters), optimizer "
          f"{step.implementation()}, batch {batch}, {args.steps} batches per block x {args.rounds} interleaved rounds")
    for note in notes:
        print(note)
    print(report("median per batch", medians, "SYNTHETIC", unit="s/batch", items=batch))
    for label in streams:
        print(bound_line(f"data{label}" if label else "verdict", medians, f"IO{label}", f"FULL{label}"))
    if args.aa:
        spread = abs(medians["SYNTHETIC"] / medians["SYNTHETIC (A/A)"] - 1)
        print(f"A/A: the same SYNTHETIC blocks timed twice differ by {spread:.0%}: "
              "ratios closer to 1 than that are noise")
    for label in streams:
        if "decode-before" in label:
            after = label.replace("decode-before", "decode")
            print(f"decode every epoch{label.replace('decode-before, ', '').replace(' (decode-before)', '')}, "
                  f"reduced-scale vs before: IO {medians[f'IO{label}'] / medians[f'IO{after}']:.2f}x, "
                  f"FULL {medians[f'FULL{label}'] / medians[f'FULL{after}']:.2f}x faster; FULL/SYNTHETIC "
                  f"{medians['SYNTHETIC'] / medians[f'FULL{label}']:.2f} before -> "
                  f"{medians['SYNTHETIC'] / medians[f'FULL{after}']:.2f} after")
    for label in streams:
        if "cache" in label:
            decode = label.replace("cache", "decode")
            ratio_io = medians[f"IO{decode}"] / medians[f"IO{label}"]
            ratio_full = medians[f"FULL{decode}"] / medians[f"FULL{label}"]
            print(f"cache vs decode every epoch{label.replace('cache, ', '').replace(' (cache)', '')}: "
                  f"IO {ratio_io:.2f}x, FULL {ratio_full:.2f}x faster with the cache")


if __name__ == "__main__":
    main()

"""Plain PyTorch vs ``examples/dcgan.py``, each with its defaults: whole-process DCGAN training images/s.

The question: how much faster does devplug's DCGAN example train on a folder of photos than a DCGAN written
the way pytorch/examples' ``dcgan/main.py`` trains, on the same images, model sizes, batch size and epochs?
(The target: the example at least 2x the reference with a warm cache on this CPU.)

``train`` is that reference, in plain PyTorch (no devplug import anywhere in this file): torchvision's
``datasets.ImageFolder`` with ``Resize`` + ``CenterCrop`` + ``ToTensor`` + ``Normalize`` applied per item, so
every file is decoded every epoch; ``DataLoader(batch_size=64, shuffle=True, num_workers=2)``; the DCGAN
generator and discriminator (nz 100, ngf 64, ndf 64 at 64x64: upstream's sizes, and the example's ``naive-64``
preset, which ``--model auto`` picks for a folder); a discriminator ending in a sigmoid with ``nn.BCELoss``;
``optim.Adam(lr=2e-4, betas=(0.5, 0.999))``; DCGAN init (conv N(0, 0.02), batch norm N(1, 0.02) and 0); fp32;
``.item()`` of the losses and D outputs every iteration and a line every ``--print-every`` iterations; with
``--outf``, upstream's outputs (real and fixed-noise sample grids every 100 iterations, both state dicts every
epoch); cuda if available, else the CPU. It ends with three parseable lines::

    reference: 1024 images in 21.3 s = 48.1 images/s (training loop, from the first batch requested)
    reference steady state: 960 images in 19.9 s = 48.2 images/s (after the first iteration)
    reference first step: done at Unix time 1764171234.567890 (time.time(), ...)

``compare`` (the default, what ``run_all.py`` runs) times WHOLE PROCESSES, each a fresh interpreter of the
same Python, clocked from outside (``time.perf_counter`` around ``subprocess.run``: start-up, imports,
model build, data preparation, training and exit), interleaved in rounds with ``_timing.interleaved`` (one
untimed warm-up per variant, then each round in a seeded shuffled order):

- ``reference``: ``reference_dcgan.py train --dataroot FOLDER --epochs N --batch-size 64 --outf TMP``;
- ``example (warm cache)``: ``examples/dcgan.py --data FOLDER --epochs N --batch-size 64 --cache-dir WARM
  --out TMP --no-progress``, everything else at its default (device, precision, loader workers, model
  ``auto``), with its image cache built once before any timing (``--cache-only``);
- ``example (cold cache)``: the same with a cache folder emptied before every run, so each run decodes the
  folder into its cache first (the time a first run on new data takes);
- ``example (warm cache, A/A)``: a second copy of the warm variant, whose ratio to the first is the noise
  floor of this run;
- ``floor``: a process that only imports torch and takes one ``torch.optim.Adam`` step on one tensor, what
  both scripts must do before any training (``torch.optim`` imports ``torch._dynamo`` on first use: about as
  long as ``import torch`` itself), started and ended as cheaply as the example's are (the garbage collector
  paused during the import and told to leave what exists alone, ``gc.freeze``). The closing lines give each
  script's time above it, the part its own work takes, and the best whole-process ratio this machine allows
  at this size: the reference's time over the floor plus the example's training loop alone.

Each run writes into its own temporary ``--out``/``--outf`` folder, removed after it; a failed run stops the
benchmark with its exit status and the tail of its output. images/s = images x epochs / process wall time.
A second table gives each script's own steady-state rate (its clock from the end of its first iteration,
what the example's ``summary.json`` reports as ``images_per_sec``), and a third where a process's time went
(outside the training loop: interpreter, imports, models, data set or cache build, final save, exit) and how
long each took from its launch to the end of its first training step (start-up: the launch's ``time.time()``
noted here, the first step's in the reference's last line and the example's ``summary.json``
``first_step_unix_time``). A fourth table gives each process's CPU seconds (user + system, its loader workers
included, from ``getrusage(RUSAGE_CHILDREN)``): on a machine other jobs load, wall time measures the load as much
as the program, CPU time much less so (threads spinning while they wait still count).

The demo folder: ``--images`` photo-like 480x360 JPEGs (``_photos.make_demo_folder``; the size of the photos
in a typical DCGAN image folder) in one class sub-folder (``ImageFolder`` needs one); ``--images`` is
rounded down to a multiple of ``--batch-size`` because the example drops a last partial batch and upstream
does not, so both train the same images.
``--folder PATH`` keeps the folder (written there if PATH does not exist) to reuse in a later run.
``--example-precision 32-true`` runs the example in fp32, what its ``auto`` picks on a CPU without native bf16:
the target there is 1x, which this shows on a host with bf16 too (the last line names the target it applied).

Run: python benchmarks/reference_dcgan.py [compare] [--images 128] [--epochs 2] [--rounds 2] [--warmup 0]
     [--batch-size 64] [--example-precision PRECISION] [--folder PATH]
     python benchmarks/reference_dcgan.py train --dataroot DIR [--epochs 5] [--batch-size 64] [--workers 2]
     [--image-size 64] [--nz 100] [--ngf 64] [--ndf 64] [--lr 2e-4] [--beta1 0.5] [--print-every 1]
     [--outf DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLE = REPO / "examples" / "dcgan.py"

#: The reference's closing lines (``train`` prints them, ``compare`` parses them).
RESULT_RE = re.compile(r"^reference: (\d+) images in ([\d.]+) s = ([\d.]+) images/s", re.MULTILINE)
STEADY_RE = re.compile(r"^reference steady state: (\d+) images in ([\d.]+) s = ([\d.]+) images/s", re.MULTILINE)
FIRST_STEP_RE = re.compile(r"^reference first step: done at Unix time ([\d.]+)", re.MULTILINE)
DEVICE_RE = re.compile(r"^reference: device .*$", re.MULTILINE)
#: The floor variant's program and its one line.
FLOOR_PROGRAM = ("import gc\nimport time\ngc.disable()\nimport torch\ngc.enable()\ngc.freeze()\n"
                 "p = torch.zeros(1, requires_grad=True)\np.sum().backward()\ntorch.optim.Adam([p]).step()\n"
                 "print(f'floor: first step done at Unix time {time.time():.6f}')\ngc.freeze()\n")
FLOOR_RE = re.compile(r"^floor: first step done at Unix time ([\d.]+)", re.MULTILINE)


# ---------------------------------------------------------------------------------------------------------
# train: the plain-PyTorch reference
# ---------------------------------------------------------------------------------------------------------


def train_parser() -> argparse.ArgumentParser:
    """Flags of ``train`` (the sizes default to upstream's, which are the example's ``naive-64``)."""
    parser = argparse.ArgumentParser(
        prog="reference_dcgan.py train",
        description="Plain-PyTorch DCGAN trained the way pytorch/examples' dcgan/main.py trains (no devplug).",
    )
    parser.add_argument("--dataroot", required=True, help="an image folder with one sub-folder per class")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (default: 2)")
    parser.add_argument("--image-size", type=int, default=64, help="a power of two >= 16 (upstream: 64)")
    parser.add_argument("--nz", type=int, default=100)
    parser.add_argument("--ngf", type=int, default=64)
    parser.add_argument("--ndf", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--beta1", type=float, default=0.5)
    parser.add_argument("--print-every", type=int, default=1,
                        help="iterations between progress lines (default: 1, every iteration, as upstream)")
    parser.add_argument("--outf", type=Path, default=None,
                        help="write upstream's outputs here: sample grids every 100 iterations, state dicts "
                             "every epoch (default: none)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def build_networks(nz: int, ngf: int, ndf: int, image_size: int) -> tuple[Any, Any]:
    """The DCGAN generator (tanh output) and discriminator (sigmoid output), DCGAN-initialised.

    At 64x64 these are upstream's layers: G widths ngf*8, *4, *2, *1; D widths ndf*1, *2, *4, *8.
    """
    from torch import nn

    if image_size < 16 or image_size & (image_size - 1):
        raise SystemExit(f"reference: --image-size must be a power of two >= 16, got {image_size}")
    blocks = image_size.bit_length() - 3  # stride-2 steps between 4x4 and the image size: 4 at 64x64

    g_layers: list[nn.Module] = []
    width = ngf * 2 ** (blocks - 1)
    g_layers += [nn.ConvTranspose2d(nz, width, 4, 1, 0, bias=False), nn.BatchNorm2d(width), nn.ReLU(True)]
    for _ in range(blocks - 1):
        g_layers += [nn.ConvTranspose2d(width, width // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width // 2),
                     nn.ReLU(True)]
        width //= 2
    g_layers += [nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False), nn.Tanh()]

    d_layers: list[nn.Module] = [nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
    width = ndf
    for _ in range(blocks - 1):
        d_layers += [nn.Conv2d(width, width * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width * 2),
                     nn.LeakyReLU(0.2, inplace=True)]
        width *= 2
    d_layers += [nn.Conv2d(width, 1, 4, 1, 0, bias=False), nn.Sigmoid()]

    def init(module: nn.Module) -> None:
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.normal_(module.weight, 1.0, 0.02)
            nn.init.constant_(module.bias, 0.0)

    generator, discriminator = nn.Sequential(*g_layers), nn.Sequential(*d_layers)
    generator.apply(init)
    discriminator.apply(init)
    return generator, discriminator


def train(argv: Sequence[str]) -> int:
    """The reference training run; prints its image count, wall time and images/s at the end."""
    parser = train_parser()
    args = parser.parse_args(argv)
    for flag in ("epochs", "batch_size", "print_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    import torch
    from torch import nn, optim
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms
    from torchvision.utils import save_image

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True

    size = args.image_size
    dataset = datasets.ImageFolder(args.dataroot, transform=transforms.Compose([
        transforms.Resize(size),
        transforms.CenterCrop(size),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ]))
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)

    net_g, net_d = build_networks(args.nz, args.ngf, args.ndf, size)
    net_g, net_d = net_g.to(device), net_d.to(device)
    criterion = nn.BCELoss()
    opt_d = optim.Adam(net_d.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    opt_g = optim.Adam(net_g.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    fixed_noise = torch.randn(args.batch_size, args.nz, 1, 1, device=device)
    real_label, fake_label = 1.0, 0.0
    if args.outf is not None:
        args.outf.mkdir(parents=True, exist_ok=True)
    print(f"reference: device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{len(dataset)} images, batch {args.batch_size}, {args.workers} workers, {size}x{size}, "
          f"nz {args.nz} ngf {args.ngf} ndf {args.ndf}", flush=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    images = steady_images = 0
    steady_start: float | None = None
    first_step_unix_time = 0.0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for i, (real_cpu, _labels) in enumerate(loader):
            # (1) D: maximise log D(x) + log(1 - D(G(z))), real and fake halves back-propagated separately.
            net_d.zero_grad()
            real = real_cpu.to(device)
            batch = real.size(0)
            label = torch.full((batch,), real_label, dtype=real.dtype, device=device)
            output = net_d(real).view(-1)
            loss_d_real = criterion(output, label)
            loss_d_real.backward()
            d_x = output.mean().item()

            noise = torch.randn(batch, args.nz, 1, 1, device=device)
            fake = net_g(noise)
            label.fill_(fake_label)
            output = net_d(fake.detach()).view(-1)
            loss_d_fake = criterion(output, label)
            loss_d_fake.backward()
            d_g_z1 = output.mean().item()
            loss_d = loss_d_real + loss_d_fake
            opt_d.step()

            # (2) G: maximise log D(G(z)) (the fakes labelled real).
            net_g.zero_grad()
            label.fill_(real_label)
            output = net_d(fake).view(-1)
            loss_g = criterion(output, label)
            loss_g.backward()
            d_g_z2 = output.mean().item()
            opt_g.step()

            loss_d_value, loss_g_value = loss_d.item(), loss_g.item()
            if i % args.print_every == 0:
                print(f"[{epoch}/{args.epochs}][{i}/{len(loader)}] Loss_D: {loss_d_value:.4f} "
                      f"Loss_G: {loss_g_value:.4f} D(x): {d_x:.4f} D(G(z)): {d_g_z1:.4f} / {d_g_z2:.4f}",
                      flush=True)
            if args.outf is not None and i % 100 == 0:
                save_image(real_cpu, args.outf / "real_samples.png", normalize=True)
                samples = net_g(fixed_noise)
                save_image(samples.detach(), args.outf / f"fake_samples_epoch_{epoch:03d}.png", normalize=True)
            images += batch
            if steady_start is None:
                sync()
                steady_start = time.perf_counter()
                first_step_unix_time = time.time()
            else:
                steady_images += batch
        if args.outf is not None:
            torch.save(net_g.state_dict(), args.outf / f"netG_epoch_{epoch}.pth")
            torch.save(net_d.state_dict(), args.outf / f"netD_epoch_{epoch}.pth")
    sync()
    end = time.perf_counter()
    wall = end - start
    print(f"reference: {images} images in {wall:.3f} s = {images / wall:.3f} images/s "
          "(training loop, from the first batch requested)")
    if steady_start is not None and steady_images:
        steady = end - steady_start
        print(f"reference steady state: {steady_images} images in {steady:.3f} s = {steady_images / steady:.3f} "
              "images/s (after the first iteration)")
    else:  # one iteration only: the whole loop, as the example's summary does then
        print(f"reference steady state: {images} images in {wall:.3f} s = {images / wall:.3f} images/s "
              "(one iteration only: the whole loop)")
    print(f"reference first step: done at Unix time {first_step_unix_time:.6f} (time.time(), for a launcher that "
          "noted when it started this process)")
    return 0


# ---------------------------------------------------------------------------------------------------------
# compare: whole processes, interleaved
# ---------------------------------------------------------------------------------------------------------


def compare_parser() -> argparse.ArgumentParser:
    """Flags of ``compare`` (the default)."""
    parser = argparse.ArgumentParser(prog="reference_dcgan.py [compare]", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=128,
                        help="JPEGs in the demo folder, rounded down to a multiple of --batch-size (default: 128)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (default: 2)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timed rounds (default: 2)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed runs of each variant first (default: 0)")
    parser.add_argument("--batch-size", type=int, default=64, help="for every variant (default: 64, upstream's)")
    parser.add_argument("--example-precision", default=None, metavar="PRECISION",
                        help="run the example in this precision (32-true: what it runs on a CPU without native bf16, "
                             "where the target is 1x; default: its own choice, auto)")
    parser.add_argument("--folder", type=Path, default=None,
                        help="image folder to use (one sub-folder per class); written with --images demo JPEGs "
                             "if it does not exist, and kept (default: a temporary folder)")
    return parser


def count_images(folder: Path) -> int:
    """Files with an image extension torchvision's ``ImageFolder`` accepts, in ``folder``'s tree."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return sum(1 for _dir, _subdirs, files in os.walk(folder) for name in files
               if name.lower().endswith(IMG_EXTENSIONS))


def tail(text: str, chars: int = 3000) -> str:
    """The end of a process's output, for an error message."""
    return text if len(text) <= chars else "..." + text[-chars:]


class Variant:
    """One command run as a whole process per call; its results are checked and kept after every call."""

    def __init__(self, name: str, command: Callable[[Path], list[str]], tmp: Path, env: dict[str, str],
                 warmup: int, parse: Callable[[Variant, subprocess.CompletedProcess[str], Path], dict[str, Any]],
                 before_each: Callable[[], None] | None = None) -> None:
        self.name, self.command, self.tmp, self.env = name, command, tmp, env
        self.parse, self.before_each = parse, before_each
        self.warmup_left = warmup
        self.calls = 0
        self.results: list[dict[str, Any]] = []  # timed runs only
        self._out: Path = self._next_out()
        self._proc: subprocess.CompletedProcess[str] | None = None
        self._launched = 0.0
        self._cpu = 0.0
        if before_each is not None:
            before_each()

    def _next_out(self) -> Path:
        self.calls += 1
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return self.tmp / f"out-{slug}-{self.calls}"

    def run(self) -> None:
        """The timed part: the whole process, nothing else (the launch's wall-clock time is noted first)."""
        self._launched = time.time()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._proc = subprocess.run(self.command(self._out), capture_output=True, text=True, env=self.env,
                                    cwd=REPO, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the process and its (waited-for) loader workers
        self._cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

    def after(self) -> None:
        """Untimed: check the exit status, parse the results, remove the run's outputs, prepare the next run."""
        proc, out = self._proc, self._out
        assert proc is not None
        if proc.returncode != 0:
            raise SystemExit(f"reference_dcgan: {self.name} failed with exit status {proc.returncode}\n"
                             f"command: {' '.join(proc.args)}\n--- stdout (tail) ---\n{tail(proc.stdout)}\n"
                             f"--- stderr (tail) ---\n{tail(proc.stderr)}")
        result = self.parse(self, proc, out)
        result["first_step_s"] = result.pop("first_step_unix_time") - self._launched  # process start -> 1st step
        result["cpu_s"] = self._cpu
        if self.warmup_left > 0:
            self.warmup_left -= 1
        else:
            self.results.append(result)
        shutil.rmtree(out, ignore_errors=True)
        self._out = self._next_out()
        if self.before_each is not None:
            self.before_each()


def parse_reference(variant: Variant, proc: subprocess.CompletedProcess[str], _out: Path) -> dict[str, Any]:
    """Image count, loop time and steady-state rate from the reference's closing lines."""
    result, steady, device = RESULT_RE.search(proc.stdout), STEADY_RE.search(proc.stdout), DEVICE_RE.search(
        proc.stdout)
    first = FIRST_STEP_RE.search(proc.stdout)
    if result is None or steady is None or device is None or first is None:
        raise SystemExit(f"reference_dcgan: {variant.name}: no result lines in its output\n{tail(proc.stdout)}")
    return {"images": int(result[1]), "loop_s": float(result[2]), "steady_images": int(steady[1]),
            "steady_rate": float(steady[3]), "about": device[0].removeprefix("reference: "),
            "first_step_unix_time": float(first[1])}


def parse_floor(variant: Variant, proc: subprocess.CompletedProcess[str], _out: Path) -> dict[str, Any]:
    """The floor process's one line (it trains no image)."""
    first = FLOOR_RE.search(proc.stdout)
    if first is None:
        raise SystemExit(f"reference_dcgan: {variant.name}: no result line in its output\n{tail(proc.stdout)}")
    return {"images": 0, "loop_s": 0.0, "steady_rate": float("nan"), "about": "import torch, one Adam step",
            "first_step_unix_time": float(first[1])}


def parse_example(cache_built: bool) -> Callable[[Variant, subprocess.CompletedProcess[str], Path], dict[str, Any]]:
    """A parser of the example's ``summary.json`` that also checks the cache was (cold) or was not (warm) built."""

    def parse(variant: Variant, proc: subprocess.CompletedProcess[str], out: Path) -> dict[str, Any]:
        path = out / "summary.json"
        if not path.is_file():
            raise SystemExit(f"reference_dcgan: {variant.name}: no {path}\n{tail(proc.stdout)}")
        summary = json.loads(path.read_text())
        if summary["status"] != "finished" or bool(summary["cache_built"]) != cache_built:
            raise SystemExit(f"reference_dcgan: {variant.name}: status {summary['status']!r}, cache_built "
                             f"{summary['cache_built']} (expected {cache_built})\n{tail(proc.stdout)}")
        about = (f"device {summary['device']}, precision {summary['precision']} ({summary['precision_detail']}), "
                 f"optimizer {summary['optimizer_g']}, loader {summary['loader']}, model {summary['model']}")
        return {"images": int(summary["images_this_run"]), "loop_s": float(summary["wall_seconds"]),
                "precision": summary["precision"],
                "steady_rate": float(summary["images_per_sec"]), "about": about,
                "first_step_unix_time": float(summary.get("first_step_unix_time") or "nan")}

    return parse


def compare(argv: Sequence[str]) -> int:
    """Build the demo folder and the warm cache, time the four variants and the floor as whole processes, print
    the tables."""
    parser = compare_parser()
    args = parser.parse_args(argv)
    for flag in ("images", "epochs", "rounds", "batch_size"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    from _photos import make_demo_folder
    from _timing import interleaved, report

    batch = args.batch_size
    wanted = max(batch, args.images // batch * batch)
    with tempfile.TemporaryDirectory(prefix="devplug-bench-") as tmp_name:
        tmp = Path(tmp_name)
        folder = args.folder.expanduser() if args.folder is not None else tmp / "images"
        if folder.exists():
            note = "existing folder"
        else:
            seconds = make_demo_folder(folder / "photos", wanted)
            note = f"wrote {wanted} photo-like 480x360 JPEGs in {seconds:.1f} s"
        images = count_images(folder)
        if images < batch or images % batch:
            raise SystemExit(f"reference_dcgan: {folder} holds {images} images; use a multiple of --batch-size "
                             f"({batch}): the example drops a last partial batch, upstream's loader does not")
        total = images * args.epochs

        env = dict(os.environ)  # the example imports the devplug of this checkout
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        warm, cold = tmp / "cache-warm", tmp / "cache-cold"
        start = time.perf_counter()
        built = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(folder), "--cache-dir", str(warm),
                                "--cache-only"],
                               capture_output=True, text=True, env=env, cwd=REPO, check=False)
        if built.returncode != 0:
            raise SystemExit(f"reference_dcgan: building the warm cache failed ({built.returncode})\n"
                             f"{tail(built.stdout)}\n{tail(built.stderr)}")
        cache_seconds = time.perf_counter() - start

        def reference(out: Path) -> list[str]:
            return [sys.executable, str(Path(__file__).resolve()), "train", "--dataroot", str(folder),
                    "--epochs", str(args.epochs), "--batch-size", str(batch), "--outf", str(out)]

        precision = ["--precision", args.example_precision] if args.example_precision else []

        def example(cache: Path) -> Callable[[Path], list[str]]:
            return lambda out: [sys.executable, str(EXAMPLE), "--data", str(folder), "--epochs", str(args.epochs),
                                "--batch-size", str(batch), "--cache-dir", str(cache), "--out", str(out),
                                "--no-progress", *precision]

        def empty_cold() -> None:
            shutil.rmtree(cold, ignore_errors=True)

        specs = [
            Variant("reference", reference, tmp, env, args.warmup, parse_reference),
            Variant("example (warm cache)", example(warm), tmp, env, args.warmup, parse_example(False)),
            Variant("example (cold cache)", example(cold), tmp, env, args.warmup, parse_example(True), empty_cold),
            Variant("example (warm cache, A/A)", example(warm), tmp, env, args.warmup, parse_example(False)),
        ]
        variants = {v.name: v for v in specs}
        floor = Variant("floor", lambda _out: [sys.executable, "-c", FLOOR_PROGRAM], tmp, env, args.warmup,
                        parse_floor)
        timed = {**variants, floor.name: floor}
        medians = interleaved({n: v.run for n, v in timed.items()}, rounds=args.rounds, warmup=args.warmup,
                              after={n: v.after for n, v in timed.items()})
        floor_s = medians.pop(floor.name)
        for variant in specs:
            counts = {r["images"] for r in variant.results}
            if counts != {total}:
                raise SystemExit(f"reference_dcgan: {variant.name} trained {sorted(counts)} images per run, "
                                 f"expected {total} ({images} x {args.epochs} epochs)")

    print(f"Plain PyTorch (pytorch/examples' DCGAN) vs examples/dcgan.py, each with its defaults: whole processes, "
          f"{images} images ({note}) x {args.epochs} epochs = {total} images per run, batch {batch}; "
          f"{os.cpu_count()} CPUs; {args.warmup} warm-up + {args.rounds} interleaved rounds")
    print(f"reference: {variants['reference'].results[0]['about']}; ImageFolder decoded every epoch, fp32, BCELoss")
    print(f"example: {variants['example (warm cache)'].results[0]['about']}")
    print(f"warm cache: built once before timing in {cache_seconds:.1f} s (a whole --cache-only process, untimed)")
    print(report("whole process, start to exit (images/s = images x epochs / wall)", medians, "reference",
                 unit="s", items=total))
    steady = {name: statistics.median(r["steady_rate"] for r in v.results) for name, v in variants.items()}
    print(report("each script's own steady-state clock (after its first iteration; the example's summary.json "
                 "images_per_sec)", {name: total / rate for name, rate in steady.items()}, "reference",
                 unit="s", items=total))
    print("where a process's time went (medians; start -> 1st step: from the launch to the end of its first "
          "training step)")
    print(f"{'variant':<40} {'process s':>10} {'training loop s':>16} {'outside loop s':>15} "
          f"{'start -> 1st step s':>20}")
    for name, variant in variants.items():
        loop = statistics.median(r["loop_s"] for r in variant.results)
        first = statistics.median(r["first_step_s"] for r in variant.results)
        print(f"{name:<40} {medians[name]:>10.2f} {loop:>16.2f} {medians[name] - loop:>15.2f} {first:>20.2f}")
    cpu = {name: statistics.median(r["cpu_s"] for r in v.results) for name, v in variants.items()}
    print(report("CPU seconds of each whole process and its loader workers (user + system; steadier than wall time "
                 "on a loaded machine, though idle-spinning threads count too)", cpu, "reference", unit="s",
                 items=total))
    warm_ratio = medians["reference"] / medians["example (warm cache)"]
    cold_ratio = medians["reference"] / medians["example (cold cache)"]
    aa = medians["example (warm cache)"] / medians["example (warm cache, A/A)"]
    print(f"A/A: the same warm-cache run timed twice differs by {abs(aa - 1) * 100:.0f}% ({aa:.2f}x): ratios closer "
          "to 1 than that are noise")
    loop = statistics.median(r["loop_s"] for r in variants["example (warm cache)"].results)
    print(f"floor: a process that imports torch and takes one torch.optim.Adam step (the collector paused during the "
          f"import and frozen, as the example's) takes {floor_s:.2f} s (median); "
          f"above it, the reference takes {medians['reference'] - floor_s:.2f} s and the example (warm cache) "
          f"{medians['example (warm cache)'] - floor_s:.2f} s: "
          f"{(medians['reference'] - floor_s) / (medians['example (warm cache)'] - floor_s):.2f}x. With nothing "
          f"but its training loop above the floor, the example would be {medians['reference'] / (floor_s + loop):.2f}x "
          "the reference (the best whole-process ratio at this size on this machine)")
    # 2x where the example trains in a lower precision than the reference's fp32, 1x where it cannot
    target = 1.0 if variants["example (warm cache)"].results[0]["precision"] == "32-true" else 2.0
    verdict = "met" if warm_ratio >= target else "NOT met"
    print(f"example vs reference, whole process: {warm_ratio:.2f}x with a warm cache, {cold_ratio:.2f}x with a cold "
          f"one (> 1 = faster); target (>= {target:g}x warm): {verdict}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``train ...`` runs the reference; anything else (``compare`` or no subcommand) the comparison."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    if tokens[:1] == ["train"]:
        return train(tokens[1:])
    if tokens[:1] == ["compare"]:
        tokens = tokens[1:]
    return compare(tokens)


if __name__ == "__main__":
    sys.exit(main())

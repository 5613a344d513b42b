"""What importing devplug, and building a Trainer, costs on top of ``import torch``, side by side with Accelerate's.

Each sample is a fresh interpreter that imports torch, then times one statement in process: wall-clock
(``time.perf_counter``) and CPU time (``time.process_time``), so the interpreter's start and torch itself
are left out, and a statement that builds an object (``Trainer()``) counts its work besides importing.
Modules load from cached bytecode, as from an installed package: the children run with bytecode writing
on (``PYTHONDONTWRITEBYTECODE`` removed), and a warm-up round writes the caches before anything is timed.
The statements take turns, shuffled anew each round, and the report gives each one's medians and its paired
ratio to ``import accelerate`` (a ratio within a round, then the median over rounds). Two arms run
``from devplug import Trainer`` (the A/A): their ratio is the noise floor of this machine now. On a loaded
machine read the CPU-time ratio: it moves less with the load than the wall-clock one.

    python benchmarks/import_cost.py --rounds 15

Accelerate (and Lightning Fabric) are measured where installed and named as skipped where not.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Each arm: a label and the statement run after ``import torch``.
DEVPLUG_ARMS: dict[str, str] = {
    "import devplug": "import devplug",
    "from devplug import Trainer": "from devplug import Trainer",
    "from devplug import Trainer (A/A)": "from devplug import Trainer",
    "from devplug import Trainer; Trainer()": "from devplug import Trainer; Trainer()",
}
#: The peers' arms, and the module each needs installed.
PEER_ARMS: dict[str, tuple[str, str]] = {
    "import accelerate": ("import accelerate", "accelerate"),
    "from accelerate import Accelerator": ("from accelerate import Accelerator", "accelerate"),
    "from accelerate import Accelerator; Accelerator()": ("from accelerate import Accelerator; Accelerator(cpu=True)",
                                                          "accelerate"),
    "from lightning.fabric import Fabric": ("from lightning.fabric import Fabric", "lightning"),
}
BASELINE = "import accelerate"

#: What each child runs: torch first, then the statement, timed; the last line printed is "wall cpu" in seconds.
_CHILD = """\
import time
import torch
wall, cpu = time.perf_counter(), time.process_time()
{statement}
print(time.perf_counter() - wall, time.process_time() - cpu)
"""


def child_environment() -> dict[str, str]:
    """The children's environment: this checkout first on the path, and bytecode caches written and read."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # set, every devplug module would be compiled from source each time
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def measure(statement: str, cwd: str | os.PathLike[str] | None = None) -> tuple[float, float]:
    """Seconds of wall-clock and of CPU time ``statement`` takes on top of torch, in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(statement=statement)], capture_output=True,
                          text=True, env=child_environment(), cwd=cwd, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{statement!r} failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    wall, cpu = proc.stdout.split()[-2:]
    return float(wall), float(cpu)


def machine() -> str:
    """The CPU model and load, for the record: figures on a loaded machine are noisier."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    return f"{model}, {os.cpu_count()} CPUs, load average {load}; Python {platform.python_version()}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds (paired medians)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    arms = dict(DEVPLUG_ARMS)
    skipped = []
    for label, (statement, module) in PEER_ARMS.items():
        if importlib.util.find_spec(module) is None:
            skipped.append(f"{label} (skipped: {module} is not installed)")
        else:
            arms[label] = statement
    print(f"machine: {machine()}")
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in arms}
    order, shuffle = list(arms), random.Random(0).shuffle
    with tempfile.TemporaryDirectory() as cwd:  # whatever a statement writes lands here
        for label in order:  # warm-up: the file system cache, bytecode caches
            measure(arms[label], cwd)
        for _ in range(args.rounds):
            shuffle(order)
            for label in order:
                samples[label].append(measure(arms[label], cwd))
    baseline = BASELINE if BASELINE in samples else "from devplug import Trainer"
    print(f"cost on top of `import torch`, medians of {args.rounds} interleaved rounds (wall-clock and CPU time)")
    print(f"{'statement':<52} {'wall ms':>8} {'cpu ms':>8} {'wall vs':>8} {'cpu vs':>8}")
    for label, pairs in samples.items():
        ratios = [statistics.median(t[i] / b[i] for t, b in zip(pairs, samples[baseline], strict=True))
                  for i in (0, 1)]
        print(f"{label:<52} {1e3 * statistics.median(t[0] for t in pairs):>8.1f} "
              f"{1e3 * statistics.median(t[1] for t in pairs):>8.1f} {ratios[0]:>7.2f}x {ratios[1]:>7.2f}x")
    print(f"(ratios to {baseline}, paired within each round)")
    aa, a = samples["from devplug import Trainer (A/A)"], samples["from devplug import Trainer"]
    floors = [statistics.median(x[i] / y[i] for x, y in zip(aa, a, strict=True)) for i in (0, 1)]
    print(f"A/A floor: from devplug import Trainer vs itself {floors[0]:.2f}x wall, {floors[1]:.2f}x cpu")
    for line in skipped:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

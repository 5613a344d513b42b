"""What importing devplug costs on top of ``import torch``, side by side with Accelerate's (and Fabric's).

Each sample is a fresh interpreter running ``python -X importtime -c "import torch; <statement>"``; the cost
of the statement is the sum of the cumulative times ``-X importtime`` reports for the modules it imported
that torch had not (the top-level entries after torch's own), so the interpreter's start and torch itself
are left out. The statements take turns, shuffled anew each round, and the report gives each one's median
and its paired ratio to ``import accelerate`` (a ratio within a round, then the median over rounds). Two
arms run ``from devplug import Trainer`` (the A/A): their ratio is the noise floor of this machine now.

    python benchmarks/import_cost.py --rounds 15

Accelerate (and Lightning Fabric) are measured where installed and named as skipped where not.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import random
import re
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Each arm: a label and the statement run after ``import torch``.
DEVPLUG_ARMS: dict[str, str] = {
    "import devplug": "import devplug",
    "from devplug import Trainer": "from devplug import Trainer",
    "from devplug import Trainer (A/A)": "from devplug import Trainer",
}
#: The peers' arms, and the module each needs installed.
PEER_ARMS: dict[str, tuple[str, str]] = {
    "import accelerate": ("import accelerate", "accelerate"),
    "from accelerate import Accelerator": ("from accelerate import Accelerator", "accelerate"),
    "from lightning.fabric import Fabric": ("from lightning.fabric import Fabric", "lightning"),
}
BASELINE = "import accelerate"

_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|( *)(\S+)\s*$")


def imported_after(stderr: str, anchor: str = "torch") -> float:
    """Seconds: the cumulative import times of the top-level modules ``-X importtime`` lists after ``anchor``."""
    total_us, seen_anchor = 0, False
    for line in stderr.splitlines():
        match = _LINE.match(line)
        if match is None or len(match[3]) > 1:  # not an entry, or a module imported by another (counted in its parent)
            continue
        if seen_anchor:
            total_us += int(match[2])
        elif match[4] == anchor:
            seen_anchor = True
    if not seen_anchor:
        raise RuntimeError(f"-X importtime listed no top-level {anchor!r}: {stderr[-500:]}")
    return total_us / 1e6


def measure(statement: str) -> float:
    """Seconds ``statement`` spends importing on top of torch, in a fresh interpreter."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import torch; {statement}"],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{statement!r} failed: {proc.stderr.strip().splitlines()[-1]}")
    return imported_after(proc.stderr)


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
    samples: dict[str, list[float]] = {label: [] for label in arms}
    order, shuffle = list(arms), random.Random(0).shuffle
    for label in order:  # warm-up: the file system cache, .pyc files
        measure(arms[label])
    for _ in range(args.rounds):
        shuffle(order)
        for label in order:
            samples[label].append(measure(arms[label]))
    baseline = BASELINE if BASELINE in samples else "from devplug import Trainer"
    print(f"import cost on top of `import torch` (-X importtime), median of {args.rounds} interleaved rounds")
    print(f"{'statement':<40} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'vs ' + baseline:>24}")
    for label, times in samples.items():
        ratio = statistics.median(t / b for t, b in zip(times, samples[baseline], strict=True))
        print(f"{label:<40} {1e3 * statistics.median(times):>10.1f} {1e3 * min(times):>8.1f} "
              f"{1e3 * max(times):>8.1f} {ratio:>23.2f}x")
    aa, a = samples["from devplug import Trainer (A/A)"], samples["from devplug import Trainer"]
    floor = statistics.median(x / y for x, y in zip(aa, a, strict=True))
    print(f"A/A floor: from devplug import Trainer vs itself {floor:.2f}x")
    for line in skipped:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every benchmark in this folder in turn (each prints its own side-by-side ratios)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    """Run each benchmark script with default arguments; return non-zero if any failed."""
    failed = 0
    for script in sorted(HERE.glob("*.py")):
        if script.name.startswith("_") or script.name == "run_all.py":
            continue
        print(f"\n=== {script.name} ===", flush=True)
        failed |= subprocess.run([sys.executable, str(script)], cwd=HERE).returncode != 0
    return failed


if __name__ == "__main__":
    sys.exit(main())

"""Run every benchmark in this folder in turn (each prints its own side-by-side ratios)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    """Run each benchmark script with default arguments; return non-zero if any failed."""
    failed = 0
    for script in sorted(HERE.glob("*.py")):
        if script.name.startswith("_") or script.name == "run_all.py":
            continue
        print(f"\n=== {script.name} ===", flush=True)
        start = time.perf_counter()
        code = subprocess.run([sys.executable, str(script)], cwd=HERE).returncode
        status = "ok" if code == 0 else f"FAILED (exit status {code})"
        print(f"=== {script.name}: {status}, {time.perf_counter() - start:.0f} s ===", flush=True)
        failed |= code != 0
    return failed


if __name__ == "__main__":
    sys.exit(main())

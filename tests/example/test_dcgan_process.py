"""The DCGAN example as a process: what its launcher costs around the training (the garbage collector)."""

from __future__ import annotations

import os
import subprocess
import sys

from paths import REPO

# Counts the collections of each generation while the launcher runs (``--help``: imports, then argparse).
COUNTING = """
import atexit, gc, runpy, sys
counts = [0, 0, 0]
def count(phase, info):
    if phase == "start":
        counts[info["generation"]] += 1
gc.callbacks.append(count)
atexit.register(lambda: print("collections", *counts))
sys.argv = ["examples/dcgan.py", "--help"]
runpy.run_path("examples/dcgan.py", run_name="__main__")
"""


def test_the_launcher_imports_torch_without_full_collections():
    # torch and its dependencies make millions of objects that live as long as the process: with the collector
    # on while they are imported, it swept them hundreds of times (three full collections) for nothing
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "examples"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", COUNTING], capture_output=True, text=True, cwd=REPO, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    young, _middle, full = map(int, line.split()[1:])
    assert full == 0 and young < 50, line
    assert gc_enabled_after_launch(env)


def gc_enabled_after_launch(env: dict[str, str]) -> bool:
    """True when the collector is on again once the launcher has imported the example."""
    script = "import gc, runpy; runpy.run_path('examples/dcgan.py'); print(gc.isenabled())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, env=env,
                          check=True)
    return done.stdout.strip().splitlines()[-1] == "True"

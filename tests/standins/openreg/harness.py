"""Test-only: build the openreg backend once per session and run code on it in child processes.

A process can register one PrivateUse1 backend only, and once registered it is torch's current
accelerator for the rest of the process; so the test process itself never loads it. Each test runs its
code in a child process whose ``PYTHONPATH`` holds this folder: the package ``devplug_openreg`` and its
distribution metadata, whose ``torch.backends`` entry point makes ``import torch`` load the backend (as
an installed out-of-tree backend does). Variants are environment variables (see ``devplug_openreg``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
#: The marker the child prints when no compiler is here (the session then skips, saying why).
UNAVAILABLE = "OPENREG-BUILD-UNAVAILABLE:"
_BUILD = f"""
try:
    import devplug_openreg
except Exception as exc:
    if type(exc).__name__ == "BuildUnavailable":
        print({UNAVAILABLE!r} + str(exc))
        raise SystemExit(3)
    raise
"""


@attrs.frozen
class OpenReg:
    """The built backend: how long the build (or the cached load) took, and ways to run code on the device."""

    build_seconds: float

    def env(self, variant: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """The environment of a child that has the backend: this one's, the backend's folder on the path."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_OPENREG_")}
        paths = [str(HERE), str(REPO), str(REPO / "tests"), str(REPO / "examples")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
        env.update(variant or {})
        env.update(extra)
        return env

    def run(self, args: Sequence[str], *, variant: Mapping[str, str] | None = None, timeout: float = 300,
            cwd: Path = REPO, **extra: str) -> subprocess.CompletedProcess[str]:
        """``python ARGS`` in a child with the backend (and ``variant``'s switches)."""
        return subprocess.run([sys.executable, *args], cwd=cwd, env=self.env(variant, **extra), capture_output=True,
                              text=True, timeout=timeout)

    def python(self, code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``code`` (``python -c``) in a child with the backend."""
        return self.run(["-c", code], **kwargs)  # type: ignore[arg-type]


def build() -> OpenReg | str:
    """Build (or load the cached build of) the backend in a child; the reason to skip when no compiler is here."""
    started = time.monotonic()
    probe = OpenReg(0.0)
    done = probe.python(_BUILD, timeout=900, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    if done.returncode == 3 and UNAVAILABLE in done.stdout:
        return done.stdout.split(UNAVAILABLE, 1)[1].strip()
    if done.returncode != 0:
        raise RuntimeError(f"building the openreg test backend failed:\n{done.stdout}\n{done.stderr}")
    return OpenReg(time.monotonic() - started)

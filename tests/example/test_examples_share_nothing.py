"""The two examples copy nothing from each other: what both need (flags bound to the Trainer's config, the
run folder, the throughput meter, error lines) comes from devplug."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from paths import REPO

pytestmark = pytest.mark.skipif(shutil.which("duplicates") is None, reason="needs the duplicates tool on PATH")


def test_no_block_of_six_lines_is_shared_between_the_examples():
    result = subprocess.run(["duplicates", "--repo", str(REPO / "examples"), "--seconds", "60", "--most", "40"],
                            capture_output=True, text=True, timeout=120)
    rows = [line for line in result.stdout.splitlines() if line.startswith("D")]
    across = [row for row in rows if "dcgan" in row and "lm/" in row]
    assert across == [], result.stdout
    assert "incomplete" not in result.stdout, result.stdout

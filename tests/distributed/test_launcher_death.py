"""Workers die with their launcher: torchrun killed with SIGKILL takes its ranks with it within seconds, and
the retry on the same folder resumes from the last checkpoint and ends bitwise where an uninterrupted run does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_scripts import common
from dist_scripts.common import HERE

from devplug.core.checkpoint.tempfiles import writer_alive
from devplug.core.distributed.launch import die_with_launcher


def _torchrun(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{common.free_port()}",
            "--monitor-interval", "0.1", str(HERE / "train_orphaned.py"), "--out", str(out), *extra]


def _run(out: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(_torchrun(out), env=common.clean_env(), cwd=common.REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_the_parent_death_signal_is_armed_only_under_torchrun():
    assert die_with_launcher({}) is False  # one process, or a launcher that is not torchrun's agent


@pytest.mark.slow
def test_a_killed_torchrun_takes_its_workers_with_it_and_the_retry_resumes_bitwise(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    _run(reference)
    launcher = subprocess.Popen(_torchrun(killed, "--hang-after", "4"), env=common.clean_env(), cwd=common.REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while len(pids) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            pids = [int(p.read_text()) for p in sorted(killed.glob("pid*")) if p.read_text()]
            time.sleep(0.2)
        assert len(pids) == 2, "the ranks never reached step 4"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        gone_by = time.monotonic() + 10
        while any(writer_alive(pid) for pid in pids) and time.monotonic() < gone_by:
            time.sleep(0.1)
        survivors = [pid for pid in pids if writer_alive(pid)]
        assert survivors == [], "workers outlived their launcher"
    finally:
        launcher.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    retry = _run(killed)
    assert "rank 0 starts at step 4" in retry.stdout and "rank 1 starts at step 4" in retry.stdout
    expected = torch.load(reference / "final.pt", weights_only=True)
    got = torch.load(killed / "final.pt", weights_only=True)
    assert all(torch.equal(got[k], expected[k]) for k in expected)

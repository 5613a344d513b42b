"""Shared by the multi-process tests and the scripts they launch: model, data, a rank launcher.

Imported as ``dist_scripts.common`` by tests and as ``common`` by the scripts in this folder (run as
``python tests/dist_scripts/<script>.py``), so it must not import pytest.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler

from devplug.plugins.cpu import plugin as cpu_plugin

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: Launcher variables scrubbed from child environments so only the ones a test sets are seen.
LAUNCH_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "MPI_LOCAL", "TORCHELASTIC_", "DEVPLUG_")
LAUNCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def make_model(seed: int = 0) -> torch.nn.Module:
    """A small MLP (no batch norm: its per-rank statistics would differ from one big batch)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


class IndexedData(Dataset):
    """``(index, x, y)`` samples, so a rank can report which samples it saw."""

    def __init__(self, n: int = 40) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True).sin()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def shards(samples: int, world_size: int, epoch: int, seed: int = 0) -> list[list[int]]:
    """The sample order DistributedSampler gives each rank in ``epoch`` (shuffled with ``seed``)."""
    data = IndexedData(samples)
    out = []
    for rank in range(world_size):
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def train_on_concatenated_batches(steps: int, *, samples: int, batch_size: int, world_size: int,
                                  lr: float = 0.1, momentum: float = 0.9) -> dict[str, torch.Tensor]:
    """One process, plain PyTorch: step i uses rank 0's batch i, then rank 1's batch i, and so on.

    DDP averages the ranks' gradients of their mean losses, which is the gradient of the mean loss
    over the concatenated batch (equal batch sizes), so SGD must reach the same weights as the ranks.
    Epochs follow the samplers' shard order (``set_epoch``) like the Trainer's loader does.
    """
    data = IndexedData(samples)
    model = make_model(0)
    fused = {"fused": True} if cpu_plugin.supports_fused("sgd") else {}
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, **fused)
    done, epoch = 0, 0
    while done < steps:
        per_rank = shards(samples, world_size, epoch)
        for start in range(0, len(per_rank[0]), batch_size):
            if done == steps:
                break
            idx = [i for order in per_rank for i in order[start : start + batch_size]]
            loss = torch.nn.functional.mse_loss(model(data.x[idx]), data.y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
        epoch += 1
    return model.state_dict()


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without launcher variables, one thread per rank, devplug importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_PREFIXES) and k not in LAUNCH_NAMES}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


#: What `run_ranks` imports once, in the server its ranks are forked from (torch._dynamo: building any torch
#: optimizer imports it, a third of torch's own import time).
RANK_PRELOAD = ("torch", "torch._dynamo", "torch.distributed.tensor.parallel", "torch.distributed.fsdp",
                "torch.distributed.checkpoint", "devplug", "devplug.core.loop.trainer")


def run_ranks(script: str | Path, args: Sequence[str], *, world_size: int = 2, timeout: float = 60.0,
              extra_env: Mapping[str, str] | None = None, expect_code: int | Sequence[int] = 0,
              preload: Sequence[str] = RANK_PRELOAD) -> list[subprocess.CompletedProcess[str]]:
    """Start ``world_size`` processes of ``script`` with torchrun-style variables; wait for all.

    Each process gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
    a free ``MASTER_PORT``. On timeout every process started here is killed. Raises ``RuntimeError``
    with each rank's output when one exits with another code than ``expect_code`` (one for every rank, or a
    sequence of one per rank).

    Each rank is forked from a server process that imported ``preload`` once (multiprocessing's forkserver)
    rather than started as a fresh interpreter: an interpreter's start with torch is most of a short run's
    time. The rank still runs ``script`` as ``__main__`` in a process of its own, with only the environment
    given here. The server is the test process's one forkserver: the first caller's ``preload`` is the one
    imported. ``preload=()`` starts each rank as a fresh ``python script``.
    """
    port = free_port()
    procs: list[Any] = []
    for rank in range(world_size):
        env = clean_env(extra_env)
        env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if preload:
            procs.append(_ForkedRank(script, args, env, preload))
        else:
            procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=REPO,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outputs = [proc.communicate() for proc in procs]
        raise RuntimeError(f"ranks timed out after {timeout}s:\n" + _describe(outputs)) from None
    codes = [expect_code] * world_size if isinstance(expect_code, int) else list(expect_code)
    if [r.returncode for r in results] != codes:
        raise RuntimeError("a rank failed:\n" + _describe([(r.stdout, r.stderr) for r in results],
                                                         [r.returncode for r in results]))
    return results


class _ForkedRank:
    """A rank forked from the forkserver, with `subprocess.Popen`'s ``communicate``, ``kill``, ``args`` and
    ``returncode`` (its output goes to files until it ends)."""

    def __init__(self, script: str | Path, args: Sequence[str], env: dict[str, str], preload: Sequence[str]) -> None:
        import multiprocessing
        import tempfile

        forks = multiprocessing.get_context("forkserver")
        forks.set_forkserver_preload([*preload, __name__])  # no effect once the server runs
        self.args = [sys.executable, str(script), *args]
        self._output = tempfile.TemporaryDirectory(prefix="rank-output-")
        self._paths = (os.path.join(self._output.name, "stdout"), os.path.join(self._output.name, "stderr"))
        self._process = forks.Process(target=_run_script, args=(str(script), list(args), env, *self._paths))
        self._process.start()
        self.returncode: int | None = None

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.returncode = self._process.exitcode
        outputs = tuple(Path(path).read_text(errors="replace") if os.path.exists(path) else ""
                        for path in self._paths)
        self._output.cleanup()
        return outputs  # type: ignore[return-value]

    def kill(self) -> None:
        self._process.kill()


def _run_script(script: str, args: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """In a forked rank: ``script`` as ``__main__`` with ``args`` and only ``env``, as a fresh interpreter runs it."""
    import atexit
    import runpy

    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO)
    threads = env.get("OMP_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))  # torch read the variable when the server imported it
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # a forked process ends with os._exit: run what an interpreter's exit would


def _describe(outputs: Sequence[tuple[str, str]], codes: Sequence[int] | None = None) -> str:
    parts = []
    for rank, (out, err) in enumerate(outputs):
        code = f" (exit {codes[rank]})" if codes else ""
        parts.append(f"--- rank {rank}{code} stdout:\n{out[-3000:]}\n--- rank {rank} stderr:\n{err[-3000:]}")
    return "\n".join(parts)


def documented_loop() -> str:
    """The training loop README.md shows (the block tests/docs/test_docs.py keeps equal to docs/trainer.md's)."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- the loop:.*?-->\n```python\n(.*?)```\n<!-- end of the loop -->", text, re.S)
    if block is None:
        raise RuntimeError("README.md lost its loop block")
    return block.group(1)


class FixedPredictor(torch.nn.Module):
    """A classifier whose predicted classes training cannot change: fixed logits times a positive scale.

    The scale is a trained parameter (so the loop trains something), but ``argmax`` ignores a positive
    factor: every world size predicts the same classes, and evaluation alone decides the accuracy.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(8, 3, generator=torch.Generator().manual_seed(5)))
        self.scale = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight) * torch.nn.functional.softplus(self.scale)


def loop_namespace(val_samples: int = 1001) -> dict[str, object]:
    """``MyNet``, ``train_set`` and ``val_set`` for `documented_loop`: 3 classes, 128 training samples."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(128 + val_samples, 8, generator=g)
    y = torch.randint(0, 3, (128 + val_samples,), generator=g)
    y[::2] = (x[::2] @ FixedPredictor().weight).argmax(dim=1)  # about two thirds right, not a round number
    return {"MyNet": FixedPredictor, "train_set": TensorDataset(x[:128], y[:128]),
            "val_set": TensorDataset(x[128:], y[128:])}


def expected_predictions(namespace: dict[str, object]) -> torch.Tensor:
    """The classes `FixedPredictor` gives ``namespace``'s evaluation set, in its order."""
    x, _ = namespace["val_set"].tensors  # type: ignore[attr-defined]
    return (x @ FixedPredictor().weight).argmax(dim=1)

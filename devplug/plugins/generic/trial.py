"""Try an out-of-tree backend before trusting it: a tiny training step, autocast, pinned memory.

An out-of-tree PyTorch backend (a renamed PrivateUse1 device) can be present and still unable to do
what training needs: run a Linear layer forward and backward, compute in a 16-bit dtype under
``torch.autocast`` (which only warns when it turns itself off for a dtype the backend does not list), pin host
memory for the data loader (a backend without a host allocator crashes the process there). So the generic
plugin tries each once per machine, backend and torch, in a child process (a crash there costs the
trial, not the user's run) under a time limit, and keeps the answers in devplug's cache folder
(``trials.json``, like the measured CPU peak). The plugin then offers only what worked: the device is
available only if the step trained; pinning and mixed precision only where they ran.

``python -m devplug.plugins.generic.trial TYPE [MODULE]`` is the child: it imports torch (whose
``torch.backends`` entry points load the backend) and ``MODULE`` where one is named, and prints one
JSON line per item as it finishes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from devplug.toolkit import cache_dir, device_module, read_json_object, write_json_object

#: The items tried, in the order the child tries them (pinning last: it is the one that can crash).
ITEMS = ("train", "autocast[bfloat16]", "autocast[float16]", "pin_memory")
#: The cache file in devplug's cache folder.
TRIALS_FILE = "trials.json"
TIMED_OUT = "did not finish within"
#: What the trial checks, in the cache key: a trial kept by a devplug that checked less is tried again.
#: 2: autocast counts only where a layer computed in the dtype asked for.
TRIAL_VERSION = 2
_lock = threading.Lock()
_answers: dict[str, Trial] = {}


@attrs.frozen
class Trial:
    """What an out-of-tree backend did when tried: each item of `ITEMS` with ``""`` (it worked) or what failed."""

    device_type: str
    backend: str
    outcomes: Mapping[str, str]

    def ok(self, item: str) -> bool:
        """True when ``item`` worked."""
        return self.outcomes.get(item, "not tried") == ""

    def problem(self, item: str) -> str:
        """What went wrong with ``item`` (``""`` when it worked)."""
        return self.outcomes.get(item, "not tried")

    def who(self) -> str:
        """``"openreg (backend devplug-openreg 0.1.0, served by devplug's generic plugin)"``: for every message."""
        return f"{self.device_type} (backend {self.backend}, served by devplug's generic plugin)"


def backend_module(device_type: str) -> str:
    """The top-level module that registered ``device_type``'s device module (``torch_npu`` for ``npu``), or ``""``."""
    name = str(getattr(device_module(device_type), "__name__", "") or "")
    return "" if name.startswith("torch.") or not name else name.split(".")[0]


def backend_distribution(device_type: str) -> str:
    """The distribution (name and version) that installed ``device_type``'s backend, or a description of the module."""
    module = backend_module(device_type)
    if not module:
        return "an unknown distribution"
    from importlib import metadata

    try:
        names = metadata.packages_distributions().get(module, [])
        if names:
            return f"{names[0]} {metadata.version(names[0])}"
    except Exception:  # damaged metadata: the module's name still says where the backend came from
        pass
    return f"module {module}"


def _key(device_type: str, backend: str) -> str:
    import torch

    return f"{device_type}|{backend}|torch {torch.__version__}|trial {TRIAL_VERSION}"


def trial(device_type: str, time_limit: float) -> Trial:
    """The backend's trial: from this process's memory, else the cache, else tried now (once) in a child."""
    backend = backend_distribution(device_type)
    key = _key(device_type, backend)
    with _lock:
        if key in _answers:
            return _answers[key]
        path = cache_dir() / TRIALS_FILE
        cached = _read(path).get(key)
        if cached is not None:
            answer = Trial(device_type, backend, cached)
        else:
            answer = Trial(device_type, backend, run_child(device_type, backend_module(device_type), time_limit))
            if not any(TIMED_OUT in problem for problem in answer.outcomes.values()):
                _write(path, key, dict(answer.outcomes))  # a slow machine is tried again next time
        _answers[key] = answer
        return answer


def remember(device_type: str, outcomes: Mapping[str, str]) -> Trial:
    """Record ``outcomes`` as ``device_type``'s trial on this machine (in this process and in the cache)."""
    backend = backend_distribution(device_type)
    key = _key(device_type, backend)
    answer = Trial(device_type, backend, dict(outcomes))
    with _lock:
        _answers[key] = answer
        _write(cache_dir() / TRIALS_FILE, key, dict(outcomes))
    return answer


def forget_trials() -> None:
    """Drop the answers this process holds (the cache file stays)."""
    with _lock:
        _answers.clear()


def run_child(device_type: str, module: str, time_limit: float) -> dict[str, str]:
    """Run the trial in a child process under ``time_limit`` seconds: each item's outcome (``""``: it worked)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    command = [sys.executable, "-m", "devplug.plugins.generic.trial", device_type, module]
    outcomes: dict[str, str] = {}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=time_limit, env=env)
        stdout, returncode, stderr = done.stdout, done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        returncode, stderr = None, ""
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            record = json.loads(line)
            outcomes[str(record["item"])] = str(record["problem"])
    missing = [item for item in ITEMS if item not in outcomes]
    if missing:
        if returncode is None:
            why = f"{TIMED_OUT} {time_limit:g} s"
        elif returncode < 0:
            why = f"crashed the process ({_signal_name(-returncode)})"
        else:
            last = stderr.strip().splitlines()[-1:] or [f"exit status {returncode}"]
            why = f"stopped the process ({last[0]})"
        outcomes[missing[0]] = why
        for item in missing[1:]:
            outcomes[item] = f"not tried: {missing[0]} {why}"
    return outcomes


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read(path: Path) -> dict[str, dict[str, str]]:
    return {str(k): {str(i): str(p) for i, p in v.items()} for k, v in read_json_object(path).items()
            if isinstance(v, dict)}


def _write(path: Path, key: str, outcomes: dict[str, str]) -> None:
    data = _read(path)
    data[key] = outcomes
    with contextlib.suppress(OSError):  # not cached: the next process tries again
        write_json_object(path, data)


# ---- the child ----------------------------------------------------------------------------------------

def _emit(item: str, problem: str) -> None:
    print(json.dumps({"item": item, "problem": problem}), flush=True)


def _attempt(item: str, function: Any) -> None:
    try:
        problem = function() or ""
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        problem = f"{type(exc).__name__}: {first}".rstrip(": ")
    _emit(item, problem if len(problem) <= 300 else problem[:297] + "...")


def _train(torch: Any, device_type: str) -> str:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    reference = torch.nn.functional.mse_loss(model(x), y)
    reference.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.to(device_type)
    loss = torch.nn.functional.mse_loss(model(x.to(device_type)), y.to(device_type))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    if not torch.allclose(loss.detach().cpu(), reference.detach(), rtol=1e-3, atol=1e-5):
        return f"a Linear layer's loss differs from the CPU's ({loss.item():.6g} vs {reference.item():.6g})"
    for param, grad in zip(model.parameters(), expected, strict=True):
        if param.grad is None or not torch.allclose(param.grad.cpu(), grad, rtol=1e-3, atol=1e-5):
            return "a Linear layer's gradients differ from the CPU's"
    return ""


def _autocast(torch: Any, device_type: str, dtype_name: str) -> str:
    import warnings

    dtype = getattr(torch, dtype_name)
    layer = torch.nn.Linear(4, 2).to(device_type)
    x = torch.randn(8, 4).to(device_type)
    with warnings.catch_warnings(record=True) as said:  # torch turns autocast off for a dtype with a warning only
        warnings.simplefilter("always")
        with torch.autocast(device_type=device_type, dtype=dtype):
            out = layer(x)
    out.float().sum().backward()
    if out.dtype != dtype:
        why = next((str(w.message).strip().splitlines()[0] for w in said if "autocast" in str(w.message).lower()), "")
        said_why = f" (torch: {why})" if why else ""
        return f"a Linear layer under torch.autocast gave {out.dtype}, not {dtype}{said_why}"
    return ""


def _pin(torch: Any, device_type: str) -> str:
    pinned = torch.randn(16).pin_memory()
    moved = pinned.to(device_type, non_blocking=True)
    if not torch.equal(moved.cpu(), pinned):
        return "a copy from pinned memory changed the values"
    return ""


def main(argv: list[str]) -> int:
    """The child: try every item on ``argv[0]``'s device, importing ``argv[1]`` first where given."""
    device_type, module = argv[0], (argv[1] if len(argv) > 1 else "")
    import torch

    if module:
        importlib.import_module(module)
    _attempt("train", lambda: _train(torch, device_type))
    for dtype in ("bfloat16", "float16"):
        _attempt(f"autocast[{dtype}]", lambda dtype=dtype: _autocast(torch, device_type, dtype))
    _attempt("pin_memory", lambda: _pin(torch, device_type))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

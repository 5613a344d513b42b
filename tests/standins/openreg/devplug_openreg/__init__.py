"""Test-only stand-in: a real PrivateUse1 device, ``openreg``, built from ``backend.cpp`` (never shipped).

Importing this package builds the C++ backend once (``torch.utils.cpp_extension.load``, cached under
``~/.cache/devplug-tests/`` keyed by the torch version and the source's hash, or ``DEVPLUG_OPENREG_BUILD``),
loads it, renames the PrivateUse1 backend ``openreg`` (``torch.utils.rename_privateuse1_backend``) and
registers its Python device module (``torch._register_device_module``), as an out-of-tree backend such
as ``torch_npu`` does on import. Tensors then live on ``torch.device("openreg")``; ``torch.accelerator``
reports it as the current accelerator.

A process can register one PrivateUse1 backend only: variants (no pinned-memory allocator, operators
without a kernel, no autocast kernels) are chosen by environment variables before the import, in a fresh
process: ``DEVPLUG_OPENREG_NO_HOST_ALLOCATOR=1``, ``DEVPLUG_OPENREG_MISSING=addmm,...``,
``DEVPLUG_OPENREG_NO_AUTOCAST=1``, ``DEVPLUG_OPENREG_DEVICES=N``, ``DEVPLUG_OPENREG_AMP_DTYPES=float16`` (the
dtypes the device module tells torch.autocast it supports).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from types import ModuleType


def autoload() -> None:
    """torch's ``torch.backends`` entry point: importing this package registered the backend already.

    Defined before ``import torch``, which runs the entry points: importing this package first works too.
    """


import torch  # noqa: E402

NAME = "openreg"
SOURCE = Path(__file__).with_name("backend.cpp")


class BuildUnavailable(RuntimeError):
    """No C++ compiler (or ninja) here: the backend cannot be built."""


def build_dir() -> Path:
    """Where the compiled backend is kept between runs: per torch version and source hash."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    root = os.environ.get("DEVPLUG_OPENREG_BUILD") or Path.home() / ".cache" / "devplug-tests"
    path = Path(root) / f"openreg-torch{torch.__version__.replace('+', '_')}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def missing_tools() -> str | None:
    """Why the backend cannot be built here (no compiler, no ninja), or ``None``."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        return f"no C++ compiler ({compiler} or g++) on PATH to build the openreg test backend"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return ("ninja is not installed (pip install ninja): torch.utils.cpp_extension needs it to build the "
                "openreg test backend")
    return None


def _load() -> ModuleType:
    why = missing_tools()
    if why:
        raise BuildUnavailable(why)
    from torch.utils.cpp_extension import load

    return load(name="devplug_openreg_backend", sources=[str(_source_in(build_dir()))],
                build_directory=str(build_dir()), extra_cflags=["-O1"], verbose=False)


def _source_in(folder: Path) -> Path:
    """A copy of the source in the build folder: ninja rebuilds when a command changes, and the command names
    the source's path, so checkouts at other paths (worktrees, CI folders) would each rebuild the shared build."""
    copy = folder / SOURCE.name
    text = SOURCE.read_bytes()
    if not copy.is_file() or copy.read_bytes() != text:
        staged = folder / f".{SOURCE.name}.{os.getpid()}.tmp"
        staged.write_bytes(text)
        os.replace(staged, copy)  # atomic: a concurrent build reads one whole file
    return copy


_backend = _load()

from devplug_openreg import device as _device  # noqa: E402  (the module reads _backend)

if torch._C._get_privateuse1_backend_name() != NAME:
    torch.utils.rename_privateuse1_backend(NAME)
    torch._register_device_module(NAME, _device)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)

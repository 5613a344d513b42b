"""Checks of the example's inputs that need the file system or the machine, run before the first step.

- `prepare_output_dir`: ``--out`` and the folders under it can be created and written, with room
  for the longest file name the run writes (a TensorBoard event file), so a bad ``--out`` is one line
  now rather than a traceback at the first log point.
- `check_memory`: the networks' size (from the flags, without building them) and the training
  state (weights, gradients, Adam's two moments, activations of one batch) against the memory there is,
  so ``--ngf 30000`` is one line rather than an allocation traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
from pathlib import Path

from devplug import ConfigError
from devplug.toolkit import check_model_fits, display_path

from .models import ModelSpec, parameter_counts

#: Folders the run writes into under ``--out``.
OUTPUT_FOLDERS = ("checkpoints", "samples", "tensorboard")
#: Bytes per trainable parameter while training with Adam in fp32: weight, gradient, two moments.
TRAINING_BYTES_PER_PARAMETER = 16

_REASONS = {
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "it exists and is not a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
}


def _problem(exc: OSError, path: Path) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        anchor = next((p for p in path.absolute().parents if _exists(p)), Path("/"))
        longest = max(len(os.fsencode(part)) for part in path.parts)
        name_max = _pathconf(anchor, "PC_NAME_MAX", 255)
        if longest > name_max:
            return f"a name in it is {longest} bytes long, more than the file system allows ({name_max})"
        size = len(os.fsencode(path.absolute())) + 1 + _longest_file_name()
        return (f"the path is too long for the file system ({size} bytes with the names the run writes in it, "
                f"at most {_pathconf(anchor, 'PC_PATH_MAX', 4096)})")
    return _REASONS.get(exc.errno or 0, exc.strerror or str(exc))


def _pathconf(path: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(path, name)
    except (OSError, ValueError):
        return default


def _longest_file_name() -> int:
    """Length of the longest name the run writes: TensorBoard's ``events.out.tfevents.<time>.<host>.<pid>.<n>``."""
    return len(f"events.out.tfevents.{10**10}.{socket.gethostname()}.{10**7}.{10**3}.v2") + 8


def prepare_output_dir(out: Path) -> list[Path]:
    """Create ``out`` and its output folders and check a file can be written in each.

    Returns the folders that did not exist before (the caller may remove them again if the run stops
    before it writes anything). Raises `devplug.ConfigError` naming the path and the problem.
    """
    out = out.expanduser()
    shown = _short(display_path(out))
    existing = next((p for p in (out, *out.parents) if _exists(p)), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == out else f"is below {_short(display_path(existing))!r}, which is a file"
        raise ConfigError(f"--out {shown!r} {where}, not a folder; pass a folder for the run's outputs")
    created: list[Path] = []
    for folder in (out, *(out / name for name in OUTPUT_FOLDERS)):
        missing = [p for p in (folder, *folder.parents) if not _exists(p)]  # deepest first
        try:
            folder.mkdir(parents=True, exist_ok=True)
            created += [p for p in missing if p not in created]
            _probe(folder)
        except OSError as exc:
            remove_empty(created + missing)
            raise ConfigError(f"--out {shown!r} cannot be written: {_problem(exc, folder)}; "
                              "pass a writable folder") from None
    return created


def _short(text: str, limit: int = 160) -> str:
    """``text``, with the middle elided when longer than ``limit`` (a path in a one-line message)."""
    return text if len(text) <= limit else f"{text[:limit // 2 - 2]}...{text[-(limit // 2 - 1):]}"


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:  # missing, or a name too long to look up
        return False
    return True


def _probe(folder: Path) -> None:
    """Create and remove a file with the longest name the run writes in ``folder``.

    The name is this process's own (every rank of a job probes the shared ``--out`` at the same moment).
    """
    prefix = f".dcgan-probe-{os.getpid()}-{secrets.token_hex(4)}-"
    probe = folder / (prefix + "x" * max(0, _longest_file_name() + 1 - len(prefix)))
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.close(fd)
    probe.unlink()


def remove_empty(folders: list[Path]) -> None:
    """Remove those of ``folders`` that are empty, deepest first (what `prepare_output_dir` created)."""
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()


def activation_elements(spec: ModelSpec) -> int:
    """Activation values kept for backward per image: G once, D twice (real and fake), conv and norm outputs."""
    blocks, size = spec.blocks, 4
    generator = 0
    for i in range(blocks):
        generator += 2 * spec.ngf * 2 ** (blocks - 1 - i) * size * size  # conv-transpose + batch norm
        size *= 2
    generator += spec.channels * size * size * 2  # last conv-transpose + tanh
    discriminator, size = 0, spec.image_size
    for i in range(blocks):
        size //= 2
        discriminator += 2 * spec.ndf * 2**i * size * size
    return generator + 2 * discriminator


def check_memory(spec: ModelSpec, batch_size: int, *, device_total: int | None, host_available: int | None,
                 flags: str = "--nz/--ngf/--ndf/--image-size/--batch-size") -> None:
    """Raise `devplug.ConfigError` when the model cannot be trained in the memory there is.

    The networks are built in host memory (4 bytes per parameter) and then trained where the device
    plugin puts them: ``device_total`` bytes, or host memory when the device reports no total.
    """
    params_g, params_d = parameter_counts(spec)
    params = params_g + params_d
    weights = 4 * params
    training = TRAINING_BYTES_PER_PARAMETER * params + 4 * batch_size * activation_elements(spec)
    sizes = (f"G {params_g:,} + D {params_d:,} parameters (nz {spec.nz}, ngf {spec.ngf}, ndf {spec.ndf}, "
             f"{spec.image_size}x{spec.image_size})")
    check_model_fits(build_bytes=weights, train_bytes=training, model=sizes, batch=f"a batch of {batch_size}",
                     flags=flags, device_total=device_total, host_available=host_available,
                     contents="weights, gradients, Adam state, activations")

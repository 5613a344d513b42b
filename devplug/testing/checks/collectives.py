"""Check of ``devplug_collective_setup``: a backend torch.distributed knows, with arguments it accepts."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

from devplug.core.contract import hookspecs
from devplug.core.contract.records import CollectiveSetup, LaunchInfo
from devplug.testing.kit import DeviceUnderTest, NotApplicable, conformance_check


def _backend_names(backend: str) -> list[str]:
    """``"gloo"`` → ``["gloo"]``; ``"cpu:gloo,cuda:nccl"`` → ``["gloo", "nccl"]``."""
    return [part.split(":")[-1].strip().lower() for part in backend.split(",") if part.strip()]


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """Put back every environment variable changed inside the block.

    The check asks about a two-process launch that is not happening; a plugin may write that launch into the
    environment (Gaudi's ``initialize_distributed_hpu()`` sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...), and a
    Trainer built after it would then wait for a second process that never comes.
    """
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        for name, value in saved.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


@contextlib.contextmanager
def _current_device_kept() -> Iterator[None]:
    """Put back the process's current accelerator device (the hook selects the pretend launch's, as
    ``torch.cuda.set_device`` does), so what the kit runs next runs where it ran before."""
    import torch

    accelerator: Any = getattr(torch, "accelerator", None)
    try:
        index = accelerator.current_device_index() if accelerator is not None and accelerator.is_available() else None
    except (RuntimeError, AttributeError):
        index = None
    try:
        yield
    finally:
        if index is not None:
            with contextlib.suppress(RuntimeError):
                accelerator.set_device_index(index)


def _parameters(fn: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(fn).parameters) - {"self", "module"}


@conformance_check("devplug_collective_setup")
def check_collective_setup(dut: DeviceUnderTest) -> str:
    """``devplug_collective_setup`` names a backend torch.distributed knows, with valid DDP/init arguments.

    A backend counts as known when it is in ``torch.distributed.Backend.backend_list`` after the hook
    ran, which includes backends a plugin registers with ``Backend.register_backend`` (HCCL, for one). The
    environment variables the hook sets for that pretend launch, and the current accelerator device it
    selects, are put back afterwards.
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise NotApplicable("this torch build has no torch.distributed")
    launch = LaunchInfo(rank=0, world_size=2, local_rank=0, local_world_size=2, launcher="torchrun")
    with _environment_kept(), _current_device_kept():
        setup = dut.hooks(hookspecs.devplug_collective_setup, launch=launch)
    if not isinstance(setup, CollectiveSetup):
        raise dut.fail(f"devplug_collective_setup returned {setup!r}, not a devplug.CollectiveSetup")
    if not isinstance(setup.backend, str) or not setup.backend.strip():
        raise dut.fail(f"devplug_collective_setup named no backend ({setup.backend!r})")
    known = set(dist.Backend.backend_list) - {"undefined"}
    unknown = [b for b in _backend_names(setup.backend) if b not in known]
    if unknown:
        raise dut.fail(
            f"collective backend {setup.backend!r} is unknown to torch.distributed "
            f"(known: {', '.join(sorted(known))}); "
            "import the library that registers it (torch.distributed.Backend.register_backend) in the hook"
        )
    from torch.nn.parallel import DistributedDataParallel

    bad_ddp = sorted(set(setup.ddp_kwargs) - _parameters(DistributedDataParallel.__init__))
    if bad_ddp:
        raise dut.fail(f"ddp_kwargs {bad_ddp} are not DistributedDataParallel arguments in this torch")
    bad_init = sorted(set(setup.init_kwargs) - _parameters(dist.init_process_group))
    if bad_init:
        raise dut.fail(f"init_kwargs {bad_init} are not init_process_group arguments in this torch")
    return f"backend {setup.backend}, DDP defaults {dict(setup.ddp_kwargs)}"

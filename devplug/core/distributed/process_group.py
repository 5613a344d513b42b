"""Joining a process group as the device plugin says: backend, rendezvous, timeout, a grace at exit.

Only imported when the launcher reports more than one process, and run once per process.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from devplug.core.contract.records import CollectiveSetup, Device, LaunchInfo
from devplug.core.errors import ConfigError

log = logging.getLogger("devplug")

#: How long ranks wait for each other in ``init_process_group`` and collectives before failing.
DEFAULT_TIMEOUT = timedelta(minutes=10)


def init_method(launch: LaunchInfo, env: Mapping[str, str] | None = None) -> str:
    """The rendezvous URL for ``init_process_group``.

    ``env://`` when ``MASTER_ADDR`` and ``MASTER_PORT`` are in the environment (torchrun sets them, and
    under torch elastic ``env://`` reuses the agent's store); otherwise ``tcp://`` to the address the
    launcher implies (first SLURM node, ``MASTER_ADDR`` given to ``mpirun``, or this host).
    """
    env = os.environ if env is None else env
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return "env://"
    host = f"[{launch.master_addr}]" if ":" in launch.master_addr else launch.master_addr
    return f"tcp://{host}:{launch.master_port}"


def elastic_store(launch: LaunchInfo, env: Mapping[str, str] | None = None,
                  timeout: timedelta = DEFAULT_TIMEOUT) -> dist.Store | None:
    """Under torch elastic's shared agent store, this restart attempt's own view of that store.

    torchrun (c10d rendezvous) keeps one TCPStore for the whole job and tells workers to use it
    (``TORCHELASTIC_USE_AGENT_STORE=True``); the process group's keys from before a restart are still in
    it, so a restarted rank can read a dead peer's address and fail to connect. Prefixing the keys with
    the run id and ``TORCHELASTIC_RESTART_COUNT`` gives every attempt a clean namespace. Returns ``None``
    when the agent store is not in use (then ``env://`` or ``tcp://`` is used as usual).

    The restart count is the same on every rank when all workers run under one agent (one node). With
    several nodes, an agent restarts for a membership change without counting it; set
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for multi-node elastic jobs (docs/distributed.md).
    """
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return None
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), launch.world_size, is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"devplug/{run_id}/attempt{attempt}", store)


def init_process_group(launch: LaunchInfo, setup: CollectiveSetup | None, device: Device) -> CollectiveSetup:
    """Join the default process group as the device plugin's collective ``setup`` says.

    The plugin's ``devplug_collective_setup`` hook has run already (it may select the local device or
    import a collective library); its ``init_kwargs`` override devplug's defaults (backend, rank, world
    size, rendezvous, a 10-minute timeout). A process group the author already initialised is kept as
    it is. Either way the process gets a short grace at exit (`register_exit_grace`).
    """
    if not isinstance(setup, CollectiveSetup):
        raise ConfigError(
            f"device {device} cannot train on several processes: its plugin "
            f"{device.plugin_name!r} returned no collective setup (got {setup!r})"
        )
    register_exit_grace()
    if dist.is_initialized():
        log.info("rank %d/%d: using the process group initialised by the caller (%s)", dist.get_rank(),
                 dist.get_world_size(), dist.get_backend())
        if dist.get_world_size() != launch.world_size or dist.get_rank() != launch.rank:
            raise ConfigError(
                f"the existing process group has rank {dist.get_rank()} of {dist.get_world_size()}, but the "
                f"{launch.launcher} launcher says rank {launch.rank} of {launch.world_size}"
            )
        return setup
    kwargs: dict[str, Any] = {
        "backend": setup.backend,
        "rank": launch.rank,
        "world_size": launch.world_size,
        "timeout": DEFAULT_TIMEOUT,
    }
    kwargs.update(setup.init_kwargs)
    if "init_method" not in kwargs and "store" not in kwargs:
        store = elastic_store(launch, timeout=kwargs["timeout"])
        if store is not None:
            kwargs["store"] = store
        else:
            kwargs["init_method"] = init_method(launch)
    dist.init_process_group(**kwargs)
    how = kwargs.get("init_method") or "the elastic agent's store"
    log.info("rank %d/%d (local %d/%d) joined the process group: %s via %s, launched by %s", launch.rank,
             launch.world_size, launch.local_rank, launch.local_world_size, setup.backend, how, launch.launcher)
    return setup


EXIT_GRACE_SECONDS = 0.1
_exit_grace_registered = False


def register_exit_grace(seconds: float = EXIT_GRACE_SECONDS) -> None:
    """At interpreter exit, give collective worker threads ``seconds`` to let go of finished work.

    A gloo worker thread drops a finished collective's tensors a moment after the caller resumes, and
    dropping a tensor Python also knows needs the GIL. If the process is already shutting down by
    then (a script that exits right after its last collective: DDP's gradient all-reduce, a barrier,
    ``all_gather_object``), the thread dies inside a C++ destructor and the process aborts with
    "terminate called without an active exception" (SIGABRT): a finished run reported as failed, and
    under torchrun the other ranks are killed. atexit handlers run while Python is fully alive; this
    one releases the GIL for a moment so such a thread finishes first. Registered once per process,
    by the Trainer when it joins a process group; the cost is ``seconds`` at exit.
    """
    global _exit_grace_registered
    if not _exit_grace_registered:
        atexit.register(time.sleep, seconds)
        _exit_grace_registered = True

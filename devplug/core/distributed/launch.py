"""Reading where this process sits in a job from the launcher's environment.

torchrun / torch elastic, SLURM's srun, Open MPI's mpirun and MPICH / Intel MPI's Hydra each describe
rank and world size in their own variables; `detect_launch` turns any of them into one
`LaunchInfo`.

Precedence, when several launchers' variables are present at once, is the order in which the
launchers nest: torchrun started inside an ``srun`` or ``mpirun`` allocation sets ``RANK``/``WORLD_SIZE``
for each of its workers, so those win; ``mpirun`` inside a SLURM allocation starts its daemons through
``srun``, so ``SLURM_PROCID`` there numbers nodes, not ranks, and the MPI variables win over SLURM's.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping

import attrs

from devplug.core.contract.records import LaunchInfo
from devplug.core.errors import ConfigError

DEFAULT_PORT = 29500
LOOPBACK = "127.0.0.1"

_BRACKET = re.compile(r"\[([^\]]*)\]")
_TASKS = re.compile(r"^\s*(\d+)\s*(?:\(\s*x\s*(\d+)\s*\))?\s*$")


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """``env[name]`` as an integer (``default`` when absent), or a `ConfigError` naming it."""
    if name not in env or env[name].strip() == "":
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        return int(env[name].strip())
    except ValueError:
        raise ConfigError(f"environment variable {name}={env[name]!r} is not an integer") from None


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: ``"a[1,2],b"`` → ``["a[1,2]", "b"]``."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_range(ranges: str, nodelist: str) -> list[str]:
    """Expand the inside of one bracket, ``"03-05,07"`` → ``["03", "04", "05", "07"]`` (padding kept)."""
    values: list[str] = []
    for item in ranges.split(","):
        item = item.strip()
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ConfigError(f"cannot parse SLURM node list {nodelist!r}: bad range {item!r}")
        if not sep:
            values.append(low)
            continue
        width = len(low)
        start, stop = int(low), int(high)
        if stop < start:
            raise ConfigError(f"cannot parse SLURM node list {nodelist!r}: range {item!r} runs backwards")
        values.extend(str(n).zfill(width) for n in range(start, stop + 1))
    return values


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """All host names of a SLURM node list, in order.

    ``"node[03-05,07],gpu1"`` → ``["node03", "node04", "node05", "node07", "gpu1"]``; zero padding is
    kept and several bracket groups in one name expand as a product (``"r[1-2]n[1-2]"`` → four hosts).
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        names = [""]
        position = 0
        for match in _BRACKET.finditer(item):
            literal = item[position : match.start()]
            names = [n + literal + value for n in names for value in _expand_range(match.group(1), nodelist)]
            position = match.end()
        tail = item[position:]
        if "[" in tail or "]" in tail:
            raise ConfigError(f"cannot parse SLURM node list {nodelist!r}: unbalanced brackets in {item!r}")
        hosts.extend(n + tail for n in names)
    return hosts


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``"node[03-05,07],gpu1"`` → ``"node03"``.

    SLURM places task 0 on the first node of the step, so this is where rank 0 listens.
    """
    hosts = expand_slurm_nodelist(nodelist)
    return hosts[0] if hosts else LOOPBACK


def expand_tasks_per_node(spec: str) -> list[int]:
    """SLURM's compressed tasks-per-node list: ``"4(x2),2"`` → ``[4, 4, 2]``."""
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS.match(item)
        if match is None:
            raise ConfigError(f"cannot parse SLURM tasks per node {spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _slurm_local_world_size(env: Mapping[str, str], world_size: int, local_rank: int, nodelist: str | None) -> int:
    """Tasks on this node: the step's tasks-per-node entry for ``SLURM_NODEID``.

    Without a tasks-per-node variable (srun always sets one), an estimate: the world size spread
    evenly over the step's nodes, and at least ``local_rank + 1``.
    """
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        spec = env.get(name, "").strip()
        if spec:
            counts = expand_tasks_per_node(spec)
            node = _int(env, "SLURM_NODEID", 0)
            return counts[node] if node < len(counts) else counts[-1]
    nodes = _int(env, "SLURM_STEP_NUM_NODES", 0) or _int(env, "SLURM_NNODES", 0)
    if not nodes and nodelist:
        nodes = len(expand_slurm_nodelist(nodelist))
    return max(1, local_rank + 1, -(-world_size // max(nodes, 1)))


def _port(env: Mapping[str, str]) -> int:
    port = _int(env, "MASTER_PORT", DEFAULT_PORT)
    if not 0 < port < 65536:
        raise ConfigError(f"environment variable MASTER_PORT={port} is not a TCP port (1..65535)")
    return port


def _mpi_master_addr(env: Mapping[str, str], world_size: int, local_world_size: int, how: str) -> str:
    """``MASTER_ADDR``, or the loopback address when every rank is on this node; else a clear error."""
    addr = env.get("MASTER_ADDR", "").strip()
    if addr:
        return addr
    if local_world_size < world_size:
        raise ConfigError(
            f"{world_size} processes were started on several nodes ({local_world_size} on this one) but "
            f"MASTER_ADDR is not set, so rank 0 cannot be found. Export the first host's address to every "
            f"rank, e.g. `{how}`"
        )
    return LOOPBACK


def _validate(info: LaunchInfo, variables: str) -> LaunchInfo:
    problems = []
    if info.world_size < 1:
        problems.append(f"world size {info.world_size} < 1")
    if not 0 <= info.rank < info.world_size:
        problems.append(f"rank {info.rank} is outside 0..{info.world_size - 1}")
    if info.local_world_size < 1:
        problems.append(f"local world size {info.local_world_size} < 1")
    if not 0 <= info.local_rank < max(info.local_world_size, 1):
        problems.append(f"local rank {info.local_rank} is outside 0..{info.local_world_size - 1}")
    if problems:
        raise ConfigError(f"inconsistent {info.launcher} launch variables ({variables}): " + "; ".join(problems))
    return info


@attrs.frozen
class MPIFlavour:
    """The environment variables one MPI launcher sets for its processes."""

    launcher: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    required: tuple[str, ...]
    master_hint: str


MPI_FLAVOURS = (
    MPIFlavour(
        "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        "mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...",
    ),
    # Hydra (MPICH, Intel MPI) also sets MPI_LOCALRANKID; SLURM's own PMI plugins set PMI_RANK without it.
    MPIFlavour(
        "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        "mpiexec -genv MASTER_ADDR $(hostname) -genv MASTER_PORT 29500 ...",
    ),
)


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Rank, world size, local rank and rendezvous address from the launcher's variables.

    Recognised, in this order (see the module docstring for why):

    - torchrun / torch elastic: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
      ``MASTER_ADDR``, ``MASTER_PORT`` (also what a hand-written launcher or ``mp.spawn`` wrapper sets);
    - Open MPI ``mpirun``: ``OMPI_COMM_WORLD_RANK``/``SIZE``/``LOCAL_RANK``/``LOCAL_SIZE``;
    - MPICH / Intel MPI ``mpiexec`` (Hydra): ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
      ``MPI_LOCALNRANKS``;
    - SLURM ``srun``: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``),
      ``SLURM_LOCALID``, tasks per node for ``SLURM_NODEID``; the master is the first host of
      ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``) unless ``MASTER_ADDR`` is set.

    ``MASTER_PORT`` (default 29500) and ``MASTER_ADDR`` override what a launcher implies. MPI launches
    spanning several nodes need ``MASTER_ADDR`` (``mpirun -x MASTER_ADDR=...``): without it this raises
    `ConfigError` instead of hanging. With no launcher variables this is a single process.
    ``env`` defaults to ``os.environ`` (tests pass synthetic dictionaries).
    """
    env = os.environ if env is None else env

    if "RANK" in env and "WORLD_SIZE" in env:
        return _validate(
            LaunchInfo(
                rank=_int(env, "RANK"),
                world_size=_int(env, "WORLD_SIZE"),
                local_rank=_int(env, "LOCAL_RANK", 0),
                local_world_size=_int(env, "LOCAL_WORLD_SIZE", 0) or _int(env, "WORLD_SIZE"),
                master_addr=env.get("MASTER_ADDR", "").strip() or LOOPBACK,
                master_port=_port(env),
                launcher="torchrun",
            ),
            "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE",
        )

    for flavour in MPI_FLAVOURS:
        if all(name in env for name in flavour.required):
            world = _int(env, flavour.size)
            local_world = _int(env, flavour.local_size, world)
            return _validate(
                LaunchInfo(
                    rank=_int(env, flavour.rank),
                    world_size=world,
                    local_rank=_int(env, flavour.local_rank, 0),
                    local_world_size=local_world,
                    master_addr=_mpi_master_addr(env, world, local_world, flavour.master_hint),
                    master_port=_port(env),
                    launcher=flavour.launcher,
                ),
                ", ".join((flavour.rank, flavour.size, flavour.local_rank, flavour.local_size)),
            )

    if "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        # An srun step's own task count wins over the allocation's: inside `salloc -n 8` an interactive
        # `srun --pty bash` is a one-task step, and a python started there is a single process.
        world_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        world = _int(env, world_var)
        local_rank = _int(env, "SLURM_LOCALID", 0)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        master = env.get("MASTER_ADDR", "").strip() or (first_slurm_host(nodelist) if nodelist else LOOPBACK)
        return _validate(
            LaunchInfo(
                rank=_int(env, "SLURM_PROCID"),
                world_size=world,
                local_rank=local_rank,
                local_world_size=_slurm_local_world_size(env, world, local_rank, nodelist),
                master_addr=master,
                master_port=_port(env),
                launcher="slurm",
            ),
            f"SLURM_PROCID, {world_var}, SLURM_LOCALID, SLURM_NODEID, tasks per node",
        )

    return LaunchInfo()


def check_process_group(launch: LaunchInfo) -> None:
    """A `ConfigError` when the launcher variables say one process but a group of several ranks is joined.

    A script that starts its processes itself (``torch.multiprocessing.spawn``) and calls
    ``init_process_group`` without exporting ``RANK``/``WORLD_SIZE`` would otherwise have every process
    train alone as rank 0 of 1: no DDP, no data shard, each one writing as the main process. A group of one
    is a single process. (With launcher variables, `init_process_group` checks the group against them.)
    """
    distributed = sys.modules.get("torch.distributed")  # never imported here: a group someone joined imported it
    if launch.distributed or distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return
    world = distributed.get_world_size()
    if world > 1:
        raise ConfigError(
            f"this process is rank {distributed.get_rank()} of a process group of {world}, but no launcher variables "
            "say so, so it would train alone as rank 0 of 1; set RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE "
            "in each process before making the Trainer (or start it with torchrun)"
        )


#: Linux's prctl option that sends a signal to this process when its parent ends.
_PR_SET_PDEATHSIG = 1


def die_with_launcher(env: Mapping[str, str] | None = None) -> bool:
    """Under torchrun, have the kernel kill this worker when its launcher (torchrun's agent, its parent) dies.

    torchrun starts each worker in a session of its own, so a launcher killed with SIGKILL (an out-of-memory
    kill, a node agent going away) takes no worker with it: they would go on training and saving into the
    folder a retry resumes from. With Linux's parent-death signal they end with it. Returns whether it is
    armed (``False`` outside torchrun or off Linux); a worker whose launcher is already gone ends at once.
    """
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" not in env or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:  # the launcher died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    return True

"""Launcher detection from synthetic environments: torchrun, SLURM srun, Open MPI mpirun, MPICH/Intel MPI."""

from __future__ import annotations

import pytest

from devplug.core.contract.records import LaunchInfo
from devplug.core.distributed.launch import (
    DEFAULT_PORT,
    detect_launch,
    expand_slurm_nodelist,
    expand_tasks_per_node,
    first_slurm_host,
)
from devplug.core.errors import ConfigError


def test_no_launcher_variables_is_one_process():
    info = detect_launch({"PATH": "/usr/bin", "HOME": "/root"})
    assert info == LaunchInfo()
    assert not info.distributed and info.launcher == "none"


def test_torchrun_variables():
    env = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "MASTER_ADDR": "node07", "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert detect_launch(env) == LaunchInfo(rank=5, world_size=16, local_rank=1, local_world_size=4,
                                            master_addr="node07", master_port=29400, launcher="torchrun")


def test_hand_set_rank_variables_default_to_one_node_on_loopback():
    info = detect_launch({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (1, 2, 1, 2)
    assert (info.master_addr, info.master_port, info.launcher) == ("127.0.0.1", DEFAULT_PORT, "torchrun")
    assert info.distributed


def test_torchrun_with_world_size_one_is_not_distributed():
    assert not detect_launch({"RANK": "0", "WORLD_SIZE": "1"}).distributed


SRUN_2_NODES = {
    # what srun sets for task 5 of `srun -N 2 --ntasks-per-node 4 python train.py`
    # (2 nodes, 4 ranks per node)
    "SLURM_JOB_ID": "123456",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "nid[001234-001235]",
    "SLURM_STEP_NODELIST": "nid[001234-001235]",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_TASKS_PER_NODE": "4(x2)",
}


def test_slurm_srun_variables_and_master_from_node_list():
    assert detect_launch(SRUN_2_NODES) == LaunchInfo(rank=5, world_size=8, local_rank=1, local_world_size=4,
                                                     master_addr="nid001234", master_port=DEFAULT_PORT,
                                                     launcher="slurm")


def test_slurm_minimal_variables_as_the_issue_names_them():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "node[03-05,07]"}
    info = detect_launch(env)
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (3, 8, 1, "slurm")
    assert info.master_addr == "node03"
    assert info.local_world_size == 2  # no tasks-per-node variable: 8 tasks over the 4 listed nodes


def test_slurm_master_addr_and_port_overrides():
    env = dict(SRUN_2_NODES, MASTER_ADDR="10.0.0.5", MASTER_PORT="12345")
    info = detect_launch(env)
    assert (info.master_addr, info.master_port) == ("10.0.0.5", 12345)


def test_slurm_uneven_tasks_per_node_picks_this_nodes_count():
    env = dict(SRUN_2_NODES, SLURM_STEP_TASKS_PER_NODE="4,3", SLURM_STEP_NUM_TASKS="7", SLURM_NTASKS="7",
               SLURM_PROCID="6", SLURM_LOCALID="2")
    info = detect_launch(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (6, 7, 2, 3)


def test_interactive_srun_shell_inside_a_larger_allocation_is_one_process():
    # `salloc -n 8` then `srun --pty bash`: the allocation has 8 tasks, this step has one.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "1", "SLURM_LOCALID": "0",
           "SLURM_JOB_NODELIST": "node01", "SLURM_STEP_TASKS_PER_NODE": "1"}
    info = detect_launch(env)
    assert info.world_size == 1 and not info.distributed


def test_torchrun_inside_srun_wins_over_slurm():
    env = dict(SRUN_2_NODES, RANK="9", WORLD_SIZE="16", LOCAL_RANK="1", LOCAL_WORLD_SIZE="8",
               MASTER_ADDR="nid001234", MASTER_PORT="29500")
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size) == ("torchrun", 9, 16)


OMPI_ONE_NODE = {
    # what mpirun sets for rank 3 of `mpirun -np 8 python train.py` on one 8-card Gaudi server
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
    "OMPI_COMM_WORLD_NODE_RANK": "0",
}


def test_open_mpi_one_node_rendezvous_on_loopback():
    assert detect_launch(OMPI_ONE_NODE) == LaunchInfo(rank=3, world_size=8, local_rank=3, local_world_size=8,
                                                      master_addr="127.0.0.1", master_port=DEFAULT_PORT,
                                                      launcher="openmpi")


def test_open_mpi_several_nodes_uses_exported_master_addr():
    env = {"OMPI_COMM_WORLD_RANK": "12", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "4",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "MASTER_ADDR": "gaudi01", "MASTER_PORT": "12355"}
    assert detect_launch(env) == LaunchInfo(rank=12, world_size=16, local_rank=4, local_world_size=8,
                                            master_addr="gaudi01", master_port=12355, launcher="openmpi")


def test_open_mpi_several_nodes_without_master_addr_is_a_clear_error():
    env = {"OMPI_COMM_WORLD_RANK": "12", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "4",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    with pytest.raises(ConfigError, match=r"MASTER_ADDR is not set.*mpirun -x MASTER_ADDR"):
        detect_launch(env)


def test_mpirun_inside_a_slurm_allocation_uses_the_mpi_ranks():
    # mpirun starts its daemons with srun: SLURM_PROCID then numbers nodes, not ranks
    env = dict(SRUN_2_NODES, SLURM_PROCID="1", OMPI_COMM_WORLD_RANK="13", OMPI_COMM_WORLD_SIZE="16",
               OMPI_COMM_WORLD_LOCAL_RANK="5", OMPI_COMM_WORLD_LOCAL_SIZE="8", MASTER_ADDR="nid001234")
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("openmpi", 13, 16, 5)


def test_mpich_hydra_variables():
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == (
        "mpich", 2, 4, 2, 4)


def test_slurm_pmi_variables_without_hydra_stay_slurm():
    env = dict(SRUN_2_NODES, PMI_RANK="5", PMI_SIZE="8")
    assert detect_launch(env).launcher == "slurm"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "two", "WORLD_SIZE": "4"}, r"RANK='two' is not an integer"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, r"rank 4 is outside 0\.\.3"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, r"world size 0 < 1"),
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, r"local rank 2 is outside"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, r"MASTER_PORT=70000 is not a TCP port"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[05-03]"}, r"runs backwards"),
        ({"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"}, r"openmpi launch variables.*rank -1"),
    ],
)
def test_inconsistent_variables_are_clear_errors(env, message):
    with pytest.raises(ConfigError, match=message):
        detect_launch(env)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[03-05,07]", ["node03", "node04", "node05", "node07"]),
        ("node[03-05,07],gpu1", ["node03", "node04", "node05", "node07", "gpu1"]),
        ("gpu1,node[9-11]", ["gpu1", "node9", "node10", "node11"]),
        ("nid[001234-001236]", ["nid001234", "nid001235", "nid001236"]),
        ("rack[1-2]-n[08-09]", ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]),
        ("node[1-2]-ib,login", ["node1-ib", "node2-ib", "login"]),
        ("a.cluster.org,b.cluster.org", ["a.cluster.org", "b.cluster.org"]),
    ],
)
def test_slurm_node_lists_expand(nodelist, hosts):
    assert expand_slurm_nodelist(nodelist) == hosts
    assert first_slurm_host(nodelist) == hosts[0]


def test_unbalanced_node_list_is_a_clear_error():
    with pytest.raises(ConfigError, match="cannot parse SLURM node list"):
        expand_slurm_nodelist("node[01-03")


@pytest.mark.parametrize(
    ("spec", "counts"),
    [("4", [4]), ("4(x2)", [4, 4]), ("4(x2),2", [4, 4, 2]), ("2,1(x3)", [2, 1, 1, 1])],
)
def test_slurm_tasks_per_node_expand(spec, counts):
    assert expand_tasks_per_node(spec) == counts


def test_detect_launch_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    info = detect_launch()
    assert (info.launcher, info.rank, info.world_size) == ("openmpi", 1, 2)


@pytest.mark.parametrize("raw", ["abc", "-5", "0", "nan", "inf"])
def test_a_collective_wait_that_is_not_a_positive_number_is_refused_like_the_other_variables(raw):
    from devplug.core.distributed.combine import collective_wait_seconds
    from devplug.core.registry.bounded import time_limit

    with pytest.raises(ConfigError) as info:
        collective_wait_seconds({"DEVPLUG_COLLECTIVE_WAIT": raw})
    assert str(info.value) == f"DEVPLUG_COLLECTIVE_WAIT={raw!r} is not a positive number of seconds (e.g. 120 or 2.5)"
    with pytest.raises(ConfigError, match=f"DEVPLUG_PROBE_TIMEOUT={raw!r} is not a positive number of seconds"):
        time_limit({"DEVPLUG_PROBE_TIMEOUT": raw})  # its sibling, worded the same way


def test_a_collective_wait_unset_is_the_default_and_a_number_is_used():
    from devplug.core.distributed.combine import DEFAULT_COLLECTIVE_WAIT, collective_wait_seconds

    assert collective_wait_seconds({}) == DEFAULT_COLLECTIVE_WAIT
    assert collective_wait_seconds({"DEVPLUG_COLLECTIVE_WAIT": " "}) == DEFAULT_COLLECTIVE_WAIT
    assert collective_wait_seconds({"DEVPLUG_COLLECTIVE_WAIT": "2.5"}) == 2.5

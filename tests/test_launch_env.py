"""Launcher variables that say too little or more than one node's worth: half a torchrun launch, tasks per
node that differ between nodes, huge and spaced SLURM host lists."""

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import composetrain as ct
from composetrain.launch.hostlist import nodelist_summary


def slurm(**overrides):
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "123456",
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize(
    ("env", "present", "missing"),
    [
        ({"RANK": "1"}, "RANK", "WORLD_SIZE"),
        ({"LOCAL_RANK": "0"}, "LOCAL_RANK", "RANK, WORLD_SIZE"),
        ({"RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": "29500"}, "RANK, LOCAL_RANK", "WORLD_SIZE"),
    ],
)
def test_half_a_torchrun_launch_is_refused_naming_what_is_there_and_what_is_not(env, present, missing):
    pattern = rf"rendezvous: {present} (is|are) set but {missing} (is|are) not: launch with torchrun"
    with pytest.raises(ValueError, match=pattern):
        ct.detect(env)
    with pytest.raises(ValueError, match=pattern):
        ct.rendezvous(env=env)
    assert ct.detect(env, rank=0, world_size=1).source == "explicit"  # explicit values still decide


@pytest.mark.parametrize(
    ("tasks", "node", "local"),
    [
        ("3,1", "0", 3),
        ("3,1", "1", 1),
        ("2(x3),1", "0", 2),
        ("2(x3),1", "2", 2),
        ("2(x3),1", "3", 1),
        ("1,2(x2)", "2", 2),
        ("4(x2)", None, 4),  # the same on every node: the node does not matter
        ("4", None, 4),
    ],
)
def test_each_node_gets_its_own_task_count(tasks, node, local):
    counts = [(int(t), int(n or 1)) for t, n in re.findall(r"(\d+)(?:\(x(\d+)\))?", tasks)]
    nodes, total = sum(n for _, n in counts), sum(t * n for t, n in counts)  # as one allocation writes them
    env = slurm(
        SLURM_TASKS_PER_NODE=tasks,
        SLURM_NODEID=node,
        SLURM_NNODES=str(nodes),
        SLURM_NTASKS=str(total),
        SLURM_JOB_NODELIST=f"n[1-{nodes}]",
        SLURM_PROCID=str(total - 1),
    )
    assert ct.detect(env).local_world_size == local


@pytest.mark.parametrize(
    ("tasks", "node", "pattern"),
    [
        ("3,1", None, r"SLURM_TASKS_PER_NODE='3,1' differs between nodes but SLURM_NODEID is not set"),
        ("3,1", "2", r"SLURM_NODEID=2 but SLURM_TASKS_PER_NODE='3,1' describes 2 node\(s\)"),
        ("3,x", "0", r"SLURM_TASKS_PER_NODE='3,x' is not .* like '2\(x3\),1'"),
        ("2(x0)", "0", r"SLURM_TASKS_PER_NODE='2\(x0\)' is not"),
    ],
)
def test_task_counts_that_cannot_be_placed_are_refused(tasks, node, pattern):
    with pytest.raises(ValueError, match=rf"rendezvous: {pattern}"):
        ct.detect(slurm(SLURM_TASKS_PER_NODE=tasks, SLURM_NODEID=node))


def test_a_huge_host_list_is_summarised_without_expanding_it():
    tick = time.perf_counter()
    assert nodelist_summary("node[0-20000000]") == ("node0", 20000001)
    assert nodelist_summary("a[1-2]-[03-05],b") == ("a1-03", 7)
    env = slurm(SLURM_JOB_NODELIST="node[0-20000000]", SLURM_NNODES="20000001", SLURM_NTASKS="20000001")
    cluster = ct.detect(env)
    assert time.perf_counter() - tick < 2.0
    assert (cluster.master_addr, cluster.world_size) == ("node0", 20000001)
    with pytest.raises(ValueError, match=r"parse_nodelist: 'node\[0-20000000\]' names 20000001 hosts, more than"):
        ct.parse_nodelist("node[0-20000000]")


def test_spaces_around_host_names_are_stripped_and_inside_refused():
    assert ct.parse_nodelist("node1, node2") == ["node1", "node2"]
    assert ct.parse_nodelist(" a[1-2] ,b ") == ["a1", "a2", "b"]
    assert nodelist_summary("node1, node2") == ("node1", 2)
    with pytest.raises(ValueError, match=r"parse_nodelist: 'node 1' in 'node 1,node2' holds a space"):
        ct.parse_nodelist("node 1,node2")


@given(
    groups=st.lists(
        st.tuples(
            st.from_regex(r"[a-z][a-z0-9-]{0,4}", fullmatch=True),
            st.lists(st.tuples(st.integers(0, 30), st.integers(0, 4)), min_size=1, max_size=3),
            st.integers(1, 3),
            st.sampled_from(["", "-x", "-[1-2]"]),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_the_summary_is_the_first_host_and_the_count_of_the_expansion(groups):
    text = ",".join(
        f"{prefix}[{','.join(f'{a:0{width}d}-{a + n:0{width}d}' for a, n in ranges)}]{suffix}"
        for prefix, ranges, width, suffix in groups
    )
    hosts = ct.parse_nodelist(text)
    assert nodelist_summary(text) == (hosts[0], len(hosts))

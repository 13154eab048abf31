"""Launcher variables that say too little or more than one node's worth: half a torchrun launch, tasks per
node that differ between nodes, huge and spaced SLURM host lists."""

import re
import time

import pytest
from helpers import slurm_env
from hypothesis import given
from hypothesis import strategies as st

import composetrain as ct
from composetrain.launch.hostlist import nodelist_summary
from composetrain.launch.rendezvous import unjoined_launch


def slurm(**overrides):
    return slurm_env("3", "4", "0", **overrides)


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


# -- variables a skeptical user writes by hand: non-ASCII digits, counts that contradict the job ----------------------


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}


def slurm_task_one(**overrides):
    """The variables of task 1 (the second of the first node) of a 4-task job on 2 nodes."""
    return slurm_env("1", "4", "1", **overrides)


@pytest.mark.parametrize("value", ["²", "abc", "-1", "0", "", "2.0", "\u0662"])
def test_a_local_world_size_that_is_no_count_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=rf"rendezvous: LOCAL_WORLD_SIZE must be a positive integer, got {value!r}"):
        ct.detect({**TORCHRUN, "LOCAL_WORLD_SIZE": value})


def test_a_local_world_size_with_spaces_around_it_still_counts():
    assert ct.detect({**TORCHRUN, "LOCAL_WORLD_SIZE": " 2 "}).local_world_size == 2


@pytest.mark.parametrize("value", ["²", "\u0663", "x"])
def test_a_world_size_that_is_no_number_does_not_crash_a_transform(value):
    assert unjoined_launch({"WORLD_SIZE": value}) is None  # ct.rendezvous is the one that refuses it, by name
    with pytest.raises(ValueError, match=rf"rendezvous: WORLD_SIZE must be an integer, got {value!r}"):
        ct.rendezvous(env={"WORLD_SIZE": value})


@pytest.mark.parametrize(
    ("name", "value"), [("RANK", "\u0661"), ("RANK", "1_0"), ("WORLD_SIZE", "2_0"), ("RANK", "+1")]
)
def test_torchrun_numbers_must_be_ascii_digits(name, value):
    what = {"RANK": "rank", "WORLD_SIZE": "world_size"}[name]
    with pytest.raises(ValueError, match=re.escape(f"rendezvous: {what} must be an integer, got {value!r}")):
        ct.detect({**TORCHRUN, name: value})


@pytest.mark.parametrize("name", ["SLURM_NODEID", "SLURM_JOB_ID", "SLURM_NNODES"])
def test_slurm_numbers_must_be_ascii_digits(name):
    env = slurm_task_one(**{"SLURM_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "0", name: "\u0661"})
    with pytest.raises(ValueError, match=rf"rendezvous: {name} must be an integer, got '\u0661'"):
        ct.detect(env)


@pytest.mark.parametrize(
    ("tasks", "pattern"),
    [
        ("3(x2)", r"SLURM_TASKS_PER_NODE='3\(x2\)' places 6 tasks but SLURM_NTASKS=4"),
        ("2(x3)", r"SLURM_TASKS_PER_NODE='2\(x3\)' describes 3 node\(s\) but SLURM_NNODES=2"),
        ("4,0", r"SLURM_TASKS_PER_NODE='4,0' is not SLURM's list of tasks per node"),
        ("\u0662(x2)", r"SLURM_TASKS_PER_NODE='\u0662\(x2\)' is not SLURM's list of tasks per node"),
    ],
)
def test_task_counts_that_contradict_the_job_are_refused(tasks, pattern):
    ntasks = "6" if tasks == "2(x3)" else "4"  # the tasks agree there: only the nodes contradict
    with pytest.raises(ValueError, match=rf"rendezvous: {pattern}"):
        ct.detect(slurm_task_one(SLURM_TASKS_PER_NODE=tasks, SLURM_NODEID="0", SLURM_NTASKS=ntasks))


def test_task_counts_that_agree_with_the_job_are_read():
    assert ct.detect(slurm_task_one(SLURM_TASKS_PER_NODE="2(x2)")).local_world_size == 2
    assert (
        ct.detect(
            slurm_task_one(SLURM_TASKS_PER_NODE="3,1", SLURM_NODEID="1", SLURM_PROCID="3", SLURM_LOCALID="0")
        ).local_world_size
        == 1
    )
    # a single sbatch process: no SLURM_NTASKS to compare with
    assert ct.detect({"SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NODEID": "1"}).local_world_size == 8


@pytest.mark.parametrize(
    ("explicit", "arg"),
    [
        ({"rank": 1.5, "world_size": 2}, "rank"),
        ({"rank": True, "world_size": 2}, "rank"),
        ({"rank": 0, "world_size": 2.9}, "world_size"),
        ({"rank": 0, "world_size": 1, "master_port": 29500.5}, "master_port"),
        ({"rank": 0, "world_size": 2, "local_rank": 0.0}, "local_rank"),
    ],
)
def test_explicit_numbers_that_are_not_ints_are_refused_not_truncated(explicit, arg):
    with pytest.raises(ValueError, match=rf"rendezvous: {arg} must be an integer, got "):
        ct.detect({}, **explicit)


def test_explicit_ints_and_digit_strings_are_taken():
    import numpy as np

    assert ct.detect({}, rank=np.int64(1), world_size="2").rank == 1


@pytest.mark.parametrize("nodelist", ["n[\u0663-\u0665]", "n[1-\u0663]", "n[\u0660\u0661-\u0660\u0663]"])
def test_host_numbers_must_be_ascii_digits_in_both_the_expansion_and_the_summary(nodelist):
    with pytest.raises(ValueError, match=r"parse_nodelist: .* is not a number or a range like 01-04"):
        ct.parse_nodelist(nodelist)
    with pytest.raises(ValueError, match=r"parse_nodelist: .* is not a number or a range like 01-04"):
        nodelist_summary(nodelist)


def test_a_host_number_too_long_for_an_int_is_refused_by_name():
    nodelist = "n[1-" + "9" * 5000 + "]"
    for read in (ct.parse_nodelist, nodelist_summary):
        with pytest.raises(ValueError, match=r"parse_nodelist: .* has more digits than a host number can"):
            read(nodelist)


def test_a_step_on_part_of_the_allocation_meets_on_its_own_first_node():
    """``srun -N1 -w gpu08`` inside a two-node job: srun sets the step's SLURM_STEP_NODELIST and SLURM_NNODES,
    SLURM_JOB_NODELIST stays the job's; rank 0 runs on gpu08, not on the job's first node."""
    env = slurm_task_one(
        SLURM_STEP_NODELIST="gpu08",
        SLURM_STEP_NUM_NODES="1",
        SLURM_NNODES="1",
        SLURM_NTASKS="2",
        SLURM_TASKS_PER_NODE="2",
        SLURM_PROCID="1",
        SLURM_LOCALID="1",
    )
    cluster = ct.detect(env)
    assert (cluster.master_addr, cluster.world_size, cluster.local_world_size) == ("gpu08", 2, 2)
    with pytest.raises(ValueError, match=r"SLURM_STEP_NUM_NODES=3 but SLURM_STEP_NODELIST='gpu08' names 1 hosts"):
        ct.detect({**env, "SLURM_STEP_NUM_NODES": "3"})


@pytest.mark.parametrize("addr", ["", "  "])
def test_an_empty_master_addr_is_refused_before_waiting_for_the_others(addr):
    """``MASTER_ADDR=$HEAD`` with HEAD unset: the other ranks would wait the whole timeout (300 s) for ':29500'."""
    with pytest.raises(ValueError, match=r"rendezvous: MASTER_ADDR is empty \(from the torchrun values\)"):
        ct.rendezvous(env={**TORCHRUN, "MASTER_ADDR": addr}, timeout=5)
    with pytest.raises(ValueError, match=r"rendezvous: MASTER_ADDR is empty \(from the slurm values\)"):
        ct.detect(slurm_task_one(MASTER_ADDR=addr))
    with pytest.raises(ValueError, match=r"rendezvous: MASTER_ADDR is empty \(from the explicit values\)"):
        ct.detect({}, rank=0, world_size=2, master_addr=addr)
    assert ct.detect({}, rank=0, world_size=1, master_addr=addr).world_size == 1  # alone: no one to meet

"""rendezvous: launcher environments, SLURM host lists, and real launches (torchrun, srun-like)."""

import os
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import process_group_threads, slurm_env, train_distributed
from hypothesis import given
from hypothesis import strategies as st
from processes import Job, free_port, wait_all

import composetrain as ct

HERE = Path(__file__).resolve().parent
LAUNCH = str(HERE / "test_rendezvous.py")  # this file, launched as a script: its main block at the end


# -- SLURM host lists ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("gpu-[1-2]-[3,5]", ["gpu-1-3", "gpu-1-5", "gpu-2-3", "gpu-2-5"]),
        ("10.0.0.[089,100-102]", ["10.0.0.089", "10.0.0.100", "10.0.0.101", "10.0.0.102"]),
        ("a[1-2],b3,c", ["a1", "a2", "b3", "c"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("localhost", ["localhost"]),
        ("dgx-a100-[001-002],login", ["dgx-a100-001", "dgx-a100-002", "login"]),
        ("rack[1-2]-node[1,3]", ["rack1-node1", "rack1-node3", "rack2-node1", "rack2-node3"]),
    ],
)
def test_real_slurm_host_lists_expand(nodelist, hosts):
    assert ct.parse_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    ("nodelist", "problem"),
    [
        ("node[01-", "unbalanced brackets"),
        ("node]1", "']' without '\\['"),
        ("node[[1]]", "nested brackets"),
        ("node[3-1]", "runs backwards"),
        ("node[a-b]", "is not a number or a range"),
        ("node[]", "is not a number or a range"),
        ("a,,b", "an empty host name"),
        ("", "empty or not a string"),
    ],
)
def test_malformed_host_lists_are_clear_errors(nodelist, problem):
    with pytest.raises(ValueError, match=f"parse_nodelist: .*{problem}"):
        ct.parse_nodelist(nodelist)


@given(
    groups=st.lists(
        st.tuples(
            st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True),
            st.lists(st.integers(0, 120), min_size=1, max_size=5, unique=True),
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_compressed_host_lists_round_trip(groups):
    """Hosts written in SLURM's compressed form expand back to exactly those hosts."""
    text, expected = [], []
    for prefix, numbers, width in groups:
        numbers = sorted(numbers)
        parts = [f"{n:0{width}d}" for n in numbers]
        text.append(f"{prefix}[{','.join(parts)}]")
        expected += [prefix + p for p in parts]
    assert ct.parse_nodelist(",".join(text)) == expected


# -- reading the environment -------------------------------------------------------------------------
def test_torchrun_environment():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node7", "MASTER_PORT": "29501"}
    assert ct.detect(env) == ct.Cluster(3, 4, 1, "node7", 29501, "torchrun")


def slurm(**overrides):
    return slurm_env("5", "8", "1", **overrides)


def test_slurm_environment_derives_master_and_port():
    assert ct.detect(slurm()) == ct.Cluster(5, 8, 1, "gpu07", 15000 + 123456 % 15000, "slurm", job_id="123456")
    assert ct.detect(slurm(MASTER_PORT="29999", MASTER_ADDR="10.1.1.1")).master_port == 29999
    assert ct.detect(slurm(MASTER_ADDR="10.1.1.1")).master_addr == "10.1.1.1"


def test_torchrun_inside_srun_wins_and_explicit_values_win_over_both():
    env = {**slurm(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "29500"}
    assert ct.detect(env).source == "torchrun"
    explicit = ct.detect(env, rank=1, world_size=3, master_port=1234)
    assert (explicit.rank, explicit.world_size, explicit.master_port, explicit.source) == (1, 3, 1234, "explicit")


@pytest.mark.parametrize(
    ("env", "local_world_size", "job_id"),
    [
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, 4, None),
        (slurm(SLURM_NTASKS_PER_NODE="4"), 4, "123456"),
        (slurm(SLURM_TASKS_PER_NODE="4(x2)"), 4, "123456"),
        (slurm(SLURM_TASKS_PER_NODE="3,5", SLURM_NODEID="1"), 5, "123456"),  # node 1 of two: its own count
        (slurm(), 1, "123456"),
        # torchrun inside an allocation: torchrun's place, SLURM's job (a pre-empted run requeues it)
        ({**slurm(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, 2, "123456"),
        ({"SLURM_JOB_ID": "77"}, 1, "77"),  # one process under sbatch, without srun
        ({}, 1, None),
    ],
)
def test_the_node_and_job_come_from_the_launchers_variables(env, local_world_size, job_id):
    """Only the rendezvous reads launcher variables: the processes per node (the loaders' share of the
    cores) and the SLURM job to requeue are read into the Cluster, and the Process shows them."""
    cluster = ct.detect(env)
    assert (cluster.local_world_size, cluster.job_id) == (local_world_size, job_id)
    assert ct.Process(cluster, torch.device("cpu"), None, owns_group=False).local_world_size == local_world_size


def test_a_plain_process_is_rank_zero_of_one():
    assert ct.detect({}) == ct.Cluster(0, 1, 0, "127.0.0.1", 0, "single")


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        ({"SLURM_PROCID": "8"}, r"inconsistent slurm values .*rank=8, world_size=8"),
        ({"SLURM_NNODES": "3"}, r"SLURM_NNODES=3 but SLURM_JOB_NODELIST='gpu\[07-08\]' names 2 hosts"),
        ({"SLURM_LOCALID": None}, r"SLURM_PROCID is set but \['SLURM_LOCALID'\] are not; start the job with srun"),
        ({"SLURM_NTASKS": "x"}, r"world_size must be an integer, got 'x'"),
        ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, r"SLURM_NTASKS=1 is fewer than the 2"),
        ({"SLURM_JOB_ID": None}, r"set MASTER_PORT, or SLURM_JOB_ID"),
        ({"SLURM_JOB_NODELIST": "gpu[07-"}, r"parse_nodelist: unbalanced brackets"),
    ],
)
def test_inconsistent_slurm_variables_are_clear_errors(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        ct.detect(slurm(**overrides))


def test_more_local_ranks_than_gpus_is_a_clear_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(ValueError, match=r"local rank 5 but this node has 4 GPU\(s\); start one process per GPU"):
        ct.rendezvous(env=slurm(SLURM_LOCALID="5"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="give rank and world_size together"):
        ct.detect({}, rank=1)
    with pytest.raises(TypeError, match=r"unknown arguments \['nodes'\]"):
        ct.detect({}, nodes=2)
    with pytest.raises(ValueError, match=r"^rendezvous: timeout must be a positive, finite number, got 0 \(int\); e"):
        ct.rendezvous(timeout=0)


def test_a_single_process_needs_no_setup():
    with ct.rendezvous(env={}) as proc:
        assert (proc.rank, proc.world_size, proc.backend, proc.is_main) == (0, 1, None, True)
        assert proc.device == torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        assert not torch.distributed.is_initialized()


def test_an_unreachable_master_fails_after_the_timeout_naming_address_and_port():
    port = free_port()  # nothing listens there: rank 1 waits for a rank 0 that never comes
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"rank 1 of 2 could not meet the others at 127.0.0.1:{port} within 3s"):
        ct.rendezvous(env={}, rank=1, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=3)
    assert time.monotonic() - start < 30
    assert not torch.distributed.is_initialized()


def test_a_torchrun_rank_left_alone_names_the_attempt_the_missing_rank_and_the_timeout_to_raise():
    """Rank 0 of 2 under torchrun's variables, rank 1 never coming (or still importing torch on a loaded machine,
    which takes a minute there): the error names the attempt, the rank missing, and the timeout to raise."""
    port = free_port()
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    start = time.monotonic()
    expected = (
        r"rendezvous: rank 0 of 2 waited 2s for ranks \[1\] to join attempt 0 of run 'none' at 127.0.0.1:\d+; a rank "
        r"that never came failed to start, hangs, or is still starting \(on a loaded machine importing torch "
        r"alone takes a minute\): see its log, or raise timeout= \(2s now; torchrun restarts"
    )
    with pytest.raises(RuntimeError, match=expected):
        ct.rendezvous(env=env, timeout=2)
    assert time.monotonic() - start < 30
    assert not torch.distributed.is_initialized()


# -- real launches ----------------------------------------------------------------------------
def clean_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def assert_trained_like_one_process(out: Path, world: int, source: str):
    reference = train_distributed(CASE, rank=None)
    results = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
    assert [r["cluster"].source for r in results] == [source] * world
    assert sorted(r["cluster"].rank for r in results) == list(range(world))
    for r in results:
        assert r["threads_left"] in ([], None), "the process group outlived ct.rendezvous's close"
        assert all(torch.equal(p, q) for p, q in zip(r["params"], results[0]["params"], strict=True))
        assert r["step"] == reference["step"] == 3
    for p, q in zip(results[0]["params"], reference["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=2e-2, atol=2e-3)  # bf16 inside: micro-batch boundaries differ


def test_two_torchrun_nodes_on_localhost_form_one_group_and_train_like_one_process(tmp_path):
    port = free_port()
    # the rendezvous store lives here, not in one of the agents: otherwise the agent hosting it may
    # exit first and the other's last look at the store fails (a torchrun teardown race)
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=ct-test",
        "--rdzv-conf=is_host=0",
        "--local-addr=127.0.0.1",
        LAUNCH,
        str(tmp_path),
    ]
    wait_all([Job(command, clean_env()) for _ in range(2)], timeout=240)
    del store  # alive until both agents are done
    assert_trained_like_one_process(tmp_path, 2, "torchrun")


def test_srun_style_environment_without_torchrun_trains_like_one_process(tmp_path):
    port = free_port()
    job_id = port - 15000 if 15000 <= port < 30000 else None
    extra = {} if job_id is not None else {"MASTER_PORT": str(port)}
    procs = []
    for rank in range(2):  # two "nodes" of one task each, both on this machine
        env = clean_env(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS="2",
            SLURM_LOCALID="0",
            SLURM_NNODES="2",
            SLURM_JOB_NODELIST="localhost,localhost",
            SLURM_JOB_ID=str(job_id if job_id is not None else 1),
            **extra,
        )
        procs.append(Job([sys.executable, LAUNCH, str(tmp_path)], env))
    wait_all(procs, timeout=240)
    assert_trained_like_one_process(tmp_path, 2, "slurm")


@pytest.mark.parametrize("transform", [ct.distributed, ct.sharded])
def test_transforms_that_sync_processes_learn_of_a_launch_without_a_group_from_rendezvous(monkeypatch, transform):
    from helpers import classify, make_batch, make_state

    from composetrain.launch.rendezvous import unjoined_launch

    assert unjoined_launch({"WORLD_SIZE": "1"}) is None and unjoined_launch({}) is None
    assert "RANK is not" in unjoined_launch({"WORLD_SIZE": "2"})
    assert "no process group is initialised" in unjoined_launch({"WORLD_SIZE": "2", "RANK": "0"})
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.delenv("RANK", raising=False)
    state = make_state()
    before = [p.detach().clone() for p in state.model.parameters()]
    with pytest.raises(RuntimeError, match=r"\(classify\): WORLD_SIZE=3 is set but RANK is not: launch with torchrun"):
        transform(classify)(state, make_batch(4))
    assert state.step == 0 and all(torch.equal(a, p) for a, p in zip(before, state.model.parameters(), strict=True))


# -- the launched script: trains one distributed case under whatever launched this process (torchrun, srun-like
# environment variables, ...) and saves this rank's result to OUT/rank<r>.pt.
#
#     torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT \
#         tests/test_rendezvous.py OUT

CASE = {
    "composition": "distributed(mixed_precision(dtype='bf16')(accumulate(n)(step)))",
    "n": 2,
    "kind": "classify",
    "sizes": [[5, 7], [6, 6], [8, 3]],
    "seed": 3,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    with ct.rendezvous() as proc:  # the default 300 s: on a loaded machine the ranks import torch for a minute
        result = train_distributed(CASE, proc.rank)
        result["cluster"] = proc.cluster
    result["threads_left"] = process_group_threads()
    torch.save(result, out / f"rank{proc.rank}.pt")

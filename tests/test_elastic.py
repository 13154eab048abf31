"""Surviving at scale: a rank killed anywhere is restarted by torchrun and the job ends bit-identical to an
uninterrupted run; a rank that stops answering fails the others within the timeout, naming what they waited for.

``CT_ELASTIC_SWEEP=20 pytest tests/test_elastic.py -k sweep`` runs 20 kills at random moments over
every launch shape (static and c10d rendezvous, 1 node x 2 processes and 2 nodes x 1 process).
"""

import os
import random
import re
import sys
import time

import pytest
from elastic_runs import JOB, assert_bit_identical, environment, torchrun
from processes import Job, free_port


@pytest.mark.parametrize(
    ("nodes", "backend", "kill"),
    [
        (1, "static", "1:update:7"),  # inside the 7th forward: update 4's first micro-batch
        (1, "c10d", "0:rendezvous"),  # its place claimed, the others not yet there
        (2, "static", "1:save:3"),  # inside the 3rd save, after its first file
        (2, "c10d", "0:eval:2"),  # inside the 2nd evaluation
        (1, "static", "0:full:3"),  # the disk is full at the 3rd save: rank 0 fails, rank 1 is named the save
    ],
)
def test_a_rank_killed_anywhere_is_restarted_and_the_job_ends_bit_identical(
    tmp_path, uninterrupted_elastic_job, nodes, backend, kill
):
    results, killed, printed = torchrun(tmp_path, "job", nodes=nodes, backend=backend, kill=kill)
    assert killed, "the rank was never killed: the test tested nothing"
    assert max(int(r["restart"]) for r in results) == 1  # torchrun restarted the group once
    assert_bit_identical(results, uninterrupted_elastic_job)
    if "full" in kill:  # the full disk is named, and the other rank, told at once, says why it stops
        named = r"run: no space left in .* for checkpoint step \d+ .*left on device \(injected\).*, on rank 0\)"
        assert len(re.findall(named, printed)) >= 2, printed  # rank 0's own error, and rank 1 told the same


SWEEP = int(os.environ.get("CT_ELASTIC_SWEEP", "0"))


@pytest.mark.skipif(not SWEEP, reason="a long sweep: set CT_ELASTIC_SWEEP=N to run N kills at random moments")
@pytest.mark.parametrize("trial", range(max(SWEEP, 1)))
def test_sweep_kills_at_random_moments(tmp_path, uninterrupted_elastic_job, trial):
    rng = random.Random(trial)
    nodes, backend = rng.choice([1, 2]), rng.choice(["static", "c10d"])
    where = rng.choice(
        [
            "rendezvous",
            f"update:{rng.randint(1, 24)}",
            f"save:{rng.randint(1, 6)}",
            f"eval:{rng.randint(1, 4)}",
            f"agree:{rng.randint(1, 12)}",
        ]
    )
    kill = f"{rng.randint(0, 1)}:{where}"
    start = time.monotonic()
    results, killed, _ = torchrun(tmp_path, "job", nodes=nodes, backend=backend, kill=kill)
    print(f"trial {trial}: {nodes} node(s), {backend}, kill {kill}: {time.monotonic() - start:.1f}s")
    assert killed
    assert_bit_identical(results, uninterrupted_elastic_job)


# -- a rank that stops answering ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("hang", "phase"),
    [
        ("1:hang-update:7", r"update 4 \(its forward, backward and gradient all-reduce\)"),
        ("1:hang-agree:3", r"the agreement on whether to stop after update 3"),
    ],
)
def test_a_rank_that_stops_answering_fails_the_others_within_the_timeout(tmp_path, hang, phase):
    """Rank 1 stops itself (SIGSTOP) mid-job: rank 0 fails within the timeout (5 s), naming what it waited for,
    so that the launcher can restart the job; nothing waits for ever."""
    port, timeout = free_port(), 5
    args = [JOB, "--dir", str(tmp_path / "job"), "--out", str(tmp_path / "job.pt"), "--kill", hang]
    env = {**environment(), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    jobs = [
        Job([sys.executable, *args, "--timeout", str(timeout)], {**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(2)
    ]
    with jobs[0], jobs[1]:
        marker = tmp_path / "job.killed"
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert jobs[0].poll() is None and time.monotonic() < deadline, jobs[0].output()[-3000:]
            time.sleep(0.02)
        stopped = time.monotonic()
        code, out = jobs[0].finish(timeout=timeout + 60)
        waited = time.monotonic() - stopped
    assert code != 0
    assert waited < timeout + 20, f"rank 0 failed {waited:.1f}s after rank 1 stopped, timeout {timeout}s"
    pattern = rf"run: rank 0 of 2 waited more than 5s for the other ranks during {phase}: a rank stopped answering"
    assert re.search(pattern, out), out[-3000:]


def test_only_errors_that_say_a_rank_was_lost_are_reworded():
    import torch

    from composetrain.driver.waiting import Waiting
    from composetrain.launch.rendezvous import Cluster, Process

    def waiting(world):
        proc = Process(Cluster(1, world, 1, "127.0.0.1", 1, "explicit"), torch.device("cpu"), "gloo", False)
        w = Waiting(proc, 7)
        w.now("the save of checkpoint step 4")
        return w

    timed_out = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 7000ms for recv operation")
    lost = waiting(2).lost(timed_out)
    assert str(lost).startswith(
        "run: rank 1 of 2 waited more than 7s for the other ranks during the save of checkpoint step 4: a rank "
        "stopped answering"
    )
    assert "Timed out waiting 7000ms" in str(lost)
    peer = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234")
    assert "lost another rank during the save of checkpoint step 4" in str(waiting(2).lost(peer))
    assert waiting(2).lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert waiting(1).lost(timed_out) is None  # alone, nobody to wait for

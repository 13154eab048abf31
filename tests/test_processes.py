"""The test harness itself (tests/processes.py): a launched job, a group of jobs and a rank pool that hangs are
killed with everything they started.
"""

import atexit
import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from processes import Job, Pool, alive, wait_all, wait_for

SLEEPER = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {worker.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


@pytest.mark.parametrize("ending", ["timeout", "error"])
def test_a_launched_job_is_killed_with_everything_it_started(tmp_path, ending):
    """A job that sleeps, with a worker in a session of its own (as torchrun starts its workers):
    a timeout, or an error in the test while it runs, leaves neither of them running."""
    pids = tmp_path / "pids"
    job = Job([sys.executable, "-c", SLEEPER, str(pids)])
    if ending == "timeout":
        with job:
            wait_for(pids.exists)
            with pytest.raises(pytest.fail.Exception, match=r"still running after 0.5s, killed"):
                job.finish(timeout=0.5)
    else:
        with pytest.raises(TimeoutError), job:
            wait_for(pids.exists)
            wait_for(lambda: False, timeout=0.5)  # the test gives up while the job still runs
    parent, worker = (int(p) for p in pids.read_text().split())
    assert job.returncode == -signal.SIGKILL
    for pid, who in ((parent, "the job"), (worker, "its worker")):
        with contextlib.suppress(TimeoutError):
            wait_for(lambda pid=pid: not alive(pid), timeout=5)  # SIGKILL is delivered asynchronously
        assert not alive(pid), f"{who} (pid {pid}) is still running"  # killed: gone, or a zombie


def test_waiting_for_several_jobs_kills_them_all_as_soon_as_one_fails(tmp_path):
    """As a rank that crashes leaves the others waiting in the rendezvous: no waiting for the timeout."""
    pids = tmp_path / "pids"
    with Job([sys.executable, "-c", SLEEPER, str(pids)]) as waiting:
        wait_for(pids.exists)
        failing = Job([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
        start = time.monotonic()
        expected = r"a process failed, the others were killed(?s:.)*exit 3:\nboom"
        with pytest.raises(pytest.fail.Exception, match=expected):
            wait_all([waiting, failing], timeout=120)
        assert time.monotonic() - start < 60
    for pid in (int(p) for p in pids.read_text().split()):
        with contextlib.suppress(TimeoutError):
            wait_for(lambda pid=pid: not alive(pid), timeout=5)
        assert not alive(pid), f"pid {pid} is still running"


def test_a_pool_whose_rank_hangs_is_killed_on_timeout():
    hung = Pool(1)
    try:
        hanging = r"pool: rank 0 did not reply within 1s while running test_processes.hang"
        with pytest.raises(TimeoutError, match=hanging):
            hung.run(__name__, "hang", timeout=1)
        assert not any(alive(p.pid) for p in hung.procs)
    finally:
        hung.close()


def test_a_pool_whose_rank_dies_mid_call_fails_at_once_and_for_every_later_call():
    """Rank 1 is killed while rank 0 waits (as in a collective): the call fails within seconds, not its
    timeout, naming the rank, its exit status and the call; the pool is killed, and a later call (the next
    hypothesis example) fails at once saying why instead of waiting its timeout again."""
    pool = Pool(2)
    try:
        pids = pool.run(__name__, "process_id")
        start = time.monotonic()
        died = r"pool: rank 1 \(exit code -9\) died while running test_processes.die; the pool was killed"
        with pytest.raises(RuntimeError, match=died):
            pool.run(__name__, "die", 1, timeout=300)
        assert time.monotonic() - start < 30
        assert not any(alive(p) for p in pids)
        start = time.monotonic()
        with pytest.raises(
            RuntimeError, match=r"cannot run test_processes.process_id: the pool was killed earlier \(" + died
        ):
            pool.run(__name__, "process_id")
        assert time.monotonic() - start < 1
    finally:
        pool.close()


def test_a_pool_whose_rank_dies_before_joining_names_the_rendezvous():
    pool = Pool(2)
    try:
        pool.procs[1].kill()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"rank 1 \(exit code -9\) died in the rendezvous \(before running "):
            pool.run(__name__, "process_id", timeout=300)
        assert time.monotonic() - start < 30
        assert not any(alive(p.pid) for p in pool.procs)
    finally:
        pool.close()


def test_a_pool_whose_rank_will_not_leave_fails_its_teardown_and_is_killed():
    pool = Pool(1)
    pids = pool.run(__name__, "process_id")
    pool.run(__name__, "linger", 0)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"pool: rank 0 still running 2s into the teardown; killed"):
        pool.close(timeout=2)
    assert time.monotonic() - start < 20
    assert not alive(pids[0])


HANGING = """
import signal, time
import pytest

@pytest.fixture
def stuck():
    time.sleep(600)

def test_setup(stuck):
    pass

def test_call():
    time.sleep(600)

def test_beyond_signals():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as a wait inside C++ that no signal ends
    time.sleep(600)
"""


def test_a_hanging_test_fails_naming_itself_and_its_phase_and_a_stuck_one_ends_the_session(tmp_path):
    """tests/time_limit.py: a test past CT_TEST_TIMEOUT fails with its name and phase; one that SIGALRM cannot
    interrupt is ended by the watchdog, which names it too and ends the session."""
    (tmp_path / "test_hanging.py").write_text(HANGING)
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "CT_TEST_TIMEOUT": "1", "CT_TEST_TIMEOUT_GRACE": "2", "PYTHONPATH": here}
    command = [sys.executable, "-m", "pytest", "-p", "time_limit", "-p", "no:cacheprovider", "-q", str(tmp_path)]
    start = time.monotonic()
    with Job(command, env) as job:
        code, printed = job.finish(timeout=120)
    assert time.monotonic() - start < 100
    assert code == 1, printed
    for test, phase in (("test_setup", "setup"), ("test_call", "call")):
        assert f"test_hanging.py::{test}: still running after 1s in its {phase} (CT_TEST_TIMEOUT=1)" in printed
    assert "test_hanging.py::test_beyond_signals: still running after 1s in its call, and SIGALRM did not" in printed
    assert printed.count("SIGALRM did not end it") == 1, printed  # only that phase's watchdog: the others ended
    assert re.search(r"File .*test_hanging.py\", line 17 in test_beyond_signals", printed), printed


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# Ranks that die, hang, or will not leave.


def process_id(rank, world):
    return os.getpid()


def die(rank, world, victim):
    """``victim`` is killed mid-call; the others wait for it, as in a collective, for good."""
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


def linger(rank, world, victim):
    """``victim`` will not exit when the pool closes (a thread stuck at the interpreter's exit, say)."""
    if rank == victim:
        atexit.register(time.sleep, 600)


def hang(rank, world):
    """A rank stuck for good (in a collective, say)."""
    time.sleep(600)

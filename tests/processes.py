"""The one harness for the tests' processes: launched jobs and pools of ranks, never left behind.

``Job`` runs a command (run_script.py, torchrun, srun-like launches) in a session of its own, writing to files
(no pipe that fills up and blocks it). On a timeout, a failure, or leaving its ``with`` block, it is killed with
everything it started: its session, and every descendant, also those in sessions of their own (torchrun starts
each worker with ``start_new_session=True``, so killing torchrun's session alone would leave the workers
running). ``wait_all`` waits for several jobs that depend on each other (the ranks of one launch).

``Pool`` is ``world`` spawned ranks joined in one gloo group, reused across test cases: starting a process that
imports torch takes seconds here, so the ranks start once per test module and then run many cases each
(hypothesis examples included): the parent sends a case, by module and function name, to every rank and
collects one result per rank. A test module sends its own functions, by its own name:
``pool.run(__name__, "case", *args)``; each rank imports that module by name (the tests' folder is on the path
the spawned ranks inherit), so a case lives in the test file it serves. A hanging pool is killed like a job.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

__all__ = ["Job", "Pool", "S3Server", "alive", "free_port", "kill_tree", "run", "wait_all", "wait_for"]


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, state) of every process, read from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # the command name, in parentheses, may hold spaces: split after its last ')'
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def _family(roots: set[int], sessions: set[int], table: dict[int, tuple[int, int, str]]) -> set[int]:
    """``roots``, the members of ``sessions`` (orphans included), and all their descendants."""
    found = {p for p in roots if p in table}
    found |= {p for p, (_, session, _) in table.items() if session in sessions}
    while True:
        children = {p for p, (parent, _, _) in table.items() if parent in found} - found
        if not children:
            break
        found |= children
    ours = {os.getpid(), os.getppid()}  # never this test process or what started it
    return {p for p in found - ours if table[p][2] not in "ZX"}  # zombies are dead already


def kill_tree(pid: int, *, reaped: bool = False) -> None:
    """SIGKILL ``pid`` and its whole family. Each member is stopped first, until no new one appears,
    so that none can start another process between the look and the kill. Once ``pid`` is
    ``reaped`` it may name another process: only its session's members are then looked for (the
    kernel reuses no pid while a session still bears it)."""
    if not Path("/proc/self/stat").exists():  # no /proc: the process group is the best we know
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        return
    stopped: set[int] = set()
    root = set() if reaped else {pid}
    while True:
        new = _family(root | stopped, {pid} | stopped, _processes()) - stopped
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        stopped |= new
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not a zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in "ZX"


class Job(subprocess.Popen):
    """``command`` in a session of its own, stdout and stderr to files. ``with Job(...) as job:``
    kills whatever is left of it on the way out, however the block ends."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.out_file = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by __exit__
        self.err_file = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by __exit__
        super().__init__(
            command, env=env, stdout=self.out_file, stderr=self.err_file, text=True, start_new_session=True
        )

    def stdout_text(self) -> str:
        self.out_file.seek(0)
        return self.out_file.read()

    def output(self) -> str:
        """What it printed: its stdout, then its stderr."""
        self.err_file.seek(0)
        return self.stdout_text() + self.err_file.read()

    def kill_all(self) -> None:
        """Kill it and everything it started; reap it."""
        kill_tree(self.pid, reaped=self.poll() is not None)
        self.wait()

    def finish(self, timeout: float) -> tuple[int, str]:
        """Its exit code and output once it ends; past ``timeout`` seconds (or on any error while
        waiting), it is killed with all it started and the test fails with what it printed."""
        try:
            self.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            pytest.fail(f"{self.args!r} still running after {timeout}s, killed; it printed:\n{self.output()[-4000:]}")
        finally:
            self.kill_all()  # also what it left running after it ended (its session's orphans)
        return self.returncode, self.output()

    def __exit__(self, *exc: Any) -> None:
        self.kill_all()
        self.out_file.close()
        self.err_file.close()


def run(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs ``command`` to its end and returns its stdout; fails the test, killing it and all it
    started, if it runs past ``timeout`` seconds or exits with an error."""
    with Job(command, env) as job:
        code, out = job.finish(timeout)
        if code != 0:
            pytest.fail(f"{command!r} exited with {code}; it printed:\n{out[-4000:]}")
        return job.stdout_text()


def wait_all(jobs: list[Job], timeout: float) -> None:
    """Waits until every job has succeeded. As soon as one fails, or when ``timeout`` seconds have
    passed, kills them all (the others would wait for it in a rendezvous) and fails the test with
    what each printed."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [j.poll() for j in jobs]  # every one polled, each time
            failed = any(c not in (None, 0) for c in codes)
            timed_out = None in codes and time.monotonic() > deadline
            if None not in codes or failed or timed_out:
                break
            time.sleep(0.1)
    finally:
        for j in jobs:
            j.kill_all()
    if failed or timed_out:
        printed = "\n-----\n".join(f"exit {j.returncode}:\n{j.output()[-3000:]}" for j in jobs)
        why = "a process failed, the others were killed" if failed else f"still running after {timeout}s, killed"
        pytest.fail(f"{why}; each printed:\n{printed}")


def wait_for(condition: Any, timeout: float = 60) -> None:
    """Polls ``condition()`` until it is true; TimeoutError past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never came true")
        time.sleep(0.05)


# -- an S3-compatible server ------------------------------------------------------------------------


class S3Server:
    """moto's standalone S3-compatible server on 127.0.0.1, in a process of its own (``kill()``: SIGKILL, whatever
    it is serving). ``env``: what points s3fs and boto3 at it, with test credentials and none of this machine's AWS
    configuration or instance metadata; ``server_env``: the server's own settings (moto's
    ``INITIAL_NO_AUTH_ACTION_COUNT`` makes it check credentials and IAM policies after that many requests)."""

    def __init__(self, **server_env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.job = Job(command, {**os.environ, **server_env})
        try:
            wait_for(self._listening, timeout=120)
        except TimeoutError:
            self.kill()
            raise RuntimeError(f"moto's server did not start: {self.job.output()[-2000:]}") from None
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_MAX_ATTEMPTS": "2",  # a server gone is said within seconds
        }

    def _listening(self) -> bool:
        if self.job.poll() is not None:
            raise RuntimeError(f"moto's server ended: {self.job.output()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
            return True
        return False

    def client(self, service: str = "s3", **credentials: str) -> Any:
        import boto3

        keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", **credentials}
        return boto3.client(service, endpoint_url=self.url, region_name="us-east-1", **keys)

    def bucket(self, name: str) -> str:
        """A new bucket ``name``, empty: its URL."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def kill(self) -> None:
        self.job.kill_all()

    def close(self) -> None:
        self.job.__exit__(None, None, None)


# -- a pool of ranks --------------------------------------------------------------------------------


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768+). A port from that range can be handed to a
    client, retrying to connect before the server binds, as its own source port: it then connects to
    itself, and the rendezvous fails now and then. Under pytest-xdist each worker draws from its own part of
    that range, so two workers never hand out the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    width = 12000 // max(count, 1)
    low = 20000 + width * (int(worker) % max(count, 1) if worker.isdigit() else 0)
    while True:
        port = random.randrange(low, low + width)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


READY = "ready"  # what a rank sends once it has joined the group, before any result


def _serve(rank: int, world: int, port: int, timeout: float, jobs: Any, results: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # several ranks share two cores
    import composetrain as ct

    with ct.rendezvous(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, timeout=timeout):
        results.put((rank, READY, b""))
        while True:
            job = jobs.get()
            if job is None:
                return
            module, function, args = job
            try:
                target = getattr(__import__(module), function)
                results.put((rank, "ok", pickle.dumps(target(rank, world, *args))))
            except BaseException:
                results.put((rank, "error", traceback.format_exc()))


class Pool:
    """``world`` ranks in one gloo group; ``run(module, function, *args)`` calls
    ``module.function(rank, world, *args)`` on every rank and returns the results by rank.

    Nothing waits for ever: the first ``run`` waits for the ranks to join (``join_timeout``, the
    "rendezvous" phase); each call waits at most its ``timeout``; a rank that dies is noticed within
    a fraction of a second, whatever the phase, and the error says which rank, its exit status and
    what it was doing. A pool that failed so is killed, and every later ``run`` fails at once,
    saying why (a hypothesis test would otherwise wait the timeout for each example it shrinks)."""

    POLL = 0.2  # seconds between looks at the ranks while waiting for their replies

    def __init__(self, world: int, join_timeout: float = 300) -> None:
        ctx = mp.get_context("spawn")
        self.world = world
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        self.join_timeout = join_timeout
        self.ready: set[int] = set()
        self.broken: str | None = None  # why the pool was killed
        port = free_port()
        self.procs = [
            ctx.Process(target=_serve, args=(r, world, port, join_timeout, self.jobs[r], self.results), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def run(self, module: str, function: str, *args: Any, timeout: float = 120, deaths: bool = False) -> list[Any]:
        """``deaths=True``: ranks may exit during this call (a test that kills ranks): each one that exits before
        replying gives None, the others' replies (errors too, as their tracebacks) are returned, and the pool is
        unusable afterwards (its group lost members)."""
        who = f"{module}.{function}"
        if self.broken is not None:
            raise RuntimeError(f"pool: cannot run {who}: the pool was killed earlier ({self.broken})")
        if len(self.ready) < self.world:
            self._collect(f"in the rendezvous (before running {who})", self.join_timeout, None)
        for q in self.jobs:
            q.put((module, function, args))
        replies: dict[int, tuple[str, Any]] = {}
        self._collect(f"while running {who}", timeout, replies, deaths)
        if deaths:
            self.broken = f"{who} let ranks die"
            return [
                None
                if replies[r][0] == "died"
                else replies[r][1]
                if replies[r][0] == "error"
                else pickle.loads(replies[r][1])
                for r in range(self.world)
            ]
        failed = [f"rank {rank} failed:\n{reply[1]}" for rank, reply in sorted(replies.items()) if reply[0] == "error"]
        if failed:
            raise RuntimeError("\n".join(failed))
        return [pickle.loads(replies[r][1]) for r in range(self.world)]

    def _collect(
        self, phase: str, timeout: float, replies: dict[int, tuple[str, Any]] | None, deaths: bool = False
    ) -> None:
        """Waits for every rank's result (errors too) into ``replies``, or with ``replies`` None for every
        rank's READY. A rank that exits first, or ``timeout`` seconds passing, kills the pool and raises,
        naming the phase and the ranks waited for."""
        deadline = time.monotonic() + timeout
        while True:
            have = self.ready if replies is None else replies
            waiting = [r for r in range(self.world) if r not in have]
            if not waiting:
                return
            try:
                rank, status, payload = self.results.get(timeout=self.POLL)
            except queue.Empty:
                pass
            else:
                if status == READY:
                    self.ready.add(rank)
                elif replies is not None:
                    replies[rank] = (status, payload)
                continue
            # any rank's exit, not only a waited-for one's: the group is gone with it
            dead = [(r, p.exitcode) for r, p in enumerate(self.procs) if p.exitcode is not None]
            if deaths and replies is not None:  # expected: a rank that exits without a reply gives "died"
                for r, code in dead:
                    replies.setdefault(r, ("died", code))
                dead = []
            if dead:
                died = ", ".join(f"rank {r} (exit code {code})" for r, code in dead)
                self._fail(RuntimeError, f"pool: {died} died {phase}; the pool was killed")
            if time.monotonic() > deadline:
                ranks = ", ".join(f"rank {r}" for r in waiting)
                self._fail(
                    TimeoutError, f"pool: {ranks} did not reply within {timeout:g}s {phase}; the pool was killed"
                )

    def _fail(self, error: type[Exception], message: str) -> None:
        self.kill()
        self.broken = message
        raise error(message)

    def close(self, timeout: float = 120) -> None:
        """Teardown: asks every rank to leave and waits ``timeout`` seconds for them; kills what is left, and
        fails naming the teardown if a rank had not left. A rank's exit (torch's and gloo's teardown) takes 20 s
        of wall-clock at load 12 on 2 cores: 30 s failed test_distributed there."""
        stuck = []
        if self.broken is None:
            for q in self.jobs:
                q.put(None)
            deadline = time.monotonic() + timeout
            for r, p in enumerate(self.procs):
                p.join(timeout=max(0.0, deadline - time.monotonic()))
                stuck += [f"rank {r}"] if p.exitcode is None else []
        self.kill()  # those still running, and whatever any rank started
        if stuck:
            raise TimeoutError(f"pool: {', '.join(stuck)} still running {timeout:g}s into the teardown; killed")

    def kill(self) -> None:
        for p in self.procs:
            kill_tree(p.pid, reaped=p.exitcode is not None)
            p.join(timeout=30)
        for q in [*self.jobs, self.results]:
            # what was put for a rank that is gone is never read: exiting must not wait to flush it to the pipe
            q.cancel_join_thread()
            q.close()

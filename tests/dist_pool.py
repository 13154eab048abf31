"""A pool of real processes joined in a gloo group, reused across test cases.

Starting a process that imports torch takes seconds here, so the ranks start once
per test module and then run many cases each (hypothesis examples included): the
parent sends a case to every rank and collects one result per rank.
"""

from __future__ import annotations

import os
import pickle
import queue
import random
import socket
import traceback
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768+). A port from that range can be handed to a
    client, retrying to connect before the server binds, as its own source port: it then connects to
    itself, and the rendezvous fails now and then."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def _serve(rank: int, world: int, port: int, jobs: Any, results: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # several ranks share two cores
    import composetrain as ct

    with ct.rendezvous(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, timeout=60):
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
    ``module.function(rank, world, *args)`` on every rank and returns the results by rank."""

    def __init__(self, world: int) -> None:
        ctx = mp.get_context("spawn")
        self.world = world
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [
            ctx.Process(target=_serve, args=(r, world, port, self.jobs[r], self.results), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def run(self, module: str, function: str, *args: Any, timeout: float = 120) -> list[Any]:
        for q in self.jobs:
            q.put((module, function, args))
        try:
            replies = [self.results.get(timeout=timeout) for _ in range(self.world)]  # every rank's, errors too
        except queue.Empty:  # a rank hangs (in a collective, most likely): the pool is of no more use
            self.kill()
            who = f"{module}.{function}"
            raise TimeoutError(f"{who}: some rank did not reply within {timeout}s; the pool was killed") from None
        errors = [f"rank {rank} failed:\n{payload}" for rank, status, payload in sorted(replies) if status == "error"]
        if errors:
            raise RuntimeError("\n".join(errors))
        out = {rank: pickle.loads(payload) for rank, _, payload in replies}
        return [out[r] for r in range(self.world)]

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
        self.kill()  # those still running, and whatever any rank started

    def kill(self) -> None:
        from launching import kill_tree  # not at the top: the ranks import this module too

        for p in self.procs:
            kill_tree(p.pid, reaped=p.exitcode is not None)
            p.join()

"""Elastic restarts (internal): each attempt of a torchrun job meets in a store namespace of its own.

torchrun's store outlives the workers: when a worker dies and the agents restart the group, the
killed attempt's keys are still there (gloo's addresses, barrier counters), and the restarted
processes read them and fail in gloo's ``connectFullMesh`` ("Connection refused") or hang
(pytorch issues 167288, 135712). So each attempt takes a fresh prefix, ``composetrain/<run>/<n>/``.

Every rank must agree on ``n``, and the agents' restart counts cannot say it: each node's agent
keeps its own, and a node whose workers did not fail restarts them without counting. Instead the
ranks agree through the store:

- ``composetrain/<run>/attempt`` holds the newest attempt number;
- a process claims its rank's slot in attempt ``n`` (``compare_set`` from empty to a nonce of its
  own). A slot held by someone else belongs to an earlier process, so attempt ``n`` is stale: the
  process moves the attempt number on (``compare_set(n, n + 1)``: one mover wins, everybody reads
  the winner) and claims there;
- once every slot of ``n`` is taken a process marks itself ready, and it accepts ``n`` once every
  rank is ready, or leaves for the newer attempt as soon as the number moves on.

A killed process never marks a mixed attempt (its slots taken partly by the killed attempt, partly by
the restarted one) ready: it would have had to see every slot taken, the restarted processes' too,
before it was killed, and those start only after it is dead. The restarted process of its rank
finds its slot taken and moves the number on, so the others leave the mixed attempt too.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

import torch.distributed as dist

__all__ = ["AttemptTimeout", "join_attempt"]


class AttemptTimeout(RuntimeError):
    """The other ranks did not all join this attempt in time."""


def join_attempt(store: Any, rank: int, world_size: int, run_id: str, timeout: float) -> tuple[Any, int]:
    """Join the newest attempt of ``run_id`` that every rank of this start joins too.

    Args:
        store: the job's shared store (torchrun's agent store).
        rank, world_size: this process in the job.
        run_id: the job's id (``TORCHELASTIC_RUN_ID``): jobs sharing a store keep apart.
        timeout: seconds to wait for the other ranks.

    Returns:
        (a PrefixStore of this attempt alone, the attempt number).

    Raises:
        AttemptTimeout: not every rank joined within ``timeout``; it names the ranks missing.
    """
    root = f"composetrain/{run_id}"
    counter = f"{root}/attempt"
    nonce = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
    deadline = time.monotonic() + timeout
    attempt = int(store.compare_set(counter, "", "0"))
    while True:
        owner = store.compare_set(f"{root}/{attempt}/slot/{rank}", "", nonce).decode()
        if owner != nonce:  # an earlier process of this rank took it: that attempt is over
            attempt = int(store.compare_set(counter, str(attempt), str(attempt + 1)))
            continue
        slots = [f"{root}/{attempt}/slot/{r}" for r in range(world_size)]
        if _wait(store, slots, counter, attempt, deadline):
            store.set(f"{root}/{attempt}/ready/{rank}", "1")
            ready = [f"{root}/{attempt}/ready/{r}" for r in range(world_size)]
            if _wait(store, ready, counter, attempt, deadline):
                return dist.PrefixStore(f"{root}/{attempt}/pg", store), attempt
            keys = ready
        else:
            keys = slots
        newest = int(store.get(counter))
        if newest > attempt:
            attempt = newest
            continue
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        raise AttemptTimeout(
            f"rank {rank} of {world_size} waited {timeout:g}s for ranks {missing} to join attempt {attempt} "
            f"of run {run_id!r}"
        )


def _wait(store: Any, keys: list[str], counter: str, attempt: int, deadline: float) -> bool:
    """Whether every key of ``keys`` appears before ``deadline`` and before the attempt moves on."""
    pause = 0.005
    while True:
        if store.check(keys):
            return True
        if int(store.get(counter)) != attempt or time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.1)

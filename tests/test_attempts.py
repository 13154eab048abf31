"""Elastic attempts: restarted ranks agree on a namespace of their own, whatever the killed ones left in the store."""

import datetime
import itertools
import threading

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from composetrain.launch.attempts import AttemptTimeout, join_attempt

RUN = "job"
RUNS = itertools.count()  # every example its own job


@pytest.fixture(scope="module")
def server():
    return Server()


class Server:
    """A store, and the connections of each rank's process to it, made once: a new connection now and
    then takes 5 s here."""

    def __init__(self):
        self.store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
        self.clients = []


def client(server, rank=0):
    """The connection of rank ``rank``'s process (one per rank, reused by every start)."""
    while len(server.clients) <= rank:
        timeout = datetime.timedelta(seconds=20)
        server.clients.append(dist.TCPStore("127.0.0.1", server.store.port, 1, is_master=False, timeout=timeout))
    return server.clients[rank]


def start(server, world, run, timeout=10.0):
    """Every rank of one start of the job, each in a thread with its own connection: rank -> (attempt,
    store) or the exception it raised."""
    results = {}
    stores = [client(server, rank) for rank in range(world)]

    def one(rank):
        try:
            results[rank] = join_attempt(stores[rank], rank, world, run, timeout)
        except Exception as e:
            results[rank] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout + 30)
    return results


def agreed(results, world):
    attempts = {results[r][1] for r in range(world)}
    assert len(attempts) == 1, results
    return attempts.pop()


def test_each_start_of_a_job_meets_in_a_fresh_namespace(server):
    run = f"{RUN}-fresh"
    first = start(server, 2, run)
    assert agreed(first, 2) == 0
    first[0][0].set("gloo-address", "old")  # what a killed attempt leaves behind
    second = start(server, 2, run)
    assert agreed(second, 2) == 1
    assert not second[1][0].check(["gloo-address"])
    second[1][0].set("gloo-address", "new")
    assert first[1][0].get("gloo-address") == b"old" and second[0][0].get("gloo-address") == b"new"


def test_a_start_cut_short_in_the_rendezvous_is_left_behind(server):
    """Rank 0 of the first start claimed its place and was killed before rank 1 came: the restarted ranks
    must not meet rank 1 in that half-joined attempt (rank 1's place there is still free)."""
    run = f"{RUN}-cut"
    store = client(server)
    store.compare_set(f"composetrain/{run}/attempt", "", "0")
    store.compare_set(f"composetrain/{run}/0/slot/0", "", "dead process")
    assert agreed(start(server, 2, run), 2) == 1


@given(
    world=st.integers(1, 4),
    history=st.lists(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=4, max_size=4), max_size=3),
)
def test_restarted_ranks_always_agree_on_an_attempt_no_dead_process_took_part_in(server, world, history):
    """Whatever earlier starts left (each rank's place claimed or not; once all are claimed, each marked ready
    or not, as a process marks itself ready only then), every rank of a new start joins the same attempt,
    and none of its places holds a dead process's claim."""
    run = f"{RUN}-{next(RUNS)}"
    store = client(server)
    if history:
        store.compare_set(f"composetrain/{run}/attempt", "", str(len(history) - 1))
    for attempt, ranks in enumerate(history):
        full = all(claimed for claimed, _ in ranks[:world])
        for rank, (claimed, ready) in enumerate(ranks[:world]):
            if claimed:
                store.compare_set(f"composetrain/{run}/{attempt}/slot/{rank}", "", "dead")
            if full and ready:
                store.set(f"composetrain/{run}/{attempt}/ready/{rank}", "1")
    attempt = agreed(start(server, world, run), world)
    for rank in range(world):
        assert store.get(f"composetrain/{run}/{attempt}/slot/{rank}") != b"dead"


def test_a_rank_that_never_comes_is_named_after_the_timeout(server):
    store = client(server)
    with pytest.raises(AttemptTimeout, match=r"rank 0 of 3 waited 0.5s for ranks \[1, 2\] to join attempt 0 of run"):
        join_attempt(store, 0, 3, f"{RUN}-missing", 0.5)

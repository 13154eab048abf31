"""ct.cache in several processes: one writer per store (per node for node-local paths, one for a shared path),
the others wait and map it; a writer killed mid-write leaves nothing that looks complete; a full disk is a
clear error with nothing left behind."""

from __future__ import annotations

import fcntl
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from processes import Job, kill_tree, wait_all, wait_for

import composetrain as ct
from composetrain.data.writer import sampled

SCRIPT = str(Path(__file__).parent / "cache_script.py")


def _job(out: Path, *paths: Path, **env: str) -> Job:
    return Job([sys.executable, SCRIPT, str(out), *map(str, paths)], {**os.environ, "OMP_NUM_THREADS": "1", **env})


def _reads(out: Path) -> dict[tuple[str, str], list[int]]:
    """The items each process read of each store (by its place in the script's paths), in order."""
    reads: dict[tuple[str, str], list[int]] = {}
    for line in (out.parent / (out.name + ".calls")).read_text().splitlines():
        pid, store, item = line.split()
        reads.setdefault((pid, store), []).append(int(item))
    return reads


def test_two_nodes_of_two_processes_write_each_node_local_store_once_and_a_shared_one_once(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for n in nodes:
        n.mkdir()
    out = tmp_path / "calls"  # every process appends "pid item" to calls.calls for each item it reads
    # every process caches its node's local path first, then the shared one: the slow items let them overlap
    jobs = [
        _job(
            out,
            nodes[node] / "store",
            shared,
            SLOW="0.02",
            RANK=str(2 * node + rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK=str(node),
        )
        for node in range(2)
        for rank in range(2)
    ]
    try:
        wait_all(jobs, timeout=120)
        printed = [j.stdout_text().split() for j in jobs]
    finally:
        for j in jobs:
            j.__exit__(None, None, None)
    digests = {p[1] for p in printed} | {p[3] for p in printed}
    assert len(digests) == 1  # every process read the same items from every store
    reads = _reads(out)
    # each store written once, whole, by one process (each node-local one by a process of its node; a process
    # may have written its node's store and the shared one); every other process read only the items of the
    # store's fingerprint, to compare them
    written = Counter(store for (_, store), items in reads.items() if items == list(range(30)))
    assert written == {"0": 2, "1": 1}, reads
    assert sorted(len(items) for items in reads.values()) == [len(sampled(30))] * 5 + [30] * 3, reads
    assert all(items in (list(range(30)), sampled(30)) for items in reads.values()), reads
    assert all((p / "store" / "manifest.json").exists() for p in nodes) and (shared / "manifest.json").exists()


def test_a_writer_killed_mid_write_leaves_nothing_complete_and_a_rerun_starts_over(tmp_path: Path) -> None:
    path, out = tmp_path / "store", tmp_path / "killed"
    with _job(out, path, SLOW="0.2") as job:
        wait_for(lambda: any(tmp_path.glob(".store.tmp-*/f0.npy")), timeout=60)
        wait_for(lambda: len((tmp_path / "killed.calls").read_text().splitlines()) >= 2, timeout=60)
        kill_tree(job.pid)
        job.wait()
    assert not path.exists() and list(tmp_path.glob(".store.tmp-*"))  # half-written, never published
    data = _counted(tmp_path / "rerun")
    cached = ct.cache(data, path, progress=False, num_workers=0)
    assert [cached[i][1] for i in range(len(cached))] == list(range(30))
    assert not list(tmp_path.glob(".store.tmp-*"))  # the dead writer's folder was cleared


def test_a_full_disk_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    path, out = tmp_path / "store", tmp_path / "full"
    with _job(out, path, FSIZE="2000") as job:
        code, printed = job.finish(timeout=60)
    assert code != 0 and "cache: writing" in printed and "File too large" in printed and "nothing was kept" in printed
    assert not path.exists() and not list(tmp_path.glob(".store.tmp-*"))


def test_a_waiter_times_out_naming_the_store_and_its_writer(tmp_path: Path) -> None:
    lock = tmp_path / ".store.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"process 123 on elsewhere")
        with pytest.raises(TimeoutError, match=r"waited 0.3 s for process 123 on elsewhere to write .*store"):
            ct.cache(_counted(tmp_path / "w"), tmp_path / "store", timeout=0.3, progress=False)
    finally:
        os.close(fd)


def _counted(out: Path):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).parent))
    from cache_script import Counted

    return Counted(str(out) + ".calls")


def test_two_ranks_cache_once_and_train_over_the_cache_as_over_the_original(pool, tmp_path: Path) -> None:
    import torch

    a, b = pool.run("cache_workers", "run_over_cache", str(tmp_path))
    # one rank wrote every item, the other mapped the store, reading only the items its fingerprint compares
    assert sorted([a["writes"], b["writes"]]) == [len(sampled(96)), 96]
    for run in ("original", "cache", "augmented"):
        assert all(torch.equal(p, q) for p, q in zip(a[run], b[run], strict=True))  # ranks agree
    assert all(torch.equal(p, q) for p, q in zip(a["cache"], a["original"], strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a["augmented"], a["original"], strict=True))

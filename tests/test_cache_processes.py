"""ct.cache in several processes: one writer per store (per node for node-local paths, one for a shared path),
the others wait and map it; a writer killed mid-write leaves nothing that looks complete; a full disk is a
clear error with nothing left behind."""

from __future__ import annotations

import fcntl
import hashlib
import os
import resource
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import run_script
import torch
from processes import Job, kill_tree, wait_all, wait_for

import composetrain as ct
from composetrain.data.writer import sampled

SCRIPT = __file__  # this file, as a script: its main block at the end


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
    return Counted(str(out) + ".calls")


def test_two_ranks_cache_once_and_train_over_the_cache_as_over_the_original(pool, tmp_path: Path) -> None:
    import torch

    a, b = pool.run(__name__, "run_over_cache", str(tmp_path))
    # one rank wrote every item, the other mapped the store, reading only the items its fingerprint compares
    assert sorted([a["writes"], b["writes"]]) == [len(sampled(96)), 96]
    for run in ("original", "cache", "augmented"):
        assert all(torch.equal(p, q) for p, q in zip(a[run], b[run], strict=True))  # ranks agree
    assert all(torch.equal(p, q) for p, q in zip(a["cache"], a["original"], strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a["augmented"], a["original"], strict=True))


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.cache and ct.run over it on every rank (its process group already up).


class Rows(torch.utils.data.Dataset[Any]):
    """run_script's dataset, one sample at a time (ct.run then collates per sample), counting its reads."""

    def __init__(self) -> None:
        self.x, self.y = run_script.dataset().tensors
        self.calls = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        self.calls += 1
        return self.x[i], int(self.y[i])


def flip(batch: Any, generator: torch.Generator) -> Any:
    x, y = batch
    signs = torch.randint(0, 2, (len(x), 1), generator=generator, dtype=x.dtype) * 2 - 1
    return [x * signs, y]


def run_over_cache(rank: int, world: int, folder: str) -> dict[str, Any]:
    data = Rows()
    cached = ct.cache(data, Path(folder) / "store", progress=False)
    writes = data.calls
    augmented = ct.cache(data, Path(folder) / "store", augment=flip, progress=False)
    runs = {}
    for name, source in (("original", data), ("cache", cached), ("augmented", augmented)):
        state = run_script.state()
        ct.run(
            ct.distributed(run_script.step),
            state,
            source,
            batch_size=12,
            epochs=1,
            num_workers=0,
            progress=False,
            seed=5,
        )
        runs[name] = [p.detach().clone() for p in state.model.parameters()]
    return {"writes": writes, **runs}


# -- the caching process: python tests/test_cache_processes.py OUT PATH [PATH ...], as one rank of a job --------
# Each ``__getitem__`` appends a line "pid store item" to ``OUT.calls`` (so the test counts how many processes
# wrote each store, and which items the others read to compare its fingerprint), then every path is cached in turn
# and a digest of the items read back is printed. Environment: ``SLOW``, seconds per item; ``FSIZE``, a file size
# limit in bytes (a full disk, as EFBIG). No process group is ever created: ct.cache is called at the top of a
# script, before any rendezvous.


class Counted(torch.utils.data.Dataset[Any]):
    def __init__(self, calls: str, n: int = 30) -> None:
        self.calls, self.n, self.store = calls, n, 0  # store: which of the paths is being cached

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        with open(self.calls, "a") as f:
            f.write(f"{os.getpid()} {self.store} {i}\n")
        time.sleep(float(os.environ.get("SLOW", "0")))
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i


def main() -> None:
    out, paths = sys.argv[1], sys.argv[2:]
    if "FSIZE" in os.environ:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(os.environ["FSIZE"]), resource.RLIM_INFINITY))
    data = Counted(out + ".calls")
    for data.store, path in enumerate(paths):
        cached = ct.cache(data, path, num_workers=0, progress=False, timeout=60)
        digest = hashlib.sha256(b"".join(cached[i][0].numpy().tobytes() for i in range(len(cached)))).hexdigest()
        print(path, digest, flush=True)


if __name__ == "__main__":
    main()

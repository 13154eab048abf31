"""ct.cache: random-batch reads against an in-RAM TensorDataset, and the first-time write throughput.

    python benchmarks/bench_cache.py                         # (b) reads and (c) writes, 307 MB of float32
    python benchmarks/bench_cache.py --mb 64 --rounds 5      # smaller and quicker

(b) Each round reads the same ``batches`` random batches of ``batch`` samples (indices drawn once per round)
from a TensorDataset in memory (``tensors[i]`` gathers, as ct.run reads one) and from the cache
(``read_batch``, as ct.run reads one), in alternating order; the figure is the median over rounds of the
ratio of their speeds (goal: at least 0.9). The store's pages are in the page cache after the first round,
as they are for any store read every epoch that fits in memory; a store larger than memory reads at the disk's
speed instead. (c) The time of the first ``ct.cache`` call on an in-memory dataset of the same size: what the
store costs to write, in MB/s. (a) the decode-heavy training comparison is ``decode_heavy`` below.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

import composetrain as ct


class Rows(Dataset[Any]):
    """A TensorDataset's items through a plain __getitem__, as a user's dataset returns them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return self.x[i], self.y[i]


def reads(memory: TensorDataset, cached: Any, *, batch: int, batches: int, rounds: int) -> list[float]:
    """Per round: the cache's batches per second over the in-memory gather's (same indices, alternating order)."""
    ratios = []
    n = len(memory)
    for r in range(rounds + 1):
        index = [torch.randint(0, n, (batch,)).tolist() for _ in range(batches)]  # a sampler's lists
        times = {}
        for name in ["memory", "cache"] if r % 2 else ["cache", "memory"]:
            tick = time.perf_counter()
            for i in index:
                if name == "memory":
                    at = torch.tensor(i)  # as ct.run's reader gathers a TensorDataset's batch
                    [t.index_select(0, at) for t in memory.tensors]
                else:
                    cached.read_batch(i)
            times[name] = time.perf_counter() - tick
        if r:  # the first round warms the page cache and the allocator
            ratios.append(times["memory"] / times["cache"])
    return ratios


def write(data: Dataset[Any], folder: Path) -> tuple[float, float]:
    """(seconds, MB/s) of the first ct.cache call: every item read and written, fsynced, renamed into place."""
    tick = time.perf_counter()
    ct.cache(data, folder / "store", num_workers=0, progress=False)
    seconds = time.perf_counter() - tick
    size = sum(f.stat().st_size for f in (folder / "store").iterdir())
    return seconds, size / 1e6 / seconds


def decode_heavy(args: argparse.Namespace) -> None:
    """(a) A decode-heavy dataset trained uncached vs cached: added by the HDF5/image helper (see issue 22)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=307.0, help="size of the float32 data, MB")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the gather's); 1: both sides alike")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # on a loaded machine a threaded gather loses to its own threads
    n = int(args.mb * 1e6 / 4 / args.features)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, args.features, generator=g), torch.randint(0, 10, (n,), generator=g)
    with tempfile.TemporaryDirectory(dir=".") as folder:
        seconds, rate = write(Rows(x, y), Path(folder))
        print(f"(c) first write: {n} items, {x.numel() * 4 / 1e6:.0f} MB in {seconds:.1f} s: {rate:.0f} MB/s")
        cached = ct.cache(Rows(x, y), Path(folder) / "store", progress=False)
        ratios = reads(TensorDataset(x, y), cached, batch=args.batch, batches=args.batches, rounds=args.rounds)
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        print(f"(b) random batches of {args.batch}, {args.batches} per round, {args.rounds} rounds: cache / "
              f"in-memory gather = {statistics.median(ratios):.2f} (median; middle half {q1:.2f} to {q3:.2f}, "
              f"all {min(ratios):.2f} to {max(ratios):.2f})")  # fmt: skip
    decode_heavy(args)


if __name__ == "__main__":
    main()

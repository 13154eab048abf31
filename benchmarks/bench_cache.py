"""ct.cache and ct.hdf5: training on decoded images, random-batch reads against memory, first-time writes.

    python benchmarks/bench_cache.py                         # every part; 307 MB of float32 for (b), (c), hdf5
    python benchmarks/bench_cache.py --mb 64 --rounds 5      # smaller and quicker
    python benchmarks/bench_cache.py --parts a hdf5          # some parts

(a) The digits written once as an image folder of 64x64 PNG files (examples/cached_images.py), read, decoded and
resized to 32x32 per item with torchvision, trained by ct.run uncached (num_workers 0, 1 and 2) and cached
(ct.cache, without augmentation and with the example's random shift), interleaved, ``--epochs`` epochs per call
(so a loader's workers start once per call, as they do once per run). Figures: the whole run's speed relative to
the best uncached setting, and the data path's (the time ct.run waited for batches, per batch), medians of
per-round ratios; and the first ct.cache call's time.

(b) Each round reads the same ``batches`` random batches of ``batch`` samples (indices drawn once per round)
from a TensorDataset in memory (``tensors[i]`` gathers, as ct.run reads one) and from the cache
(``read_batch``, as ct.run reads one), in alternating order; the figure is the median over rounds of the
ratio of their speeds (goal: at least 0.9). The store's pages are in the page cache after the first round,
as they are for any store read every epoch that fits in memory; a store larger than memory reads at the disk's
speed instead. (c) The time of the first ``ct.cache`` call on an in-memory dataset of the same size: what the
store costs to write, in MB/s.

hdf5: random batches of ``--batch`` rows from a contiguous HDF5 dataset of the same size, read by ct.hdf5 (memory-
mapped at the dataset's offset), by h5py's own indexing (sorted distinct rows, then reordered: h5py reads a list of
rows only increasing), by ct.hdf5 over the same data chunked (read through h5py), and gathered from the same tensor
in memory (``index_select``, as ct.run reads a TensorDataset: the baseline), in rotating order.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import compare, report, timed_loop
from torch.utils.data import Dataset, TensorDataset

import composetrain as ct

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))  # the image folder of part (a)
from cli import at_least  # examples/cli.py: a bad size is a usage error


def megabytes(text: str) -> float:
    """An argparse type: a positive, finite number of MB."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of MB, got {text!r}")
    return value


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
    """(a) The digits as PNG files, decoded and resized per item, trained uncached (num_workers 0, 1, 2) and
    cached, interleaved: the whole run's and the data path's speed relative to the best uncached setting."""
    from cached_images import ImageFiles, shift, step, write_images
    from torch import nn

    def contender(data: Any, workers: int) -> Any:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(32 * 32, 128), nn.ReLU(), nn.Linear(128, 10))
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        waits: list[float] = []

        def run(updates: int) -> float:
            tick = time.perf_counter()
            result = ct.run(
                step,
                state,
                data,
                batch_size=args.image_batch,
                max_steps=state.step + updates,
                num_workers=workers,
                progress=False,
                log_every=10,
            )
            seconds = time.perf_counter() - tick
            waits.append(result.data_wait * seconds / updates)  # seconds ct.run waited for a batch, per batch
            return seconds

        run.waits = waits  # type: ignore[attr-defined]
        return run

    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        files, labels = write_images(Path(folder) / "images")
        decoded = ImageFiles(files, labels, 32)
        tick = time.perf_counter()
        cached = ct.cache(decoded, Path(folder) / "store", num_workers=0, progress=False)
        first = time.perf_counter() - tick
        augmented = ct.cache(decoded, Path(folder) / "store", augment=shift, progress=False)
        contenders = {f"decoded, num_workers={w}": contender(decoded, w) for w in (0, 1, 2)}
        contenders["ct.cache"] = contender(cached, 0)
        contenders["ct.cache + random shift (augment)"] = contender(augmented, 0)
        updates = args.epochs * -(-len(decoded) // args.image_batch)
        results = compare(contenders, updates=updates, rounds=args.rounds)
    best = max((r for r in results if r.name.startswith("decoded")), key=lambda r: r.median)
    title = (
        f"(a) digits as {len(files)} PNG files, decoded + resized to 32x32 per item, MLP, batch "
        f"{args.image_batch}, {updates} updates per call"
    )
    print(report(title, results, best.name))
    skip = len(contenders[best.name].waits) - args.rounds  # the warm-up round
    base = contenders[best.name].waits[skip:]
    print("\n| contender | data wait per batch, ms (median) | data path speed-up over the best uncached |")
    print("|---|---:|---:|")
    for r in results:
        waits = contenders[r.name].waits[skip:]
        ratio = statistics.median(b / max(w, 1e-9) for b, w in zip(base, waits, strict=True))
        print(f"| {r.name} | {statistics.median(waits) * 1e3:.2f} | **{ratio:.1f}x** |")
    print(f"\nfirst ct.cache call (decode {len(files)} PNG files, write, fsync, rename): {first:.2f} s")


def bench_hdf5(args: argparse.Namespace) -> None:
    """Random batches from a contiguous HDF5 dataset: ct.hdf5's memory map, h5py, chunked, in-memory gathers."""
    import h5py

    rows = int(args.mb * 1e6 / 4 / args.features)
    array = np.random.default_rng(0).standard_normal((rows, args.features), dtype=np.float32)
    g = np.random.default_rng(1)
    batches = [g.integers(0, rows, args.batch).tolist() for _ in range(64)]
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = Path(folder) / "data.h5"
        with h5py.File(path, "w") as f:
            f["flat"] = array
            f.create_dataset("chunked", data=array, chunks=(64, args.features))
        in_ram = torch.from_numpy(array)
        mapped, chunked = ct.hdf5(path, "flat"), ct.hdf5(path, "chunked")
        assert mapped.mapped == ["flat"] and chunked.mapped == []
        h5 = h5py.File(path, "r")

        def h5py_read(i: int) -> torch.Tensor:
            unique, inverse = np.unique(batches[i % len(batches)], return_inverse=True)
            return torch.from_numpy(h5["flat"][unique][inverse])

        contenders = {
            "in-memory gather (index_select)": timed_loop(
                lambda i: in_ram.index_select(0, torch.tensor(batches[i % len(batches)]))
            ),
            "ct.hdf5, contiguous (memory map)": timed_loop(lambda i: mapped.read_batch(batches[i % len(batches)])),
            "h5py indexing, contiguous": timed_loop(h5py_read),
            "ct.hdf5, chunked (through h5py)": timed_loop(lambda i: chunked.read_batch(batches[i % len(batches)])),
        }
        for i in range(3):  # the same rows from every path
            want = in_ram[batches[i]]
            assert torch.equal(mapped.read_batch(batches[i]), want) and torch.equal(h5py_read(i), want)
            assert torch.equal(chunked.read_batch(batches[i]), want)
        results = compare(contenders, updates=args.batches, rounds=args.rounds)
        h5.close()
    title = (
        f"HDF5 random batches: {rows} x {args.features} float32 ({array.nbytes / 1e6:.0f} MB), batches of "
        f"{args.batch}, {args.batches} a round"
    )
    print(report(title, results, "in-memory gather (index_select)").replace("updates/s", "batches/s"))


def reads_and_writes(args: argparse.Namespace) -> None:
    """(c) the first write, then (b) random-batch reads of the cache against an in-memory TensorDataset."""
    n = int(args.mb * 1e6 / 4 / args.features)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, args.features, generator=g), torch.randint(0, 10, (n,), generator=g)
    with tempfile.TemporaryDirectory(dir=args.dir or ".") as folder:
        if "c" in args.parts:
            seconds, rate = write(Rows(x, y), Path(folder))
            print(f"(c) first write: {n} items, {x.numel() * 4 / 1e6:.0f} MB in {seconds:.1f} s: {rate:.0f} MB/s")
        if "b" in args.parts:
            cached = ct.cache(Rows(x, y), Path(folder) / "store", progress=False)
            ratios = reads(TensorDataset(x, y), cached, batch=args.batch, batches=args.batches, rounds=args.rounds)
            q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
            print(
                f"(b) random batches of {args.batch}, {args.batches} per round, {args.rounds} rounds: cache / "
                f"in-memory gather = {statistics.median(ratios):.2f} (median; middle half {q1:.2f} to {q3:.2f}, "
                f"all {min(ratios):.2f} to {max(ratios):.2f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["a", "b", "c", "hdf5"], default=["a", "b", "c", "hdf5"])
    parser.add_argument("--mb", type=megabytes, default=307.0, help="size of the float32 data, MB (b, c, hdf5)")
    parser.add_argument("--batch", type=at_least(1), default=256)
    parser.add_argument("--batches", type=at_least(1), default=200)
    parser.add_argument("--rounds", type=at_least(1), default=7)
    parser.add_argument("--features", type=at_least(1), default=784)
    parser.add_argument(
        "--threads", type=at_least(1), default=1, help="torch threads (the gather's); 1: both sides alike"
    )
    parser.add_argument("--dir", default=None, help="where stores and files are written (default: a temporary folder)")
    parser.add_argument("--epochs", type=at_least(1), default=2, help="(a) epochs per call of ct.run")
    parser.add_argument("--image-batch", type=at_least(1), default=128, help="(a) batch size")
    args = parser.parse_args()
    if int(args.mb * 1e6 / 4 / args.features) < 1:
        parser.error(f"--mb {args.mb:g} holds no row of {args.features} float32 features: give more")
    torch.set_num_threads(args.threads)  # on a loaded machine a threaded gather loses to its own threads
    if "b" in args.parts or "c" in args.parts:
        reads_and_writes(args)
    if "hdf5" in args.parts:
        bench_hdf5(args)
    if "a" in args.parts:
        decode_heavy(args)


if __name__ == "__main__":
    main()

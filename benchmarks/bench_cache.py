"""Reading batches from stores on disk: ct.cache and ct.hdf5 against in-memory tensors.

    python benchmarks/bench_cache.py                 # every part
    python benchmarks/bench_cache.py --parts hdf5    # one part

hdf5: random batches of 256 rows from a contiguous HDF5 dataset (float32, --rows x --width), read by
   ct.hdf5 (memory-mapped at the dataset's offset), by h5py's own indexing (sorted distinct rows, then
   reordered: h5py reads a list of rows only increasing), by ct.hdf5 over the same data chunked (read through
   h5py), and gathered from the same array in memory: by NumPy (the baseline: the same gather as the memory
   map's) and by ``index_select`` (what ct.run does for a TensorDataset; torch's intra-op threads make it
   slower than NumPy on a busy 2-core machine). The file stays in the page cache (it fits in RAM): the figures
   are the read path's cost, not the disk's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import compare, report, timed_loop

import composetrain as ct


def random_batches(n: int, batch: int, seed: int = 0) -> list[list[int]]:
    g = np.random.default_rng(seed)
    return [g.integers(0, n, batch).tolist() for _ in range(64)]


def bench_hdf5(args: argparse.Namespace) -> str:
    import h5py

    g = np.random.default_rng(0)
    array = g.standard_normal((args.rows, args.width), dtype=np.float32)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = Path(folder) / "data.h5"
        with h5py.File(path, "w") as f:
            f["flat"] = array
            f.create_dataset("chunked", data=array, chunks=(64, args.width))
        in_ram = torch.from_numpy(array)
        mapped, chunked = ct.hdf5(path, "flat"), ct.hdf5(path, "chunked")
        assert mapped.mapped == ["flat"] and chunked.mapped == []
        batches = random_batches(args.rows, args.batch)
        h5 = h5py.File(path, "r")

        def h5py_read(i: int) -> torch.Tensor:
            unique, inverse = np.unique(batches[i % len(batches)], return_inverse=True)
            return torch.from_numpy(h5["flat"][unique][inverse])

        contenders = {
            "in-RAM gather (NumPy)": timed_loop(lambda i: torch.from_numpy(array[batches[i % len(batches)]])),
            "in-RAM gather (torch index_select, a TensorDataset's)": timed_loop(
                lambda i: in_ram.index_select(0, torch.tensor(batches[i % len(batches)]))
            ),
            "ct.hdf5, contiguous (memory map)": timed_loop(lambda i: mapped.read_batch(batches[i % len(batches)])),
            "h5py indexing, contiguous": timed_loop(h5py_read),
            "ct.hdf5, chunked (through h5py)": timed_loop(lambda i: chunked.read_batch(batches[i % len(batches)])),
        }
        for i in range(3):  # the same rows from every path
            want = in_ram[batches[i]]
            assert torch.equal(mapped.read_batch(batches[i]), want) and torch.equal(h5py_read(i), want)
        results = compare(contenders, updates=args.reads, rounds=args.rounds)
        h5.close()
    mb = array.nbytes / 2**20
    title = f"HDF5 random batches: {args.rows} x {args.width} float32 ({mb:.0f} MB), batches of {args.batch}"
    return report(title, results, "in-RAM gather (NumPy)").replace("updates/s", "batches/s")


PARTS = {"hdf5": bench_hdf5}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--dir", default=os.environ.get("TMPDIR"), help="where the stores are written")
    group = parser.add_argument_group("hdf5")
    group.add_argument("--rows", type=int, default=100_000)
    group.add_argument("--width", type=int, default=768)
    group.add_argument("--batch", type=int, default=256)
    group.add_argument("--reads", type=int, default=50, help="batches read per contender per round")
    args = parser.parse_args(argv)
    for part in args.parts:
        print(PARTS[part](args) + "\n", flush=True)


if __name__ == "__main__":
    sys.exit(main())

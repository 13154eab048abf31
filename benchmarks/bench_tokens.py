"""ct.tokens against nanoGPT's get_batch, the memory of reading a large shard, and ct.pack's padding.

    python benchmarks/bench_tokens.py                        # every part; a 200 MB shard in a temporary folder
    python benchmarks/bench_tokens.py --mb 64 --rounds 5     # smaller and quicker
    python benchmarks/bench_tokens.py --parts pack           # some parts

(a) Random batches from the same uint16 shard, interleaved in rotating order (benchmarks/common.py), each contender
reading ``--batches`` batches of ``--batch`` windows of ``--seq-len`` tokens per round: nanoGPT's ``get_batch`` as
its train.py writes it (a new ``np.memmap`` per batch, one slice per row for the inputs and one for the targets,
each ``.astype(np.int64)`` and ``torch.from_numpy``, then ``torch.stack``), the same with the map opened once, and
``ct.tokens``' ``read_batch`` (what ct.run calls: one gather of the windows, then the inputs and targets cast to
int64) and its ``__getitems__`` + ``default_collate`` (what a DataLoader of one's own calls). Random start offsets
for get_batch, random window indices for ct.tokens. Figure: each one's speed relative to get_batch as written.

(b) Memory of reading the shard whole, in a fresh process: resident memory (``VmRSS``, and its private part
``RssAnon`` and mapped-file part ``RssFile``) after ``ct.tokens(..., vocab_size=)`` checked every token, after
reading every window once in random order (batches of ``--batch``), and the same file read with ``np.fromfile`` (a
copy) for scale. Mapped pages are the file's page cache: shared, clean, given back under pressure.

(c) Padding on the example's documents (examples/pretrain_tokens.py: Python's help topics, a paragraph each, as
bytes and an end token): the share of padding positions in rows packed by ``ct.pack`` (first fit, greedy; documents
longer than a row split) against one document piece per padded row, and the time ct.pack takes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import compare, report, timed_loop
from torch.utils.data import default_collate

import composetrain as ct

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from cli import at_least  # examples/cli.py: a bad size is a usage error

VOCAB = 50257  # GPT-2's, as nanoGPT's openwebtext shards


def write_shard(path: Path, mb: float) -> int:
    """A uint16 shard of random GPT-2 token ids, ``mb`` MB, written by one ct.write_tokens call in pieces; its
    token count."""
    g = np.random.default_rng(0)
    count = int(mb * 2**20) // 2
    pieces = [1 << 22] * (count >> 22) + [count % (1 << 22)]
    return ct.write_tokens((g.integers(0, VOCAB, n) for n in pieces), path, dtype=np.uint16)


def get_batch(path: Path, batch: int, seq_len: int, data: np.ndarray | None = None):
    """nanoGPT's train.py get_batch (the CPU branch)."""
    if data is None:  # "recreate np.memmap every batch to avoid a memory leak"
        data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - seq_len, (batch,))
    x = torch.stack([torch.from_numpy((data[i : i + seq_len]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + seq_len]).astype(np.int64)) for i in ix])
    return x, y


def part_a(path: Path, args: argparse.Namespace) -> str:
    data = ct.tokens(path, args.seq_len, dtype=np.uint16)
    opened = np.memmap(path, dtype=np.uint16, mode="r")
    g = torch.Generator().manual_seed(0)

    def indices() -> list[int]:
        return torch.randint(len(data), (args.batch,), generator=g).tolist()

    contenders = {
        "nanoGPT get_batch": timed_loop(lambda i: get_batch(path, args.batch, args.seq_len)),
        "get_batch, map opened once": timed_loop(lambda i: get_batch(path, args.batch, args.seq_len, opened)),
        "ct.tokens read_batch (ct.run)": timed_loop(lambda i: data.read_batch(indices())),
        "ct.tokens __getitems__ + collate": timed_loop(lambda i: default_collate(data.__getitems__(indices()))),
    }
    for contender in contenders.values():  # every page in the page cache before timing: the same file for all
        contender(3)
    results = compare(contenders, updates=args.batches, rounds=args.rounds)
    title = f"(a) random batches of {args.batch} x {args.seq_len} tokens from a {args.mb:g} MB uint16 shard"
    return report(title, results, "nanoGPT get_batch").replace("updates/s", "batches/s")


MEASURE = """
import json, sys, numpy as np, torch
import composetrain as ct

def memory():
    with open("/proc/self/status") as f:
        rows = dict(line.split(":", 1) for line in f)
    return {k: int(rows[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile")}

path, batch, seq_len, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ct.tokens, ct.run  # the package's names loaded before the first figure (they load all at once)
out = {"start": memory()}
if how == "tokens":
    data = ct.tokens(path, seq_len, dtype=np.uint16, vocab_size=50257)
    out["after ct.tokens(..., vocab_size=) checked every token"] = memory()
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
    for k in range(0, len(order), batch):
        data.read_batch(order[k : k + batch])
    out["after reading every window once, in random batches"] = memory()
else:
    copy = np.fromfile(path, np.uint16)
    out["after np.fromfile (a copy in memory)"] = memory()
print(json.dumps(out))
"""


def part_b(path: Path, args: argparse.Namespace) -> str:
    lines = [
        f"## (b) resident memory reading a {args.mb:g} MB shard whole, in a fresh process (MB)",
        "",
        "| moment | VmRSS | RssAnon (private) | RssFile (mapped pages) |",
        "|---|---:|---:|---:|",
    ]
    for how in ("tokens", "copy"):
        command = [sys.executable, "-c", MEASURE, str(path), str(args.batch), str(args.seq_len), how]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        measured = json.loads(subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout)
        for moment, m in measured.items():
            if how == "copy" and moment == "start":
                continue
            lines.append(f"| {moment} | {m['VmRSS']:.0f} | {m['RssAnon']:.0f} | {m['RssFile']:.0f} |")
    return "\n".join(lines)


def part_c(args: argparse.Namespace) -> str:
    from pretrain_tokens import END, documents

    docs = [[*d, END] for d in documents()]
    tokens = sum(map(len, docs))
    lines = [
        f"## (c) padding on the example's {len(docs)} documents ({tokens} tokens, median "
        f"{statistics.median(map(len, docs)):.0f}, longest {max(map(len, docs))})",
        "",
        "| seq_len | padded rows: rows, padding | first fit: rows, padding, seconds | greedy: rows, padding, seconds |",
        "|---:|---:|---:|---:|",
    ]
    for seq_len in args.pack_lengths:
        cells = []
        for method in ("first_fit", "greedy"):
            start = time.perf_counter()
            packed = ct.pack(docs, seq_len, method=method, split=True)
            cells.append(f"{len(packed)}, {packed.padding:.1%}, {time.perf_counter() - start:.2f}")
        rows = packed.pieces.shape[0]  # one piece per row
        lines.append(f"| {seq_len} | {rows}, {1 - tokens / (rows * seq_len):.1%} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["read", "memory", "pack"], default=["read", "memory", "pack"])
    parser.add_argument("--mb", type=float, default=200.0, help="the shard's size in MB")
    parser.add_argument("--batch", type=at_least(1), default=12, help="windows per batch (nanoGPT's GPT-2 default)")
    parser.add_argument("--seq-len", type=at_least(1), default=1024, help="tokens per window (nanoGPT's block_size)")
    parser.add_argument("--batches", type=at_least(1), default=200, help="batches per contender per round")
    parser.add_argument("--rounds", type=at_least(1), default=21)
    parser.add_argument("--pack-lengths", type=at_least(8), nargs="+", default=[64, 128, 256, 512, 1024])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.bin"
        if {"read", "memory"} & set(args.parts):
            write_shard(path, args.mb)
        if "read" in args.parts:
            print(part_a(path, args), end="\n\n")
        if "memory" in args.parts:
            print(part_b(path, args), end="\n\n")
    if "pack" in args.parts:
        print(part_c(args))


if __name__ == "__main__":
    main()

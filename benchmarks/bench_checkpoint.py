"""Peak memory and speed of one update with checkpoint_activations and accumulate, on a small transformer.

Memory: each configuration runs one update in a fresh process, measured as in
bench_memory.py (CPU: peak resident size during the update minus the size just
before it, glibc told to unmap freed buffers at once; CUDA: max_memory_allocated
over the update minus what was allocated before). Speed: plain and checkpointed
updates interleaved in one process (benchmarks/common.py), as ratios.

    python benchmarks/bench_checkpoint.py                     # memory table and recomputation cost, CPU
    python benchmarks/bench_checkpoint.py --device cuda
    python benchmarks/bench_checkpoint.py --device cuda --largest-batch --cap 0.25
        # the largest batch accumulate("auto") reaches under a cap of the GPU's memory, against the plain step
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch
import torch.nn.functional as F
from common import compare, report, timed_loop
from torch import nn

import composetrain as ct


class Block(nn.Module):
    """Pre-norm transformer block: self-attention and a 4x MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int, length: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(length, width))
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(depth)])
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens) + self.position))


def step(model, batch):
    tokens, targets = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


CONFIGS = {
    "plain": lambda: ct.train_step,
    "accumulate(4)": lambda: ct.accumulate(4),
    "checkpoint_activations(Block)": lambda: ct.checkpoint_activations(Block),
    "both": lambda: ct.compose(ct.checkpoint_activations(Block), ct.accumulate(4)),
}


def setup(args: argparse.Namespace, batch: int | None = None):
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = TinyLM(args.vocab, args.width, args.depth, args.heads, args.length).to(device)
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    size = batch or args.batch
    tokens = torch.randint(0, args.vocab, (size, args.length), device=device)
    return state, (tokens, tokens.roll(-1, dims=1))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(config: str, args: argparse.Namespace) -> dict:
    state, batch = setup(args)
    train = CONFIGS[config]()(step)
    train(state, batch)  # optimizer state and gradients' first allocation out of the way
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        train(state, batch)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before = rss_bytes()
        train(state, batch)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"config": config, "peak_bytes": peak}


def largest_batch(args: argparse.Namespace) -> None:
    """Double the batch until the step fails under the cap: plain train_step against accumulate('auto')."""
    device = torch.device("cuda")
    torch.cuda.set_per_process_memory_fraction(args.cap, device)
    print(f"## largest batch under {args.cap:.0%} of the GPU's memory ({torch.cuda.get_device_name(device)})\n")
    print("| step | largest batch that trained | micro-batch accumulate('auto') settled on |")
    print("|---|---:|---:|")
    for name, transform in (("plain", ct.train_step), ("accumulate('auto')", ct.accumulate("auto"))):
        size, best, micro = 8, None, None
        while size <= args.max_batch:
            state, batch = setup(args, size)
            try:
                out = transform(step)(state, batch)
                best, micro = size, out.metrics.get("micro_batch")
            except torch.OutOfMemoryError:
                break
            finally:
                del state, batch
                torch.cuda.empty_cache()
            size *= 2
        print(f"| {name} | {best} | {'' if micro is None else int(micro)} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--largest-batch", action="store_true")
    parser.add_argument("--cap", type=float, default=0.25)
    parser.add_argument("--max-batch", type=int, default=2**16)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args)))
        return
    if args.largest_batch:
        largest_batch(args)
        return
    torch.set_num_threads(min(2, torch.get_num_threads())) if args.device == "cpu" else None

    mib = 2**20
    shape = f"{args.depth} blocks of width {args.width}, {args.length} tokens, batch {args.batch}, {args.device}"
    print(f"## peak memory of one update, small transformer ({shape})\n")
    print("| configuration | peak added by the update (MiB) | vs plain |")
    print("|---|---:|---:|")
    rows = []
    for config in CONFIGS:
        cmd = [sys.executable, __file__, "--child", config, *sys.argv[1:]]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout))
    for r in rows:
        print(f"| {r['config']} | {r['peak_bytes'] / mib:.0f} | {r['peak_bytes'] / rows[0]['peak_bytes']:.2f} |")

    contenders = {}
    for config in ("plain", "checkpoint_activations(Block)"):
        state, batch = setup(args)
        train = CONFIGS[config]()(step)
        contenders[config] = timed_loop(lambda i, t=train, s=state, b=batch: t(s, b), args.device)
    print()
    print(report("cost of recomputation", compare(contenders, updates=3, rounds=args.rounds), "plain"))


if __name__ == "__main__":
    main()

"""Peak memory of one update with ct.accumulate(n), n = 1, 2, 4, 8.

The model is a deep, wide MLP on a large batch, so saved activations dominate the
memory of an update. On the CPU each n runs in a fresh process and the figure is
the peak resident set size during the update minus the resident size just before
it (model, optimizer and batch already allocated; glibc told to unmap freed
buffers at once, so that the resident size tracks live tensors); on CUDA it is
torch.cuda.max_memory_allocated over the update minus what was allocated before.

    python benchmarks/bench_memory.py
    python benchmarks/bench_memory.py --device cuda
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
from torch import nn

import composetrain as ct


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(n: int, args: argparse.Namespace) -> dict:
    """One update in this process; returns the memory it added at its peak."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10)).to(device)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01))
    batch = (torch.randn(args.batch, args.width, device=device), torch.randint(0, 10, (args.batch,), device=device))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        ct.accumulate(n)(step)(state, batch)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before = rss_bytes()
        ct.accumulate(n)(step)(state, batch)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"n": n, "peak_bytes": peak, "param_bytes": params}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args)))
        return

    rows = []
    for n in (1, 2, 4, 8):
        # a fresh process per n: the peak RSS of a process never goes down
        cmd = [sys.executable, __file__, "--child", str(n), *sys.argv[1:]]
        # a fixed mmap threshold makes glibc return every freed large buffer to the OS at once,
        # so the resident size follows the live tensors instead of the allocator's caching
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout))
    mib = 2**20
    act = args.batch * args.width * 4 * args.depth / mib  # per layer one fp32 ReLU output (= next Linear's input)
    shape = f"MLP {args.width}x{args.depth}, batch {args.batch}, {args.device}"
    print(f"## accumulate(n): peak memory of one update, {shape}")
    print(f"(parameters {rows[0]['param_bytes'] / mib:.0f} MiB; saved activations at n=1 about {act:.0f} MiB)\n")
    print("| n | peak added by the update (MiB) | minus the gradients (MiB) | that vs n=1 | ideal 1/n |")
    print("|---:|---:|---:|---:|---:|")
    rest = [(r["peak_bytes"] - r["param_bytes"]) / mib for r in rows]  # gradients: one per parameter
    for r, x in zip(rows, rest, strict=True):
        print(f"| {r['n']} | {r['peak_bytes'] / mib:.0f} | {x:.0f} | {x / rest[0]:.2f} | {1 / r['n']:.3f} |")


if __name__ == "__main__":
    main()

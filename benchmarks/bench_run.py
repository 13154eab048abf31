"""ct.run's overhead, and its data-bottleneck report.

    python benchmarks/bench_run.py

1. Driver overhead: ct.run against a hand-written loop over the same DataLoader
   (same model, optimizer, batches), interleaved, as ratios of optimizer updates/s.
2. Data bottleneck: a dataset with a realistic per-sample decode cost, trained with
   num_workers=0 and "auto": throughput, the data-wait fraction, and what the
   report says.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from bench_accumulate import make_model, step
from common import compare, report
from torch.utils.data import DataLoader, Dataset, TensorDataset

import composetrain as ct


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def hand_written(model, loader):
    opt = sgd(model)

    def run(updates: int) -> float:
        start = time.perf_counter()
        done = 0
        while done < updates:
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                done += 1
                if done == updates:
                    break
        return time.perf_counter() - start

    return run


def driver(model, loader):
    state = ct.TrainState(model, sgd(model))

    def run(updates: int) -> float:
        start = time.perf_counter()
        ct.run(step, state, loader, max_steps=state.step + updates, progress=False, log_every=50)
        return time.perf_counter() - start

    return run


class Decoded(Dataset):
    """Samples that cost about ``cost`` seconds of CPU each to produce, like decoding an image."""

    def __init__(self, n: int, cost: float) -> None:
        self.n, self.cost = n, cost
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 256, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        end = time.perf_counter() + self.cost
        while time.perf_counter() < end:  # busy: decoding holds a core, it does not sleep
            pass
        return self.x[i], self.y[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=160, help="per round; ct.run costs ~3 ms per call")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--decode-ms", type=float, default=0.2, help="CPU cost per sample in part 2")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=256, shuffle=True)
    model = make_model(512, 3)
    contenders = {
        "hand-written loop over the DataLoader": hand_written(copy.deepcopy(model), loader),
        "ct.run over the same DataLoader": driver(copy.deepcopy(model), loader),
    }
    results = compare(contenders, updates=args.updates, rounds=args.rounds)
    title = "ct.run overhead: MLP 256-512x3-10, batch 256, fp32"
    print(report(title, results, "hand-written loop over the DataLoader"))

    print(f"\n## data bottleneck: {args.decode_ms} ms of CPU per sample, batch 64, a small MLP\n")
    print("| num_workers | updates/s | data wait | report |")
    print("|---|---:|---:|---|")
    slow = Decoded(1024, args.decode_ms / 1000)
    for workers in (0, "auto"):
        state = ct.TrainState(m := make_model(64, 1), sgd(m))
        start = time.perf_counter()
        result = ct.run(step, state, slow, batch_size=64, epochs=1, num_workers=workers, progress=False)
        rate = result.steps / (time.perf_counter() - start)
        shown = f"{workers} (= {ct.data.auto_workers()})" if workers == "auto" else workers
        print(f"| {shown} | {rate:.1f} | {result.data_wait:.0%} | {result.bottleneck} |")


if __name__ == "__main__":
    main()

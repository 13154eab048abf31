"""ct.run's overhead, its loaders, and its data-bottleneck report.

    python benchmarks/bench_run.py

1. Driver overhead: ct.run against a hand-written loop over the same DataLoader
   (same model, optimizer, batches), interleaved, as ratios of optimizer updates/s.
2. Loaders: ct.run with its defaults over an in-memory TensorDataset (it reads whole
   batches itself) against a hand-written loop over ``DataLoader(num_workers=0)``.
3. Workers: a dataset with CPU work per sample (a busy loop, like decoding), trained with
   num_workers 0, 1 and "auto", interleaved: "auto" should be within 3% of the best, and
   the report says what it chose and why.
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


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )


def defaults(model, dataset, batch_size: int, **options):
    """ct.run as a user calls it on a Dataset: it builds the loader (num_workers="auto")."""
    state = ct.TrainState(model, sgd(model))
    last: list[ct.RunResult] = []

    def run(updates: int) -> float:
        start = time.perf_counter()
        result = ct.run(
            step, state, dataset, batch_size=batch_size, max_steps=state.step + updates, progress=False, **options
        )
        last[:] = [result]
        return time.perf_counter() - start

    run.last = last  # type: ignore[attr-defined]
    return run


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

    torch.manual_seed(0)
    digits = TensorDataset(torch.randn(8192, 784), torch.randint(0, 10, (8192,)))
    hand = DataLoader(digits, batch_size=128, shuffle=True, num_workers=0)
    contenders = {
        "hand-written loop over DataLoader(num_workers=0)": hand_written(mlp(), hand),
        "ct.run(dataset) with its defaults": defaults(mlp(), digits, 128),
    }
    results = compare(contenders, updates=2 * args.updates, rounds=args.rounds)
    title = "ct.run's own loader: MLP 784-256-256-10, in-memory TensorDataset, batch 128, fp32"
    print("\n" + report(title, results, "hand-written loop over DataLoader(num_workers=0)"))

    slow = Decoded(4096, args.decode_ms / 1000)
    runs = {f"num_workers={w!r}": defaults(make_model(64, 1), slow, 64, num_workers=w) for w in (0, 1, "auto")}
    results = compare(runs, updates=args.updates // 2, rounds=max(3, args.rounds // 2))
    title = f"num_workers: {args.decode_ms} ms of CPU per sample (busy), batch 64, MLP 256-64-10"
    print("\n" + report(title, results, "num_workers=0"))
    best = max(r.median for r in results)
    auto = next(r for r in results if r.name == "num_workers='auto'")
    print(f"\n'auto' / best (medians): {auto.median / best:.3f}; the last 'auto' run's report: ")
    print(runs["num_workers='auto'"].last[0].bottleneck)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()

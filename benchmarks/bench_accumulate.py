"""Overhead of ct.accumulate(n) against a hand-written accumulation loop doing the same work.

Same model, data and optimizer for every contender; PyTorch Lightning
(accumulate_grad_batches) and Hugging Face Accelerate (gradient_accumulation_steps)
join when installed (pip install -e ".[bench]").

    python benchmarks/bench_accumulate.py               # the README's figures
    python benchmarks/bench_accumulate.py --width 128   # a tinier model: overhead shows more
    python benchmarks/bench_accumulate.py --no-baselines  # the two loops alone
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from common import compare, installed, report, timed_loop
from torch import nn

import composetrain as ct


def make_model(width: int, depth: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(256, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def hand_written(model, batches, n):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def run(updates: int) -> float:
        start = time.perf_counter()
        for i in range(updates):
            x, y = batches[i % len(batches)]
            total = torch.zeros(())
            for xb, yb in zip(x.tensor_split(n), y.tensor_split(n), strict=True):
                loss = F.cross_entropy(model(xb), yb) * (xb.shape[0] / x.shape[0])
                loss.backward()
                total += loss.detach()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return run


def composetrain(model, batches, n):
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    train = ct.accumulate(n)(step)
    return timed_loop(lambda i: train(state, batches[i % len(batches)]))


def micro_batches(batches, n):
    return [(xb, yb) for x, y in batches for xb, yb in zip(x.tensor_split(n), y.tensor_split(n), strict=True)]


def lightning(model, batches, n):
    from baselines import lightning as contender

    micros = micro_batches(batches, n)
    opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)  # noqa: E731
    return contender(model, micros, step, opt, per_update=n, accumulate_grad_batches=n)


def accelerate(model, batches, n):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=n)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, opt = accelerator.prepare(model, opt)
    micros = micro_batches(batches, n)

    def run(updates: int) -> float:
        start = time.perf_counter()
        for i in range(updates * n):
            with accelerator.accumulate(model):
                loss = step(model, micros[i % len(micros)])
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--no-baselines", action="store_true", help="only the two loops: no Lightning, Accelerate")
    args = parser.parse_args()

    torch.manual_seed(0)
    batches = [(torch.randn(args.batch, 256), torch.randint(0, 10, (args.batch,))) for _ in range(8)]
    builders = {"hand-written loop": hand_written, "composetrain accumulate": composetrain}
    if installed("lightning") and not args.no_baselines:
        builders["Lightning accumulate_grad_batches"] = lightning
    if installed("accelerate") and not args.no_baselines:
        builders["Accelerate gradient_accumulation_steps"] = accelerate
    model = make_model(args.width, args.depth)
    contenders = {name: build(copy.deepcopy(model), batches, args.n) for name, build in builders.items()}
    results = compare(contenders, updates=args.updates, rounds=args.rounds)
    print(
        report(
            f"accumulate({args.n}): MLP 256-{args.width}x{args.depth}-10, batch {args.batch}, fp32, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}",
            results,
            "hand-written loop",
        )
    )


if __name__ == "__main__":
    main()

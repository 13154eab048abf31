"""ct.distributed(ct.accumulate(4)(step)) against a hand-written DDP loop with no_sync, over gloo.

    torchrun --nproc-per-node=2 benchmarks/bench_distributed.py

Both ranks run the same contenders in the same order (they share collectives);
rank 0 prints the table. Also measured: the same loop without no_sync (a gradient
all-reduce after every micro-batch), and PyTorch Lightning strategy="ddp" with
accumulate_grad_batches when installed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time

import torch
import torch.nn.functional as F
from bench_accumulate import make_model, micro_batches, step
from common import compare, installed, report, timed_loop
from torch.nn.parallel import DistributedDataParallel

import composetrain as ct


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def hand_written(model, batches, n, *, no_sync=True):
    ddp = DistributedDataParallel(model)
    opt = sgd(model)

    def run(updates: int) -> float:
        start = time.perf_counter()
        for i in range(updates):
            x, y = batches[i % len(batches)]
            pieces = list(zip(x.tensor_split(n), y.tensor_split(n), strict=True))
            for j, (xb, yb) in enumerate(pieces):
                last = j == len(pieces) - 1
                with ddp.no_sync() if no_sync and not last else contextlib.nullcontext():
                    loss = F.cross_entropy(ddp(xb), yb) * (xb.shape[0] / x.shape[0])
                    loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return run


def composetrain(model, batches, n):
    state = ct.TrainState(model, sgd(model))
    train = ct.distributed(ct.accumulate(n)(step))
    return timed_loop(lambda i: train(state, batches[i % len(batches)]))


def lightning(model, batches, n):
    from baselines import lightning as contender

    micros = micro_batches(batches, n)
    return contender(
        model,
        micros,
        step,
        sgd,
        per_update=n,
        strategy="ddp",
        devices=torch.distributed.get_world_size(),
        accumulate_grad_batches=n,
        use_distributed_sampler=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256, help="per rank")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()

    torch.set_num_threads(1)  # two ranks on two cores
    with ct.rendezvous() as proc:
        torch.manual_seed(proc.rank)  # each rank its own data
        batches = [(torch.randn(args.batch, 256), torch.randint(0, 10, (args.batch,))) for _ in range(8)]
        builders = {
            "hand-written DDP loop, no_sync": hand_written,
            "composetrain distributed(accumulate)": composetrain,
            "hand-written DDP loop, sync every micro-batch": lambda m, b, n: hand_written(m, b, n, no_sync=False),
        }
        if installed("lightning"):
            builders["Lightning ddp, accumulate_grad_batches"] = lightning
        model = make_model(args.width, args.depth)
        contenders = {name: build(copy.deepcopy(model), batches, args.n) for name, build in builders.items()}
        results = compare(contenders, updates=args.updates, rounds=args.rounds)
        if proc.is_main:
            title = (
                f"distributed(accumulate({args.n})): {proc.world_size} ranks over {proc.backend}, MLP "
                f"256-{args.width}x{args.depth}-10, batch {args.batch} per rank, 1 thread per rank"
            )
            print(report(title, results, "hand-written DDP loop, no_sync"))
        del contenders  # their DDP wrappers hold the process group: let it go with the block


if __name__ == "__main__":
    main()

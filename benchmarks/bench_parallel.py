"""data_parallel and pipeline_split against one device, side by side.

    python benchmarks/bench_parallel.py                                   # CPU: mainly their overhead
    python benchmarks/bench_parallel.py --devices cuda:0 cuda:1           # data parallel over two GPUs
    python benchmarks/bench_parallel.py --stages cuda:0 cpu --width 4096  # a GPU+CPU split: overlap by chunks

On this 2-core CPU every "device" shares the same two cores, so the figures show
what the transforms cost, not what they gain; with real devices the same script
shows the gain.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from common import compare, report, timed_loop
from torch import nn

import composetrain as ct


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make_model(width: int, stages: int) -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width if i else 256, width), nn.ReLU()) for i in range(stages)]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def contender(model, batches, transform, first_device):
    model.to(first_device)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    train = transform(step)
    device = "cuda" if first_device.type == "cuda" else "cpu"
    return timed_loop(lambda i: train(state, batches[i % len(batches)]), device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", nargs="+", default=["cpu", "cpu"], help="for data_parallel")
    parser.add_argument("--stages", nargs="+", default=["cpu", "cpu"], help="one device per pipeline stage")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    devices = [torch.device(d) for d in args.devices]
    stages = [torch.device(d) for d in args.stages]
    model = make_model(args.width, len(stages))
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(args.batch, 256, generator=g), torch.randint(0, 10, (args.batch,), generator=g)) for _ in range(4)
    ]

    one = {"one device": (ct.train_step, devices[0])}
    dp = {f"data_parallel({args.devices})": (ct.data_parallel(args.devices), devices[0])}
    placement = {str(i): str(d) for i, d in enumerate(stages)}
    placement[str(len(stages))] = str(stages[-1])  # the head goes with the last stage
    pipes = {
        f"pipeline_split({args.stages}, chunks={c})": (ct.pipeline_split(placement, chunks=c), stages[0])
        for c in (1, 2, 4, 8)
    }
    contenders = {}
    for name, (transform, first) in {**one, **dp, **pipes}.items():
        on = [(x.to(first), y.to(stages[-1] if name.startswith("pipeline") else first)) for x, y in batches]
        contenders[name] = contender(copy.deepcopy(model), on, transform, first)
    results = compare(contenders, updates=args.updates, rounds=args.rounds)
    title = f"data_parallel and pipeline_split: MLP 256-{args.width}x{len(stages)}-10, batch {args.batch}"
    print(report(title, results, "one device"))


if __name__ == "__main__":
    main()

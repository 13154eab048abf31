"""ct.mixed_precision against hand-written autocast loops, side by side, as ratios.

    python benchmarks/bench_precision.py                      # CPU bf16: the README's figures
    python benchmarks/bench_precision.py --device cuda --model resnet50 --dtypes fp32 bf16 fp16
    python benchmarks/bench_precision.py --device cuda --model transformer --dtypes fp32 bf16 fp16

Every contender runs the same model, data and optimizer; the baseline is the
hand-written loop in the first low-precision dtype given. On CUDA the table also
gives each contender's peak memory. Lightning (precision="bf16-mixed" /
"16-mixed") and Accelerate (mixed_precision=...) join when installed.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from common import compare, installed, report, timed_loop
from torch import nn

import composetrain as ct

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_model(name: str) -> tuple[nn.Module, tuple[int, ...], int]:
    """The model, the shape of one input sample, and the number of classes."""
    torch.manual_seed(0)
    if name == "mlp":  # matmul-heavy: where 16-bit pays on a CPU with native bf16
        layers: list[nn.Module] = []
        for _ in range(3):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(1024, 10)), (1024,), 10
    if name.startswith("resnet"):
        import torchvision

        return getattr(torchvision.models, name)(num_classes=100), (3, 224, 224), 100
    if name == "transformer":  # a small encoder classifier over 256 tokens
        layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
        return nn.Sequential(nn.TransformerEncoder(layer, 6), nn.Flatten(), nn.LazyLinear(10)), (256, 512), 10
    raise SystemExit(f"bench_precision: unknown --model {name!r}; use mlp, resnet18/50 or transformer")


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def hand_written(model, batches, dtype, device):
    opt = sgd(model)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == "fp16")

    def one(i):
        x, y = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=AUTOCAST.get(dtype, torch.float32), enabled=dtype != "fp32"):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return timed_loop(one, device.type)


def composetrain(model, batches, dtype, device, check_finite=True):
    state = ct.TrainState(model, sgd(model))
    train = ct.mixed_precision(dtype=dtype, check_finite=check_finite)(step)
    return timed_loop(lambda i: train(state, batches[i % len(batches)]), device.type)


def lightning(model, batches, dtype, device):
    from baselines import lightning as contender

    precision = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}[dtype]
    return contender(model, batches, step, sgd, device=device.type, devices=1, precision=precision)


def accelerate(model, batches, dtype, device):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision={"fp32": "no"}.get(dtype, dtype))
    model, opt = accelerator.prepare(model, sgd(model))

    def one(i):
        loss = step(model, batches[i % len(batches)])
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()

    return timed_loop(one, device.type)


def peak_memory(build, model, batches, dtype, device) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    build(copy.deepcopy(model), batches, dtype, device)(3)
    return torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--no-baselines", action="store_true", help="skip Lightning and Accelerate")
    args = parser.parse_args()

    device = torch.device(args.device)
    model, shape, classes = make_model(args.model)
    model.to(device)
    if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in model.modules()):
        model(torch.zeros(1, *shape, device=device))  # materialise lazy layers before copying
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(args.batch, *shape, generator=g), torch.randint(0, classes, (args.batch,), generator=g))
        for _ in range(4)
    ]
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    low = [d for d in args.dtypes if d != "fp32"]
    baseline = f"hand-written {low[0] if low else 'fp32'} loop"
    builders = {}
    for dtype in args.dtypes:
        builders[f"hand-written {dtype} loop"] = (hand_written, dtype)
    for dtype in low:
        builders[f"composetrain mixed_precision({dtype})"] = (composetrain, dtype)
        if dtype == "bf16":
            unchecked = lambda *a: composetrain(*a, check_finite=False)  # noqa: E731
            builders["composetrain mixed_precision(bf16, check_finite=False)"] = (unchecked, dtype)
        if not args.no_baselines and installed("lightning") and (device.type == "cuda" or dtype == "bf16"):
            builders[f"Lightning {dtype}-mixed"] = (lightning, dtype)
        if not args.no_baselines and installed("accelerate") and dtype == low[0]:  # one precision per process
            builders[f"Accelerate mixed_precision={dtype}"] = (accelerate, dtype)
    contenders = {name: make(copy.deepcopy(model), batches, dtype, device) for name, (make, dtype) in builders.items()}
    results = compare(contenders, updates=args.updates, rounds=args.rounds)
    title = (
        f"mixed precision: {args.model}, batch {args.batch}, {device.type}"
        f"{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else f', {torch.get_num_threads()} threads'}"
        f", torch {torch.__version__}"
    )
    print(report(title, results, baseline))
    if device.type == "cuda":
        print("\n| contender | peak memory (GiB) |\n|---|---:|")
        for name, (build, dtype) in builders.items():
            print(f"| {name} | {peak_memory(build, model, batches, dtype, device):.2f} |")


if __name__ == "__main__":
    main()

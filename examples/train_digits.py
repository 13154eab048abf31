"""Train a small classifier on the handwritten digits that ship inside scikit-learn.

No download: the 1,797 8x8 images are part of the scikit-learn package. Each update
sees a batch of --batch-size images in --accumulate micro-batches (the same update
as one large batch, with a fraction of the activation memory).

    python examples/train_digits.py --epochs 15 --batch-size 128 --accumulate 4
    python examples/train_digits.py --precision bf16 --clip 1.0
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from cli import at_least  # examples/cli.py, beside this script
from sklearn.datasets import load_digits
from torch import nn

import composetrain as ct


def step(model, batch):
    """The plain step: forward and loss, nothing else."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).float().mean()}


@torch.no_grad()
def accuracy(model, x, y):
    model.eval()
    acc = (model(x).argmax(-1) == y).float().mean().item()
    model.train()
    return acc


def positive(text: str) -> float:
    """An argparse type: a positive finite float (a NaN learning rate would train to NaN without a word)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def seed(text: str) -> int:
    """An argparse type: a seed torch.manual_seed takes, 0 <= seed < 2**63."""
    value = at_least(0)(text)
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"must be below 2**63, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(1), default=15)
    parser.add_argument("--batch-size", type=at_least(1), default=128, help="samples per optimizer update")
    parser.add_argument("--accumulate", type=at_least(1), default=4, help="micro-batches per update")
    parser.add_argument("--lr", type=positive, default=0.05, help="learning rate at batch size 32 (scaled linearly)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="forward precision")
    parser.add_argument("--clip", type=positive, default=None, help="clip the gradient norm to this")
    parser.add_argument("--seed", type=seed, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x))
    test, train = order[:360], order[360:]
    if args.batch_size > len(train):
        parser.error(f"--batch-size {args.batch_size} is more than the {len(train)} training images")

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    lr = args.lr * args.batch_size / 32  # the linear scaling rule: lr grows with the batch
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    updates_per_epoch = len(train) // args.batch_size
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * updates_per_epoch)
    state = ct.TrainState(model, optimizer, scheduler)
    transforms = [ct.mixed_precision(dtype=args.precision), ct.accumulate(args.accumulate)]
    if args.clip is not None:
        transforms.insert(0, ct.clip_grad_norm(args.clip))
    train_step = ct.compose(*transforms)(step)

    print(f"{train_step} | {len(train)} train / {len(test)} test images | batch {args.batch_size}, lr {lr:.3f}")
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        shuffled = train[torch.randperm(len(train))]
        loss_sum = acc_sum = torch.zeros(())
        for i in range(updates_per_epoch):
            idx = shuffled[i * args.batch_size : (i + 1) * args.batch_size]
            out = train_step(state, (x[idx], y[idx]))
            # keep the running sums on the device; read them once per epoch (no per-step host sync)
            loss_sum = loss_sum + out.loss
            acc_sum = acc_sum + out.metrics["acc"]
        print(
            f"epoch {epoch:2d}  updates {state.step:4d}  train loss {loss_sum.item() / updates_per_epoch:.4f}  "
            f"train acc {acc_sum.item() / updates_per_epoch:.3f}  test acc {accuracy(model, x[test], y[test]):.3f}"
        )
    print(f"done in {time.perf_counter() - start:.1f}s: test accuracy {accuracy(model, x[test], y[test]):.3f}")


if __name__ == "__main__":
    main()

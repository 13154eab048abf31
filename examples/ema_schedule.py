"""torchvision's classification recipe, its schedule and model EMA, on the digits: per-epoch warmup + cosine, and
the model and its EMA evaluated every epoch.

As references/classification/train.py builds them: the learning rate warms up linearly over --warmup-epochs
epochs, then follows a cosine to 0 over the remaining epochs, stepped once per epoch; the EMA averages the weights
after every --ema-steps updates, with the recipe's decay adjusted to the batch, and copies them during the warmup.

    python examples/ema_schedule.py --epochs 12
    torchrun --nproc-per-node=2 examples/ema_schedule.py     # under DDP (BatchNorm's statistics averaged per rank)
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.nn.functional as F
from cli import at_least  # examples/cli.py, beside this script
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, label_smoothing=0.1)


def evaluate(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).float().mean()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(3), default=12)
    parser.add_argument("--warmup-epochs", type=at_least(0), default=2)
    parser.add_argument("--batch-size", type=at_least(1), default=64, help="samples per update per process")
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--ema-steps", type=at_least(1), default=4, help="updates between EMA updates")
    parser.add_argument("--ema-decay", type=float, default=0.999, help="the recipe's decay, before its adjustment")
    parser.add_argument("--run-dir", default=None, help="checkpoints and metrics.jsonl (resumes there)")
    args = parser.parse_args()
    if args.warmup_epochs >= args.epochs:
        parser.error("--warmup-epochs must be fewer than --epochs")

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = TensorDataset(x[order[360:]], y[order[360:]]), TensorDataset(x[order[:360]], y[order[:360]])

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    # the recipe's schedule, in epochs: so the TrainState steps it once per epoch (ct.run at each epoch's end)
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=args.warmup_epochs)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs - args.warmup_epochs)
    schedule = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[args.warmup_epochs])
    state = ct.TrainState(model, optimizer, schedule, scheduler_interval="epoch")

    # the recipe's EMA decay, adjusted to the samples between two EMA updates; copies the weights in the warmup
    world = int(os.environ.get("WORLD_SIZE", "1"))
    adjust = world * args.batch_size * args.ema_steps / args.epochs
    decay = 1.0 - min(1.0, (1.0 - args.ema_decay) * adjust)
    per_epoch = math.ceil(math.ceil(len(train) / world) / args.batch_size)  # a DistributedSampler's share, batched
    ema = ct.ema(decay, every=args.ema_steps, warmup=args.warmup_epochs * per_epoch, formula="sum")
    train_step = ct.compose(ema, ct.distributed)(step)  # distributed is a no-op in a single process

    result = ct.run(
        train_step,
        state,
        train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        eval_step=evaluate,
        eval_data=test,
        log_every=per_epoch,
        checkpoint_dir=args.run_dir,
        progress=False,
    )
    averaged = ct.ema_model(state).eval()  # an independent copy holding the EMA weights
    with torch.no_grad():
        ema_acc = (averaged(test.tensors[0]).argmax(-1) == test.tensors[1]).float().mean().item()
    if int(os.environ.get("RANK", "0")) == 0:  # every rank holds the same result; one prints it
        # the last record of each epoch (its epoch: the epochs completed at its step, as an evaluation's): its rate
        rates = {r["epoch"]: r["lr"] for r in result.history}
        for e in result.evals:
            print(
                f"epoch {e['epoch']:2d}  lr {rates.get(e['epoch'], float('nan')):.6f}  test acc {e['acc']:.3f}  "
                f"ema acc {e['eval_ema']['acc']:.3f}"
            )
        print(f"{train_step}: decay {decay:.6f}; final EMA model test acc {ema_acc:.3f}")


if __name__ == "__main__":
    main()

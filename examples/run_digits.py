"""The digits classifier trained by ct.run: loaders, logging, evaluation, checkpoints, resume.

    python examples/run_digits.py --checkpoint-dir runs/digits            # alone
    torchrun --nproc-per-node=2 examples/run_digits.py                    # two processes, DDP

Interrupt it (Ctrl-C, SIGTERM, or SLURM's pre-emption signal) and run the same
command again: it resumes from the latest checkpoint and finishes the same training.
"""

from __future__ import annotations

import argparse
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
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).float().mean()}


def evaluate(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).float().mean()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(1), default=15)
    parser.add_argument("--batch-size", type=at_least(1), default=64, help="samples per update per process")
    parser.add_argument("--accumulate", type=at_least(1), default=2)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = TensorDataset(x[order[360:]], y[order[360:]]), TensorDataset(x[order[:360]], y[order[:360]])

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = ct.TrainState(model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5))
    train_step = ct.compose(ct.distributed, ct.mixed_precision(dtype=args.precision), ct.accumulate(args.accumulate))(
        step
    )  # distributed is a no-op in a single process

    result = ct.run(
        train_step,
        state,
        train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        eval_step=evaluate,
        eval_data=test,
        log_every=10,
        checkpoint_dir=args.checkpoint_dir,
    )
    if int(os.environ.get("RANK", "0")) == 0:  # every rank holds the same result; one prints it
        for record in result.evals:
            print(f"epoch {record['epoch']:2d}  step {record['step']:4d}  test acc {record['acc']:.3f}")
        print(f"{train_step}: final train loss {result.history[-1]['loss']:.4f}; {result.bottleneck}")


if __name__ == "__main__":
    main()

"""The main job: a small ResNet trained by ct.run on the handwritten digits inside scikit-learn.

No download: the 1,797 8x8 digit images ship with scikit-learn. They are resized to
16x16 once, and every training sample is augmented on the fly by a random affine
transform (torchvision.transforms.v2), work that ct.run's loader workers take off the
training loop. The network is built from torchvision's ResNet blocks (BasicBlock)
with GroupNorm instead of BatchNorm, so that accumulating micro-batches gives exactly
the large-batch update (BatchNorm would normalise each micro-batch on its own).

    python examples/image_classifier.py                          # alone, on the CPU or one GPU
    torchrun --nproc-per-node=2 examples/image_classifier.py     # two processes, DDP

Checkpoints go to --run-dir (default runs/image_classifier): interrupt the job and
run the same command again, and it resumes where it stopped, on any number of
processes that divides --batch-size (the global batch); --fresh starts over.
At the end it draws the curves into RUN_DIR/curves.png (with matplotlib installed).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from cli import at_least  # examples/cli.py, beside this script
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset
from torchvision.models.resnet import BasicBlock, conv1x1
from torchvision.ops import Conv2dNormActivation
from torchvision.transforms import v2

import composetrain as ct


class Digits(Dataset):
    """Digit images as 1x16x16 float tensors in [0, 1], each augmented anew when ``augment``."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, augment: bool) -> None:
        self.images, self.labels = images, labels
        self.augment = v2.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1)) if augment else None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        return (self.augment(image) if self.augment is not None else image), self.labels[i]


def digits(test_size: int = 297) -> tuple[Digits, Digits]:
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # N x 1 x 8 x 8
    images = v2.Resize((16, 16), antialias=True)(images)
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    test, train = order[:test_size], order[test_size:]
    return Digits(images[train], labels[train], augment=True), Digits(images[test], labels[test], augment=False)


def resnet(width: int = 16, classes: int = 10) -> nn.Module:
    """Three torchvision BasicBlocks (16x16, then 8x8), GroupNorm throughout."""

    def norm(channels: int) -> nn.Module:
        return nn.GroupNorm(8, channels)

    down = nn.Sequential(conv1x1(width, 2 * width, stride=2), norm(2 * width))
    return nn.Sequential(
        Conv2dNormActivation(1, width, kernel_size=3, norm_layer=norm),
        BasicBlock(width, width, norm_layer=norm),
        BasicBlock(width, 2 * width, stride=2, downsample=down, norm_layer=norm),
        BasicBlock(2 * width, 2 * width, norm_layer=norm),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, classes),
    )


def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
    """The plain step: forward and loss, nothing else."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).float().mean()}


def evaluate(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).float().mean()}


def cosine(total: int):
    """A cosine decay to zero over ``total`` updates, as a LambdaLR multiplier."""
    return lambda update: 0.5 * (1 + math.cos(math.pi * min(1.0, update / max(1, total))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(1), default=20)
    parser.add_argument("--batch-size", type=at_least(1), default=64, help="samples per update, over all processes")
    parser.add_argument("--accumulate", type=at_least(1), default=2, help="micro-batches per update")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--width", type=at_least(8), default=16, help="channels: a multiple of 8 (GroupNorm(8))")
    parser.add_argument("--run-dir", default="runs/image_classifier")
    parser.add_argument("--fresh", action="store_true", help="delete the run folder's checkpoints first")
    args = parser.parse_args(argv)
    if args.width % 8:
        parser.error(f"--width {args.width} must be a multiple of 8: the blocks normalise in GroupNorm(8, width)")

    if args.fresh and int(os.environ.get("RANK", "0")) == 0:
        shutil.rmtree(args.run_dir, ignore_errors=True)

    train, test = digits()
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = resnet(args.width)
    # the linear scaling rule: the learning rate grows with the global batch (0.05 tuned at 64 samples),
    # with a warmup over the first tenth of training, then a cosine decay
    optimizer = torch.optim.SGD(
        model.parameters(), lr=ct.scaled_lr(0.05, batch=args.batch_size, base_batch=64), momentum=0.9, weight_decay=5e-4
    )
    updates = args.epochs * math.ceil(len(train) / args.batch_size)
    schedule = ct.warmup(updates // 10, then=cosine(updates - updates // 10))
    state = ct.TrainState(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule))

    # the recipe: DDP across processes (a no-op alone), 16-bit autocast, micro-batches; the run is defined by its
    # global batch, so it trains the same on any number of processes that divides it, and resumes on any of them
    train_step = ct.distributed(ct.mixed_precision(dtype=args.precision)(ct.accumulate(args.accumulate)(step)))
    result = ct.run(
        train_step,
        state,
        train,
        global_batch_size=args.batch_size,
        epochs=args.epochs,
        eval_step=evaluate,
        eval_data=test,
        log_every=5,
        checkpoint_dir=args.run_dir,
    )

    if int(os.environ.get("RANK", "0")) == 0:  # every rank holds the same result; one prints it
        for record in result.evals:
            print(f"epoch {record['epoch']:2d}  step {record['step']:4d}  test acc {record['acc']:.3f}")
        print(
            f"{train_step}: final train loss {result.history[-1]['loss']:.4f}, test accuracy "
            f"{result.evals[-1]['acc']:.3f}"
        )
        try:
            from composetrain.plot import plot_run
        except ImportError:
            return
        try:
            print(f"curves: {plot_run(Path(args.run_dir))}")
        except ImportError as e:  # matplotlib is optional
            print(f"no curves: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()

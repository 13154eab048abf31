"""Decode image files once, not every epoch: ct.cache over a dataset that reads PNG files.

The digits are written out as an image folder of 64x64 PNG files (once); the dataset reads, decodes and
resizes one file per item with torchvision, as a real image dataset does. One epoch trains on it directly,
then ct.cache writes the decoded items once into a memory-mapped store, one epoch trains on the store (timed
as the first: both after an untimed warm-up run), and the run trains on the store with a random shift applied
per batch (the cache's augment hook: augmentation is never cached). It prints how much faster the data path
and an epoch got, measured in this run. A store given with --cache is keyed by --size.

    python examples/cached_images.py --epochs 5
    python examples/cached_images.py --images runs/digit_pngs --cache runs/digits.cache   # kept for next time
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from cli import at_least  # examples/cli.py, beside this script
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from torchvision.io import decode_image, encode_png, read_file, write_file
from torchvision.transforms import v2

import composetrain as ct


def write_images(folder: Path, size: int = 64) -> tuple[list[Path], list[int]]:
    """The digits as ``folder/<label>/<n>.png``, ``size`` x ``size`` grey images (written once; kept)."""
    digits = load_digits()
    images = torch.tensor(digits.images * 255 / 16).round().to(torch.uint8)[:, None]
    files = [folder / str(label) / f"{n:04d}.png" for n, label in enumerate(digits.target.tolist())]
    if not all(f.exists() for f in files):
        for label in set(digits.target.tolist()):
            (folder / str(label)).mkdir(parents=True, exist_ok=True)
        for file, image in zip(files, v2.functional.resize(images, [size, size], antialias=True), strict=True):
            write_file(str(file), encode_png(image))
    return files, digits.target.tolist()


class ImageFiles(Dataset):
    """Items ``(image, label)``: the file read, decoded and resized to ``size`` on every access."""

    def __init__(self, files: list[Path], labels: list[int], size: int = 32) -> None:
        self.files, self.labels = files, labels
        self.prepare = v2.Compose([v2.Resize((size, size), antialias=True), v2.ToDtype(torch.float32, scale=True)])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.prepare(decode_image(read_file(str(self.files[i])))), self.labels[i]


def shift(batch: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
    """A random shift of up to 2 pixels per image (edges repeated), drawn from the cache's seeded generator,
    so a resumed run draws the same: one gather for the whole batch."""
    images, labels = batch
    n, c, h, w = images.shape
    dx, dy = torch.randint(-2, 3, (2, n), generator=generator)
    rows = (torch.arange(h) - dy[:, None]).clamp(0, h - 1)
    cols = (torch.arange(w) - dx[:, None]).clamp(0, w - 1)
    pixels = (rows[:, :, None] * w + cols[:, None, :]).reshape(n, 1, h * w).expand(n, c, h * w)
    return [images.reshape(n, c, h * w).gather(2, pixels).reshape(n, c, h, w), labels]


def step(model: nn.Module, batch: list[torch.Tensor]):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).float().mean()}


def train(data: Dataset, args: argparse.Namespace, epochs: int, workers: int | str) -> tuple[ct.RunResult, float]:
    torch.manual_seed(0)
    size = args.size
    model = nn.Sequential(nn.Flatten(), nn.Linear(size * size, 128), nn.ReLU(), nn.Linear(128, 10))
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    start = time.perf_counter()
    result = ct.run(
        step,
        state,
        data,
        batch_size=args.batch_size,
        epochs=epochs,
        num_workers=workers,
        progress=False,
        log_every=10,
    )
    return result, time.perf_counter() - start


def warm_up(args: argparse.Namespace) -> None:
    """One untimed epoch of random tensors: the first ct.run of a process pays one-off costs (thread pools,
    first allocations) that would otherwise be counted against whichever timed run came first."""
    n = 2 * args.batch_size
    train(TensorDataset(torch.rand(n, 1, args.size, args.size), torch.randint(0, 10, (n,))), args, 1, 0)


def workers(text: str) -> int | str:
    """An argparse type: "auto" or an int of at least 0."""
    return text if text == "auto" else at_least(0)(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(1), default=5, help="epochs on the cache")
    parser.add_argument("--batch-size", type=at_least(1), default=128)
    parser.add_argument("--size", type=at_least(1), default=32, help="the decoded images are resized to this")
    parser.add_argument("--workers", type=workers, default="auto", help='loader workers, uncached (an int or "auto")')
    parser.add_argument("--images", type=Path, default=None, help="the image folder (default: a temporary one)")
    parser.add_argument("--cache", type=Path, default=None, help="the store (default: a temporary one)")
    args = parser.parse_args()
    for option, folder in (("--images", args.images), ("--cache", args.cache)):
        if folder is not None and folder.exists() and not folder.is_dir():
            parser.error(f"{option}: {folder} is a file, not a folder")

    with tempfile.TemporaryDirectory() as scratch:
        files, labels = write_images(args.images or Path(scratch) / "images")
        decoded = ImageFiles(files, labels, args.size)

        warm_up(args)
        plain, plain_s = train(decoded, args, 1, args.workers)
        store = args.cache or Path(scratch) / "digits.cache"
        done = "mapped the store written before" if store.exists() else "wrote the store"
        start = time.perf_counter()
        try:  # decodes every file once, or maps the store; the key: a store of another --size is not this one
            cached = ct.cache(decoded, store, key={"size": args.size}, augment=shift, progress=False)
        except ValueError as e:
            parser.error(f"--cache {store}: {e}")
        write_s = time.perf_counter() - start
        # timed as the decoded epoch was (one epoch, one call), so that the fixed cost of a run counts alike
        once, once_s = train(cached, args, 1, args.workers)
        result, _ = train(cached, args, args.epochs, args.workers)

    if int(os.environ.get("RANK", "0")):  # under torchrun every rank measured the same; one prints
        return
    per_batch = {
        name: r.data_wait * seconds / r.steps
        for name, r, seconds in (("decoded", plain, plain_s), ("cached", once, once_s))
    }
    epoch = {"decoded": plain_s, "cached": once_s}
    print(f"{len(decoded)} PNG files, {plain.steps} batches of {args.batch_size} an epoch")
    print(
        f"decoding every epoch: {per_batch['decoded'] * 1e3:.2f} ms of data a batch, {epoch['decoded']:.2f} s an epoch"
    )
    print(f"ct.cache {done} in {write_s:.2f} s")
    print(f"from the cache: {per_batch['cached'] * 1e3:.3f} ms of data a batch, {epoch['cached']:.2f} s an epoch")
    data, whole = per_batch["decoded"] / per_batch["cached"], epoch["decoded"] / epoch["cached"]
    print(f"data path {data:.1f}x faster; epoch {whole:.1f}x faster")
    print(f"final train loss {result.history[-1]['loss']:.4f}, train acc {result.history[-1]['acc']:.3f}")


if __name__ == "__main__":
    main()

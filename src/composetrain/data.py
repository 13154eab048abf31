"""Loaders for ct.run: workers, pinned memory, a resumable distributed sampler, seeded workers."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

from composetrain._util import show
from composetrain.batching import map_tensors

__all__ = ["auto_workers", "epoch_batches", "local_world_size", "make_loader", "to_device"]


def local_world_size() -> int:
    """Processes on this node: torchrun's LOCAL_WORLD_SIZE, SLURM's tasks per node, else 1."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = os.environ.get(name, "")
        digits = value.split("(")[0].split(",")[0]  # SLURM writes "4(x2)" or "4,2"
        if digits.isdigit():
            return int(digits)
    return 1


def auto_workers(local_world_size: int = 1) -> int:
    """Loader workers per process: the cores this process may use, less one for itself, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores // max(1, local_world_size) - 1))


class ResumableSampler(Sampler[int]):
    """A ``DistributedSampler`` (this rank's share, reshuffled by ``set_epoch``) that can start
    part-way through an epoch, so that a resumed run sees exactly the samples it had not yet seen."""

    def __init__(self, inner: DistributedSampler[Any]) -> None:
        self.inner = inner
        self.start = 0  # samples of this epoch already consumed, on this rank

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.inner.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        indices = list(self.inner)
        return iter(indices[self.start :])

    def __len__(self) -> int:
        return len(self.inner) - self.start


def _seed_worker(base: int) -> Any:
    def init(worker_id: int) -> None:
        # (seed, rank, worker): every worker of every rank draws differently (PyTorch issue 5059)
        seed = (base + 1009 * worker_id) % 2**32
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy as np

            np.random.seed(seed)
        except ImportError:  # NumPy is optional
            pass

    return init


def make_loader(
    data: Any,
    *,
    batch_size: int | None,
    shuffle: bool,
    drop_last: bool,
    num_workers: int | str,
    pin_memory: bool,
    collate_fn: Any,
    rank: int,
    world_size: int,
    local_world_size: int,
    seed: int,
    who: str,
) -> tuple[DataLoader[Any], ResumableSampler | None]:
    """A DataLoader over ``data`` (a Dataset, or a DataLoader used as given) and its sampler.

    Raises:
        TypeError / ValueError: what ``data`` or the options cannot give, named.
    """
    if isinstance(data, DataLoader):
        if isinstance(data.dataset, IterableDataset):
            raise TypeError(
                f"{who}: a DataLoader over an IterableDataset has no length, so epochs cannot hold the same "
                "number of updates on every rank nor be resumed part-way; use a map-style Dataset"
            )
        if world_size > 1 and not isinstance(data.sampler, DistributedSampler | ResumableSampler):
            raise ValueError(
                f"{who}: the DataLoader given has a {type(data.sampler).__name__}, so every rank would see "
                "the same data; pass the Dataset (ct.run builds a loader with a DistributedSampler) or give "
                "the DataLoader a DistributedSampler"
            )
        _check_not_empty(data.dataset, who)
        return data, None
    if not isinstance(data, Dataset) and not hasattr(data, "__getitem__"):
        raise TypeError(f"{who}: data must be a torch Dataset or DataLoader, got {show(data)}")
    if isinstance(data, IterableDataset):
        raise TypeError(
            f"{who}: an IterableDataset cannot be sharded or resumed by ct.run; wrap it in your own "
            "DataLoader and pass that"
        )
    if batch_size is None:
        raise ValueError(f"{who}: batch_size is required when data is a Dataset, e.g. batch_size=64")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{who}: batch_size must be a positive int, got {show(batch_size)}")
    size = _check_not_empty(data, who)
    if drop_last and batch_size * world_size > size:
        raise ValueError(
            f"{who}: batch_size={batch_size} on {world_size} process(es) needs {batch_size * world_size} "
            f"samples per update, but the dataset has {size} and drop_last=True would leave no batch; "
            "lower batch_size or set drop_last=False"
        )
    workers = auto_workers(local_world_size) if num_workers == "auto" else num_workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"{who}: num_workers must be 'auto' or a non-negative int, got {show(num_workers)}")
    sampler = ResumableSampler(
        DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    )
    loader = DataLoader(
        data,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
        worker_init_fn=_seed_worker(seed * 7919 + rank * 104729),
        collate_fn=collate_fn,
        # its own generator: starting an epoch must not draw from the global one, or a run resumed
        # mid-epoch would see other dropout masks than the uninterrupted run
        generator=torch.Generator().manual_seed(seed * 7919 + rank),
    )
    return loader, sampler


def _check_not_empty(dataset: Any, who: str) -> int:
    if not isinstance(dataset, Sized):
        return 1
    size = len(dataset)
    if size == 0:
        raise ValueError(f"{who}: the dataset is empty: there is nothing to train on")
    return size


def epoch_batches(
    loader: DataLoader[Any],
    sampler: ResumableSampler | None,
    epoch: int,
    start: int,
    epoch_rng: dict[str, Any] | None,
    device: torch.device,
) -> Iterator[tuple[int, Any, float]]:
    """This epoch's batches from batch ``start`` on: (batches done after this one, batch, seconds waited).

    Our own sampler starts part-way by itself. A DataLoader given as is gets replayed:
    its shuffle is drawn again from the random state the epoch began with
    (``epoch_rng``), then the batches already seen are read and dropped.
    """
    from composetrain.checkpoint import capture_rng, restore_rng

    if sampler is not None:
        sampler.set_epoch(epoch, start=start * (loader.batch_size or 1))
        batches = iter(loader)
    else:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        now = capture_rng()
        if start and epoch_rng is not None:
            restore_rng(epoch_rng)
        batches = iter(loader)
        for _ in range(start):  # the first read draws the shuffle, under the epoch's random state
            next(batches)
            restore_rng(now)
    position = start
    while True:
        tick = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        batch = to_device(batch, device)
        position += 1
        yield position, batch, time.perf_counter() - tick


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a nested batch to ``device`` (those already there stay as they are),
    without blocking when its memory is pinned; non-tensor leaves pass through."""
    return map_tensors(batch, lambda t: t if t.device == device else t.to(device, non_blocking=True))

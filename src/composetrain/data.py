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
from composetrain.rng import capture_rng, restore_rng

__all__ = [
    "auto_workers", "epoch_batches", "epoch_order", "generator_states", "make_loader",
    "order_problem", "set_generator_states", "to_device",
]  # fmt: skip


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
        error = ValueError if isinstance(workers, int) and not isinstance(workers, bool) else TypeError
        raise error(f"{who}: num_workers must be 'auto' or a non-negative int, got {show(num_workers)}")
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


def epoch_order(loader: DataLoader[Any], sampler: ResumableSampler | None) -> dict[str, Any] | None:
    """What a given DataLoader draws this epoch's order from, taken at the epoch's start: the
    random states (global, and the loader's and sampler's own generators) and a
    ``DistributedSampler``'s seed. None for ct.run's own sampler, which starts part-way by itself."""
    if sampler is not None:
        return None
    _start_workers(loader)
    seed = getattr(loader.sampler, "seed", None)
    return {"rng": capture_rng(), "generators": generator_states(loader), "sampler_seed": seed}


def generator_states(loader: DataLoader[Any]) -> list[torch.Tensor]:
    return [g.get_state() for g in _generators(loader)]


def set_generator_states(loader: DataLoader[Any], states: list[torch.Tensor]) -> None:
    for g, state in zip(_generators(loader), states, strict=True):
        g.set_state(state)


def _generators(loader: DataLoader[Any]) -> list[torch.Generator]:
    """The generators a given DataLoader draws from (workers' base seed, shuffle), each once."""
    found: list[torch.Generator] = []
    batch_sampler = loader.batch_sampler
    for owner in (loader, loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and g.device.type == "cpu" and all(g is not h for h in found):
            found.append(g)
    return found


def order_problem(
    given: DataLoader[Any] | None, position: int, order: dict[str, Any] | None, generators: list[torch.Tensor]
) -> str | None:
    """Why a checkpoint's data order cannot continue on this loader (``given``: a DataLoader given
    as is; None: ct.run's own), or None. ``order`` and ``generators`` are what the checkpoint saved."""
    if given is None:
        if position and order is not None:
            return "stopped inside an epoch of a DataLoader given as is, and this run got a Dataset; pass it again"
        return None
    if position and order is None:
        return "stopped inside an epoch of a loader ct.run built, and this run got a DataLoader; pass the Dataset"
    now = len(_generators(given))
    saved = [len(generators)] + ([len(order["generators"])] if order else [])
    if any(n != now for n in saved):
        return (
            f"continues a DataLoader that drew from {saved[0]} generator(s) of its own, and this one has {now}; "
            "give it the same generator= and sampler"
        )
    return None


def _start_workers(loader: DataLoader[Any]) -> None:
    """Start a given loader's persistent workers, once, leaving every random state as it was.

    The first iterator of such a loader draws its workers' base seed and then the order; later
    epochs reuse the workers and draw only the order. Started ahead of the first epoch, every
    epoch draws alike, so an epoch resumed in a fresh process draws its order as it first did.
    """
    if loader.persistent_workers and loader.num_workers > 0 and loader._iterator is None:
        rng, generators = capture_rng(), generator_states(loader)
        iter(loader)  # the prefetched batches are dropped when the first epoch resets it
        restore_rng(rng)
        set_generator_states(loader, generators)


def epoch_batches(
    loader: DataLoader[Any],
    sampler: ResumableSampler | None,
    epoch: int,
    start: int,
    order: dict[str, Any] | None,
    device: torch.device,
    end: int,
) -> Iterator[tuple[int, Any, float]]:
    """This epoch's batches from batch ``start`` to ``end``: (batches done after this one, batch, seconds waited).

    Nothing is read past ``end``, not even the read that would find the loader exhausted: a
    sampler may draw more when asked past its last index (``RandomSampler`` does), and a run
    stopped after an epoch's last batch must leave its generators as the run that went on did.

    Our own sampler starts part-way by itself. A DataLoader given as is gets replayed: its
    order is drawn again from the states the epoch began with (``order``, from
    ``epoch_order``), then the batches already trained on are read and dropped. Reading them
    (rather than only drawing their indices) also replays the random draws of the dataset
    and of non-persistent workers, which reading alone reproduces; the process's own random
    state is then put back as it was.
    """
    if sampler is not None:
        sampler.set_epoch(epoch, start=start * (loader.batch_size or 1))
        batches = iter(loader)
    elif start and order is not None:
        _start_workers(loader)
        now = capture_rng()
        restore_rng(order["rng"])
        set_generator_states(loader, order["generators"])
        if order["sampler_seed"] is not None:
            loader.sampler.seed = order["sampler_seed"]  # type: ignore[attr-defined]
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(start):
            next(batches)
        restore_rng(now)
    else:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        batches = iter(loader)
    position = start
    while position < end:
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

"""ct.run's own loader over a Dataset: batches read in this process, a whole batch at a time where the
dataset allows it, or by a DataLoader's workers (``worker_loader``, for training and evaluation alike); how many:
given, or under ``num_workers="auto"`` chosen by measurement (``choose_workers``) among the cores this process
may use (``auto_workers``)."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, Sampler, TensorDataset, default_collate

from composetrain.core.util import RUN
from composetrain.data.kinds import as_mapped, augmented_inside, joined
from composetrain.driver.global_batches import GlobalBatches

__all__ = [
    "LEAST_GAIN",
    "LEAST_SHARE",
    "MEASURED",
    "EpochBatches",
    "Reader",
    "ResumableSampler",
    "auto_workers",
    "batches_of",
    "choose_workers",
    "indexable",
    "mapped",
    "worker_loader",
]


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


# under num_workers="auto": updates read in this process and timed before choosing (the first is not timed:
# it pays for first-call set-up), the least share of an update that reading must take before workers are
# tried, and the least speed-up they must promise (they cost copies and compete for the cores)
MEASURED, LEAST_SHARE, LEAST_GAIN = 5, 0.2, 1.5


def auto_workers(local_world_size: int = 1) -> int:
    """Loader workers per process: the cores this process may use, less one for itself, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores // max(1, local_world_size) - 1))


def choose_workers(fetch: float, step: float, spare: int) -> tuple[int, str]:
    """Loader workers for batches that take ``fetch`` seconds each to read in this process, between
    steps of ``step`` seconds, with ``spare`` cores free: (workers, why).

    Workers read in parallel with the step, so an update takes ``max(step, fetch / workers)`` instead of
    ``fetch + step``; as many are chosen as hide the reading (at most ``spare``), and none unless reading
    is at least ``LEAST_SHARE`` of an update and they promise ``LEAST_GAIN`` times the speed.

    Example:
        >>> choose_workers(fetch=0.03, step=0.01, spare=7)
        (3, 'reading a batch is 75% of an update: 3 worker(s) of the 7 spare cores, for 4.0x')
    """
    total = fetch + step
    share = fetch / total if total > 0 else 0.0
    if share < LEAST_SHARE:
        return 0, f"reading a batch is {share:.0%} of an update: no workers, reading in this process"
    if spare < 1:
        return 0, f"reading a batch is {share:.0%} of an update, but no core is spare for workers"
    n = spare if fetch >= step * spare else max(1, math.ceil(fetch / step))  # no overflow for a tiny step
    gain = total / max(step, fetch / n)
    if gain < LEAST_GAIN:
        return 0, (
            f"reading a batch is {share:.0%} of an update, but {n} worker(s) of the {spare} spare core(s) "
            f"would give at most {gain:.2f}x the speed: no workers"
        )
    return (
        n,
        f"reading a batch is {share:.0%} of an update: {n} worker(s) of the {spare} spare cores, for {gain:.1f}x",
    )


def indexable(dataset: Any, collate_fn: Callable[[list[Any]], Any] | None) -> bool:
    """Whether a batch of ``dataset`` is one indexing of tensors in memory: a TensorDataset (not
    overriding how it reads) with the default collate. Never worth a worker."""
    plain = type(dataset).__getitem__ is TensorDataset.__getitem__ and not getattr(dataset, "__getitems__", None)
    return plain and collate_fn is None


def mapped(dataset: Any, collate_fn: Callable[[list[Any]], Any] | None) -> bool:
    """Whether a batch is one ``read_batch`` of a memory-mapped dataset (ct.cache's, ct.hdf5's): without a
    collate_fn (no per-sample collate), or augmented whatever collates it (the augmentation is seeded by the
    epoch and rank, which only ``read_batch`` is given; a collate_fn then gets the augmented batch's items)."""
    given, dataset = dataset, as_mapped(dataset)
    if dataset is None:  # a Subset or ConcatDataset of augmented stores is read so too, each with its epoch and rank
        return bool(augmented_inside(given)) and joined(given) is not None
    return dataset.augment is not None or (not dataset.ragged and collate_fn is None)


def batches_of(sampler: Any, batch_size: int, drop_last: bool) -> BatchSampler | GlobalBatches:
    """A sampler's batches: ``GlobalBatches`` batches by itself (each update's share), others by ``batch_size``."""
    return sampler if isinstance(sampler, GlobalBatches) else BatchSampler(sampler, batch_size, drop_last)


class EpochBatches(Sampler[tuple[int, int, list[int]]]):
    """A sampler's batches as ``(epoch, rank, indices)``: what a loader's workers need to read and augment a
    ``MappedDataset``'s batches as this process would (their copy of the dataset never sees ``set_epoch``)."""

    def __init__(self, sampler: ResumableSampler | GlobalBatches, batch_size: int, drop_last: bool) -> None:
        self.sampler, self.batches = sampler, batches_of(sampler, batch_size, drop_last)

    def __iter__(self) -> Iterator[tuple[int, int, list[int]]]:
        inner: Any = getattr(self.sampler, "inner", self.sampler)  # ct.run's samplers: the epoch and rank
        epoch, rank = inner.epoch, inner.rank
        return ((epoch, rank, indices) for indices in self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def worker_loader(
    n: int,
    *,
    dataset: Any,
    sampler: ResumableSampler | GlobalBatches | range,
    batch_size: int,
    drop_last: bool,
    collate_fn: Callable[[list[Any]], Any] | None,
    pin_memory: bool,
    seed: int,
    worker_init_fn: Callable[[int], None] | None = None,
    whole: bool = False,
) -> DataLoader[Any]:
    """The DataLoader whose ``n`` persistent workers read a ``Reader``'s batches (training's or evaluation's), in
    its sampler's order. ``whole``: a ct.cache store's workers read whole batches, each with its epoch and rank
    (which seed its augmentation), through ``EpochBatches`` of ct.run's own sampler. ``GlobalBatches`` gives each
    update's share as a batch (its batch sampler)."""
    if whole:  # only then is the data layer loaded (it imports NumPy)
        from composetrain.data.mapped import same
        from composetrain.data.wrapped import Batches

        assert not isinstance(sampler, range)  # for the type checker: only training's reads whole batches
        batches = EpochBatches(sampler, batch_size, drop_last)
    shares = isinstance(sampler, GlobalBatches) and not whole  # batches of varying size: its batch_sampler
    return DataLoader(
        Batches(dataset, collate_fn) if whole else dataset,
        batch_size=None if whole else 1 if shares else batch_size,
        sampler=batches if whole else None if shares else sampler,
        batch_sampler=sampler if isinstance(sampler, GlobalBatches) and not whole else None,
        drop_last=False if whole or shares else drop_last,
        num_workers=n,
        pin_memory=pin_memory,
        persistent_workers=n > 0,
        worker_init_fn=worker_init_fn,
        collate_fn=same if whole else collate_fn,
        # its own generator: starting an epoch must not draw from the global one, or a run resumed
        # mid-epoch would see other dropout masks than the uninterrupted run
        generator=torch.Generator().manual_seed(seed),
    )


def _whole(batches: Iterator[Any], expected: int) -> Iterator[Any]:
    """``batches``, refused when they end before ``expected``: a StopIteration raised where a loader worker reads a
    batch (a dataset's ``__getitem__``, a collate_fn) comes back as the end of the DataLoader's iteration, which
    would end the epoch early, silently."""
    got = 0
    for batch in batches:
        got += 1
        yield batch
    if got < expected:
        raise RuntimeError(
            f"{RUN}: the loader gave {got} of this epoch's {expected} batches, then stopped: a StopIteration raised "
            "while a batch is read (by the dataset's __getitem__ or the collate_fn, in a loader worker) ends a "
            "DataLoader early, as if the epoch were over; catch it where it is raised (a next() on an exhausted "
            "iterator), or raise another exception there"
        )


class Reader:
    """ct.run's loader over a Dataset: this rank's batches, in its sampler's order, as a DataLoader
    over the same sampler would collate them.

    Without workers they are read in this process, a whole batch at once where the dataset allows
    it: a TensorDataset's tensors indexed once per batch (without a collate_fn), or one call of the
    dataset's ``__getitems__`` and then the collate function, as torch's fetcher does. With workers
    a DataLoader reads them. Under ``num_workers="auto"`` (``workers`` None) the first updates
    are read here and timed, and ``choose_workers`` decides; workers then take over at the batch
    where reading stopped, so the order, and an exact resume, are the same whatever it chose (for a
    dataset whose samples draw no random numbers: read here they draw from this process's generators,
    by workers from the workers' own; such a dataset resumes exactly with ``num_workers=0`` only).

    Attributes:
        num_workers: the workers reading now (0: this process).
        choice: what "auto" chose and why (None before it chose, or when workers were given).
    """

    def __init__(
        self,
        dataset: Any,
        sampler: ResumableSampler | GlobalBatches | range,
        batch_size: int,
        drop_last: bool,
        collate_fn: Callable[[list[Any]], Any] | None,
        workers: int | None,
        loader: Callable[[int], DataLoader[Any]],
        spare: int,
    ) -> None:
        self.dataset, self.sampler, self.batch_size, self.drop_last = dataset, sampler, batch_size, drop_last
        self.collate_fn, self._given = collate_fn or default_collate, collate_fn
        self._tensors = dataset.tensors if indexable(dataset, collate_fn) else None
        self._mapped = mapped(dataset, collate_fn)
        self._loader: DataLoader[Any] | None = None
        self._make, self._spare = loader, spare
        self.num_workers = workers or 0
        # one indexing per batch (a TensorDataset, memory maps without augment): never worth a worker
        store = as_mapped(dataset)
        plain = self.indexed or (self._mapped and store is not None and store.augment is None and store.memory_mapped)
        self.deciding = workers is None and not plain
        self.choice: str | None = None
        if workers is None and plain:
            what = "a TensorDataset" if self.indexed else f"a memory-mapped {type(dataset).__name__}"
            self.choice = f'num_workers="auto" chose 0: {what} is read a whole batch at a time by one indexing'
        self._timings: list[tuple[float, float]] = []

    @property
    def indexed(self) -> bool:
        """Whether a batch is one indexing of tensors in memory (a TensorDataset): never worth a worker."""
        return self._tensors is not None

    @property
    def batched(self) -> bool:
        """Whether this process reads a whole batch in one call (else sample by sample)."""
        return self._tensors is not None or self._mapped or bool(getattr(self.dataset, "__getitems__", None))

    def __len__(self) -> int:
        return len(batches_of(self.sampler, self.batch_size, self.drop_last))

    def __iter__(self) -> Iterator[Any]:
        return _whole(iter(self._workers()) if self.num_workers else self._read(), len(self))

    def _workers(self) -> DataLoader[Any]:
        if self._loader is None:
            self._loader = self._make(self.num_workers)
        return self._loader

    def close(self) -> None:
        """Stop the workers, if any were started (they persist across epochs)."""
        loader, self._loader = self._loader, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    def fetch(self, indices: list[int]) -> Any:
        """The batch of these samples, read in this process."""
        if self._tensors is not None:
            index = torch.tensor(indices)
            # default_collate's list, for a TensorDataset's tuples; a tensor kept on a GPU is indexed there
            return [t.index_select(0, index if t.device.type == "cpu" else index.to(t.device)) for t in self._tensors]
        if self._mapped:  # one gather per field, as default_collate would stack the items
            inner = getattr(self.sampler, "inner", self.sampler)  # ct.run's samplers: the epoch and rank seed it
            from composetrain.data.wrapped import read_whole  # loaded: the dataset is one of its MappedDatasets

            return read_whole(self.dataset, indices, getattr(inner, "epoch", 0), getattr(inner, "rank", 0), self._given)
        getitems = getattr(self.dataset, "__getitems__", None)
        return self.collate_fn(getitems(indices) if getitems else [self.dataset[i] for i in indices])

    def _read(self) -> Iterator[Any]:
        for done, indices in enumerate(batches_of(self.sampler, self.batch_size, self.drop_last), 1):
            tick = time.perf_counter()
            batch = self.fetch(indices)
            fetched = time.perf_counter()
            yield batch
            if self.deciding:  # the time until the next read is the step's
                self._timings.append((fetched - tick, time.perf_counter() - fetched))
                if len(self._timings) > MEASURED:
                    self._decide()
                if self.num_workers:  # they go on from the batch this process stopped at
                    assert not isinstance(self.sampler, range)  # "auto" reads only ct.run's own samplers
                    # GlobalBatches counts samples too: whole updates of batch_size (G/W) each, before the last
                    self.sampler.start += done * self.batch_size
                    yield from self._workers()
                    return

    def _decide(self) -> None:
        timed = self._timings[1:]
        fetch, step = statistics.median(f for f, _ in timed), statistics.median(s for _, s in timed)
        self.num_workers, why = choose_workers(fetch, step, self._spare)
        how = "whole batches" if self.batched else "sample by sample"
        self.choice = (
            f'num_workers="auto" chose {self.num_workers} (reading {how}: {fetch * 1e3:.2f} ms a batch, '
            f"the step {step * 1e3:.2f} ms): {why}"
        )
        self.deciding = False

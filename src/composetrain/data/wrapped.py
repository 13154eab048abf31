"""Augmented stores inside torch's ``Subset`` (``random_split``) and ``ConcatDataset``: a batch's indices followed
down to the stores that hold them, each store's rows read whole with the epoch and rank that seed its augmentation
(the wrappers pass neither on: their items would draw the same augmentation every epoch)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import ConcatDataset, Dataset, Subset, default_collate

from composetrain.data.kinds import augmented_inside, joined
from composetrain.data.mapped import MappedDataset, split_batch

__all__ = ["Batches", "check_wrapped", "locate", "read_whole", "read_wrapped"]


def check_wrapped(dataset: Any, who: str) -> bool:
    """Whether ``dataset`` wraps an augmented store that ``read_wrapped`` reads (then its batches must be read so);
    a wrapper it cannot follow, or a store joined with other data, is refused (its augmentation would repeat).

    Raises:
        ValueError: the wrapped store cannot be read with its epoch and rank, named with the fix.
    """
    if not augmented_inside(dataset):
        return False
    inner = joined(dataset)
    if inner is None:
        raise ValueError(
            f"{who}: the {type(dataset).__name__} given wraps a dataset that augments its batches (made with "
            "augment=) in a wrapper that passes no epoch on, so every epoch would draw the same augmentation; "
            "wrap the store in torch's Subset or ConcatDataset only (ct.run follows those), or pass it itself"
        )
    other = [type(d).__name__ for d in inner if not isinstance(d, MappedDataset) or d.ragged]
    if other:
        raise ValueError(
            f"{who}: the {type(dataset).__name__} given joins a dataset that augments its batches with "
            f"{other[0]} items it cannot read as a batch (another dataset, or a ragged store); join only "
            "ct.cache / ct.hdf5 datasets whose items stack, or give each its own run"
        )
    return True


def locate(dataset: Any, i: int) -> tuple[Any, int]:
    """The dataset under ``dataset``'s Subsets and ConcatDatasets that holds its item ``i``, and the index there
    (negative ``i`` as in a Python sequence; past the end an IndexError, never another item)."""
    while isinstance(dataset, Subset | ConcatDataset):
        n = len(dataset)
        if not -n <= i < n:
            raise IndexError(
                f"{type(dataset).__name__}: index {i} out of range for {n} items; give an index from {-n} to {n - 1}"
            )
        i %= n
        if isinstance(dataset, Subset):
            dataset, i = dataset.dataset, int(dataset.indices[i])
        else:
            k = bisect.bisect_right(dataset.cumulative_sizes, i)
            dataset, i = dataset.datasets[k], i - (dataset.cumulative_sizes[k - 1] if k else 0)
    return dataset, i


def read_wrapped(
    dataset: Any, indices: Sequence[int], epoch: int, rank: int, collate: Callable[[list[Any]], Any] | None = None
) -> Any:
    """The batch of ``indices`` of a Subset or ConcatDataset over stores: each store's rows read whole, augmented
    with ``epoch`` and ``rank`` as the store read directly at the indices they lead to, then (rows of several
    stores, or given a ``collate``) their items collated."""
    places = [locate(dataset, int(i)) for i in indices]
    stores = list({id(d): d for d, _ in places}.values())
    if len(stores) == 1 and collate is None:  # the batch the store itself gives for those indices
        return stores[0].read_batch([j for _, j in places], epoch, rank)
    items: list[Any] = [None] * len(places)
    for store in stores:
        at = [n for n, (d, _) in enumerate(places) if d is store]
        rows = store.read_batch([places[n][1] for n in at], epoch, rank)
        for n, item in zip(at, split_batch(rows, len(at)), strict=True):
            items[n] = item
    return (collate or default_collate)(items)


def read_whole(
    data: Any, indices: Sequence[int], epoch: int, rank: int, collate: Callable[[list[Any]], Any] | None = None
) -> Any:
    """``data.read_batch(indices, epoch, rank)``, or, given a ``collate`` function, that batch's items collated by
    it (an augmented batch is read whole, with its epoch and rank, whatever collates it); ``data`` may be a
    Subset or ConcatDataset of augmented stores (``wrapped.read_wrapped``)."""
    if not isinstance(data, MappedDataset):
        return read_wrapped(data, indices, epoch, rank, collate)
    batch = data.read_batch(indices, epoch, rank)
    return batch if collate is None else collate(split_batch(batch, len(indices)))


class Batches(Dataset[Any]):
    """A ``MappedDataset`` indexed by ``(epoch, rank, indices)``: its ``read_whole``, for loader workers given whole
    batches (``DataLoader(Batches(data), batch_size=None, sampler=...)``), each with what seeds its augmentation."""

    def __init__(self, data: Any, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.data, self.collate = data, collate

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: tuple[int, int, Sequence[int]]) -> Any:
        epoch, rank, indices = key
        return read_whole(self.data, indices, epoch, rank, self.collate)

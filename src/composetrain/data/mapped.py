"""``MappedDataset``: a map-style Dataset over named arrays in files, memory-mapped, read a whole batch at a time."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import operator
import os
import resource
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from composetrain.core.util import show
from composetrain.data.layout import Field, torch_dtype, unflatten

__all__ = ["Augment", "MappedDataset", "Region", "check_rows", "same", "split_batch"]

Augment = Callable[[Any, torch.Generator], Any]


@dataclass(frozen=True)
class Region:
    """A raw C-ordered array inside a file: ``shape`` values of NumPy ``dtype`` starting at byte ``offset``."""

    path: str
    offset: int
    dtype: str
    shape: tuple[int, ...]


class MappedDataset(Dataset[Any]):
    """Items rebuilt from named arrays that are memory-mapped read-only (never loaded whole), in each process
    on first use, so the dataset pickles small to loader workers and may be larger than memory.

    ``__getitem__(i)`` rebuilds item ``i`` with the types it was stored from; ``__getitems__(indices)`` reads
    each field with one gather; ``read_batch(indices)`` returns what ``default_collate`` would make of those
    items, built from the gathered arrays directly (no per-item collate; ct.run reads this way).

    Args:
        regions: array name -> ``Region`` (file, byte offset, dtype, shape): every array the fields name.
        item: the item's structure: a tuple, list or dict (nested) of ``layout.Field`` leaves, or one Field.
        length: the number of items.
        augment: ``augment(batch, generator) -> batch``, applied to every batch read (never stored): ``batch``
            is the collated batch, ``generator`` a CPU ``torch.Generator`` seeded from ``seed``, the epoch, the
            rank and the batch's indices, so that a resumed run draws as the uninterrupted one.
        seed: the augmentation's seed.

    Example:
        >>> region = Region("x.npy", 128, "<f4", (100, 3))  # doctest: +SKIP
        >>> data = MappedDataset({"x": region}, Field("tensor", "float32", (3,), "x"), 100)  # doctest: +SKIP
        >>> batch = data.read_batch([4, 2, 7])  # a (3, 3) float32 tensor  # doctest: +SKIP
    """

    described = "a ct.cache store"  # what the data is, in ct.run's advice on a slow data path

    def __init__(
        self, regions: Mapping[str, Region], item: Any, length: int, *, augment: Augment | None = None, seed: int = 0
    ) -> None:
        self.regions, self.item, self.length = dict(regions), item, length
        self.augment, self.seed, self.epoch = augment, seed, 0
        self.fields: list[Field] = []
        unflatten(item, self.fields.append)
        self._arrays: dict[str, np.ndarray[Any, Any]] | None = None
        self._views: dict[str, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None, "_views": {}}  # each process maps the files itself

    def __len__(self) -> int:
        return self.length

    @property
    def ragged(self) -> bool:
        """Whether some field's shape differs between items (then batches need a collate_fn that pads)."""
        return any(f.shape is None for f in self.fields)

    @property
    def memory_mapped(self) -> bool:
        """Whether every field is read by one gather from a memory map (a subclass may read some otherwise)."""
        return True

    def set_epoch(self, epoch: int) -> None:
        """The epoch that seeds the augmentation of batches read through ``__getitems__`` (a given DataLoader)."""
        self.epoch = epoch

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """The arrays, mapped read-only on first use in this process."""
        if self._arrays is None:
            opened = {}
            for name, r in self.regions.items():
                dtype = np.dtype(r.dtype)
                if int(np.prod(r.shape)) * dtype.itemsize == 0:  # mmap cannot map nothing
                    opened[name] = np.empty(r.shape, dtype)
                else:
                    mapped = _map(r, dtype)
                    opened[name] = mapped.view(np.ndarray)  # plain indexing: no memmap subclass per read
            self._arrays = opened
            self._views = {}
            for name, a in opened.items():
                with contextlib.suppress(TypeError, ValueError), warnings.catch_warnings():  # ValueError: big-endian
                    warnings.simplefilter("ignore")  # read-only memory: never written through this view
                    self._views[name] = torch.from_numpy(a)  # torch's gather, as fast as on a tensor in memory
        return self._arrays

    def _index(self, i: int) -> int:
        try:  # what indexes a list indexes this: ints, NumPy ints, 0-dim integer tensors; never a bool
            if isinstance(i, bool | np.bool_) or (isinstance(i, torch.Tensor) and i.dtype == torch.bool):
                raise TypeError
            if isinstance(i, torch.Tensor) and i.dtype == torch.uint64 and i.ndim == 0:
                i = i.item()  # past int64, operator.index raises a RuntimeError: the value, refused as out of range
            i = operator.index(i)
        except TypeError:
            raise TypeError(
                f"{type(self).__name__}: an index must be an int, got {type(i).__name__}; index one "
                "item (data[3]), or read several with data.read_batch([3, 4])"
            ) from None
        if not -self.length <= i < self.length:
            raise IndexError(
                f"{type(self).__name__}: index {i} out of range for {self.length} items; give an index "
                f"from {-self.length} to {self.length - 1}"
            )
        return int(i) % self.length

    def _indices(self, indices: Sequence[int]) -> torch.Tensor:
        try:
            idx = torch.as_tensor(indices)
        except (TypeError, ValueError, RuntimeError):  # an int past int64 (Python's, NumPy's uint64): index by index
            if not isinstance(indices, Iterable):  # a slice: never read as the rows it spans in another sequence
                raise TypeError(
                    f"{type(self).__name__}.read_batch: indices must be a sequence of ints, got {show(indices)}; "
                    "e.g. read_batch([0, 5, 2]), or read_batch(range(0, 3)) for the rows of slice(0, 3)"
                ) from None
            idx = torch.tensor([self._index(i) for i in indices], dtype=torch.int64)
        if not idx.numel():  # [] is a float tensor
            return torch.empty(0, dtype=torch.int64)
        if idx.ndim > 1 or idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():
            raise TypeError(  # never rounded, cast or flattened into other rows
                f"{type(self).__name__}.read_batch: indices must be a flat list of ints, got {idx.dtype} "
                f"{idx.reshape(-1)[:8].tolist()}; e.g. read_batch([0, 5, 2])"
            )
        given = idx.reshape(-1)  # a 0-dim integer tensor indexes as in a list or a TensorDataset
        # unsigned 64-bit ones checked before the cast to int64, which reads 2**64 - 1 as -1: the last item
        past = given.dtype == torch.uint64 and int(given.cpu().numpy().max()) >= self.length
        idx = given.to(torch.int64)
        low, high = idx.aminmax()
        if past or not (-self.length <= int(low) and int(high) < self.length):
            raise IndexError(
                f"{type(self).__name__}: an index of {given.tolist()} is out of range for {self.length} items; give "
                f"indices from {-self.length} to {self.length - 1}"
            )
        return idx if int(low) >= 0 else torch.where(idx < 0, idx + self.length, idx)

    def __getitem__(self, i: int) -> Any:
        if self.augment is not None:
            return self.__getitems__([i])[0]
        i = self._index(i)
        arrays = self.arrays()
        return unflatten(self.item, lambda f: _value(f, _rows(f, arrays, [i])[0]))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The items at ``indices``, each field read with one gather (augmented, when an augment is set)."""
        if self.augment is not None:
            return split_batch(self.read_batch(indices, self.epoch), len(indices))
        idx = [self._index(i) for i in indices]
        arrays = self.arrays()
        columns = {f.data: _rows(f, arrays, idx) for f in self.fields}
        return [unflatten(self.item, lambda f: _value(f, columns[f.data][n])) for n in range(len(idx))]  # noqa: B023

    def read_batch(self, indices: Sequence[int], epoch: int | None = None, rank: int | None = None) -> Any:
        """What ``default_collate`` makes of the items at ``indices``, gathered per field (then augmented, with
        the generator of ``epoch`` (default: the last ``set_epoch``'s) and ``rank`` (default: this process's)).

        Raises:
            ValueError: a ragged field: its items cannot be stacked (give ct.run a collate_fn that pads).
        """
        if self.ragged:
            raise ValueError(
                f"{type(self).__name__}: a field's shape differs between items: batches need a "
                "collate_fn that pads them; give one to ct.run(..., collate_fn=...)"
            )
        idx = self._indices(indices)
        arrays, views = self.arrays(), self._views

        def gather(f: Field) -> torch.Tensor:  # torch's gather where torch can view the array (all but big-endian)
            return _tensor(f, views[f.data].index_select(0, idx) if f.data in views else _rows(f, arrays, idx.tolist()))

        batch = _as_collated(unflatten(self.item, gather))
        if self.augment is None:
            return batch
        epoch = self.epoch if epoch is None else epoch
        augmented = self.augment(batch, self.generator(idx.tolist(), epoch, _rank() if rank is None else rank))
        return check_rows(augmented, len(idx))  # read whole or split into items, it must keep a row per index

    def generator(self, indices: Sequence[int], epoch: int, rank: int) -> torch.Generator:
        """The augmentation's generator for this batch: seeded from (seed, epoch, rank, indices), nothing else,
        so the same batch of the same epoch draws the same numbers in any process, resumed or not."""
        key = np.array([self.seed, epoch, rank, *indices], dtype=np.int64).tobytes()
        digest = hashlib.blake2b(key, digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def _map(r: Region, dtype: np.dtype[Any]) -> np.memmap[Any, Any]:
    """``r`` mapped read-only; a process whose address space is capped below it (``ulimit -v``) is told so."""
    try:
        return np.memmap(r.path, dtype=dtype, mode="r", offset=r.offset, shape=r.shape)
    except OSError as e:
        if e.errno != errno.ENOMEM:
            raise
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        cap = "no limit" if limit == resource.RLIM_INFINITY else f"{limit / 2**30:.1f} GiB"
        size = int(np.prod(r.shape)) * dtype.itemsize
        raise OSError(
            errno.ENOMEM,
            f"mapping {r.path} ({size / 2**30:.2f} GiB) failed: a memory map takes address "
            f"space, not memory, and this process's address space limit (ulimit -v, RLIMIT_AS) is {cap}: "
            "raise it (ulimit -v unlimited)",
        ) from None


def _rank() -> int:
    """This process's rank: its process group's, else the launcher's (loader workers have no group)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0)


def _rows(field: Field, arrays: Mapping[str, np.ndarray[Any, Any]], idx: list[int]) -> Any:
    """The field's values of items ``idx``: one gather (an array), or a list of arrays for a ragged field."""
    data = arrays[field.data]
    if field.shape is not None:
        return data[np.asarray(idx, dtype=np.int64)]
    assert field.offsets is not None and field.shapes is not None
    offsets, shapes = arrays[field.offsets], arrays[field.shapes]
    return [np.asarray(data[offsets[i] : offsets[i + 1]]).reshape(tuple(shapes[i])) for i in idx]


def _value(field: Field, row: Any) -> Any:
    """One item's leaf, as the type it was stored from."""
    if field.kind == "tensor":
        t = torch.from_numpy(np.array(row))
        if not t.numel():  # NumPy may give an empty array zero strides: a tensor made so cannot .view(dtype)
            t = torch.empty(t.shape, dtype=t.dtype)
        dtype = torch_dtype(field.dtype)
        return t if t.dtype == dtype else t.view(dtype)
    if field.kind == "numpy":
        return row if field.scalar else np.array(row)
    return {"int": int, "float": float, "bool": bool}[field.kind](row)


def _tensor(field: Field, gathered: Any) -> torch.Tensor:
    """A field's batch, as default_collate stacks it: tensors, NumPy values and Python numbers alike."""
    t = gathered if isinstance(gathered, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(gathered))
    if field.kind == "tensor":
        dtype = torch_dtype(field.dtype)
        return t if t.dtype == dtype else t.view(dtype)
    return t


def _as_collated(batch: Any) -> Any:
    """default_collate's containers: tuples and lists become lists, dicts stay dicts."""
    if isinstance(batch, tuple | list):
        return [_as_collated(b) for b in batch]
    if isinstance(batch, dict):
        return {k: _as_collated(v) for k, v in batch.items()}
    return batch


def check_rows(batch: Any, n: int) -> Any:
    """``batch`` (an augment's), refused unless it is tensors in lists, tuples and dicts, each with a row per index
    (or none: 0-dim), as ``split_batch`` needs: however the batch is read, the same augment is refused alike."""
    if isinstance(batch, torch.Tensor):
        if batch.ndim and len(batch) != n:  # its rows would be handed to other indices, or some lost
            raise ValueError(
                f"MappedDataset: augment returned a batch of {len(batch)} rows for {n} indices (a tensor "
                f"of shape {tuple(batch.shape)}): return one row per index (keep the batch's first "
                "dimension)"
            )
    elif isinstance(batch, list | tuple | dict):
        for b in batch.values() if isinstance(batch, dict) else batch:
            check_rows(b, n)
    else:
        raise TypeError(
            f"MappedDataset: augment returned a {type(batch).__name__} in its batch: return tensors "
            "in lists and dicts, with the batch's first dimension"
        )
    return batch


def split_batch(batch: Any, n: int) -> list[Any]:
    """The ``n`` items of a collated batch (each tensor's rows), which ``default_collate`` stacks back to it."""
    if isinstance(batch, torch.Tensor):
        check_rows(batch, n)
        return list(batch.unbind(0)) if batch.ndim else [batch] * n
    if isinstance(batch, list | tuple):
        columns = [split_batch(b, n) for b in batch]
        return [type(batch)(c[i] for c in columns) for i in range(n)]
    if isinstance(batch, dict):
        columns_d = {k: split_batch(v, n) for k, v in batch.items()}
        return [{k: c[i] for k, c in columns_d.items()} for i in range(n)]
    return check_rows(batch, n)  # raises: not a batch of tensors


def same(batch: Any) -> Any:
    """The identity, as a loader's collate_fn: a batch read whole is already collated."""
    return batch

"""ct.hdf5: an existing HDF5 file's datasets as a map-style Dataset that ct.run reads a whole batch at a time.

A dataset whose bytes lie in the file as one flat array (contiguous layout, no filter, no external storage,
allocated) is memory-mapped at its offset and gathered by NumPy, as fast as a flat ``.npy``; any other (chunked,
compressed, shuffled, virtual) is read by h5py, one call per batch for the sorted unique rows, then put back in
the order asked. Nothing is loaded whole: a file larger than memory works. h5py is optional
(``pip install composetrain[hdf5]``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["HDF5Dataset", "hdf5"]

NAME, INSTALL = "ct.hdf5", "pip install composetrain[hdf5]"


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as error:
        raise ImportError(f"{NAME} reads HDF5 files with h5py, which is not installed: {INSTALL}") from error
    return h5py


def flat_offset(dset: Any) -> int | None:
    """Where ``dset``'s rows lie in its file as one C-ordered array (bytes from the file's start, userblock
    included), or None where they do not and h5py must read them: chunked or filtered (compressed, shuffled),
    external, virtual, not yet written (HDF5 allocates a contiguous dataset's space at its first write)."""
    h5py = _h5py()
    plist = dset.id.get_create_plist()
    if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_nfilters() or plist.get_external_count():
        return None
    offset = dset.id.get_offset()
    end = None if offset is None else offset + dset.id.get_storage_size()
    # an unwritten dataset has no address (None, or an undefined one past the end of the file)
    if end is None or dset.id.get_storage_size() < dset.size * dset.dtype.itemsize:
        return None
    return int(offset) if end <= os.path.getsize(dset.file.filename) else None


def native(dtype: np.dtype) -> np.dtype:
    """The dtype rows are handed out in: the file's, in this machine's byte order (torch has no big-endian)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


class _Column:
    """One HDF5 dataset's rows, memory-mapped where they lie flat in the file, else read through h5py."""

    def __init__(self, dataset: HDF5Dataset, key: str, dset: Any) -> None:
        self.owner, self.key, self.shape, self.dtype = dataset, key, tuple(dset.shape), dset.dtype
        self.offset = flat_offset(dset) if self.shape[0] else None
        self._map: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_map": None}  # a memory map pickles as a copy of all of its rows: map it again

    def rows(self, index: np.ndarray) -> np.ndarray:
        """The rows at ``index`` (in range, any order, repeats allowed), in native byte order: one gather."""
        if not len(index):
            return np.empty((0, *self.shape[1:]), native(self.dtype))
        if self.offset is not None:
            if self._map is None:
                self._map = np.memmap(self.owner.path, self.dtype, "r", self.offset, self.shape)
            out = self._map[index]  # fancy indexing copies: nothing keeps the map's pages
        else:  # h5py reads a list of rows only increasing and distinct
            unique, inverse = np.unique(index, return_inverse=True)
            out = self.owner.h5file()[self.key][unique]
            out = out if len(unique) == len(index) and (unique == index).all() else out[inverse.reshape(-1)]
        return out.astype(native(self.dtype), copy=False)


class HDF5Dataset(Dataset):
    """A map-style Dataset over datasets of one HDF5 file, row ``i`` of each: see ``hdf5``.

    Attributes:
        path: the file (absolute).
        keys: the datasets read, as given (a name, a sequence of names, or ``{item key: name}``).
        mapped: the names read through a memory map (the others are read by h5py).
    """

    def __init__(self, path: str, keys: Any, columns: dict[str, Any]) -> None:
        self.path, self.keys = path, keys
        self._columns = {key: _Column(self, key, dset) for key, dset in columns.items()}
        self._length = next(iter(self._columns.values())).shape[0]
        self._file: Any = None
        self._pid = -1
        self.mapped = [key for key, column in self._columns.items() if column.offset is not None]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_pid": -1}  # an h5py file is not picklable: opened again

    def h5file(self) -> Any:
        """The file opened by h5py in this process (a handle inherited across fork is not safe to read)."""
        if self._pid != os.getpid():
            self._file, self._pid = _h5py().File(self.path, "r"), os.getpid()
        return self._file

    def __len__(self) -> int:
        return self._length

    def _index(self, indices: Sequence[int]) -> np.ndarray:
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(index) and (index.min() < -self._length or index.max() >= self._length):
            bad = index[(index < -self._length) | (index >= self._length)][0]
            raise IndexError(f"{NAME}: index {bad} is out of range for {self._length} rows of {self.path}")
        return np.where(index < 0, index + self._length, index)

    def _shape(self, read: Mapping[str, torch.Tensor]) -> Any:
        if isinstance(self.keys, str):
            return read[self.keys]
        if isinstance(self.keys, Mapping):
            return {name: read[key] for name, key in self.keys.items()}
        return [read[key] for key in self.keys]

    def read(self, indices: Sequence[int]) -> Any:
        """The batch of these rows, as ``default_collate`` of the items would give it (a tensor, a list of
        tensors for a sequence of names, a dict for a mapping), read with one gather per HDF5 dataset."""
        index = self._index(indices)
        return self._shape({key: torch.from_numpy(col.rows(index)) for key, col in self._columns.items()})

    def __getitem__(self, i: int) -> Any:
        if not isinstance(i, int | np.integer) or isinstance(i, bool):
            raise TypeError(f"{NAME}: an item is indexed by an int, got {type(i).__name__} {i!r}")
        batch = self.read([i])
        if isinstance(batch, torch.Tensor):
            return batch[0]
        if isinstance(batch, dict):
            return {name: t[0] for name, t in batch.items()}
        return tuple(t[0] for t in batch)

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """The items at ``indices`` (torch's batched fetch), read with one gather per HDF5 dataset."""
        batch = self.read(indices)
        if isinstance(batch, torch.Tensor):
            return list(batch.unbind(0))
        names, columns = (list(batch), list(batch.values())) if isinstance(batch, dict) else (None, batch)
        rows = [tuple(t[i] for t in columns) for i in range(len(indices))]
        return [dict(zip(names, row, strict=True)) for row in rows] if names is not None else rows

    def __repr__(self) -> str:
        return f"{NAME}({self.path!r}, {self.keys!r}): {self._length} rows, memory-mapped {self.mapped}"


def _names(keys: Any) -> list[str]:
    if isinstance(keys, str):
        names = [keys]
    elif isinstance(keys, Mapping):
        names = list(keys.values())
    elif isinstance(keys, list | tuple):
        names = list(keys)
    else:
        names = []
    if not names or not all(isinstance(name, str) and name for name in names):
        raise TypeError(
            f"{NAME}: keys must be a dataset name, a list or tuple of names, or a dict {{item key: name}}, with "
            f"at least one name, got {keys!r}"
        )
    return list(dict.fromkeys(names))


def hdf5(file: str | os.PathLike[str], keys: str | Sequence[str] | Mapping[str, str]) -> HDF5Dataset:
    """The datasets ``keys`` of an existing HDF5 file as one map-style Dataset: item ``i`` is row ``i`` of each.

    Contiguous uncompressed datasets are memory-mapped at their offset in the file and gathered a whole batch
    at a time, as fast as an in-memory gather for large batches; chunked, compressed or filtered ones are read
    through h5py (one read per batch of the sorted distinct rows; slower: write such a file contiguous, or
    ``ct.cache`` it). ct.run reads either a batch at a time through ``__getitems__``. The file must not change
    while it is read; the dataset pickles by path, so loader workers open it again.

    Args:
        file: the HDF5 file's path.
        keys: a dataset name (items are tensors), a list or tuple of names (items are tuples of tensors, in
            that order), or a dict ``{item key: name}`` (items are dicts). Names may have groups: ``"train/x"``.
            Every dataset needs the same number of rows (its first dimension) and a numeric or bool dtype; rows
            come in this machine's byte order.

    Returns:
        An ``HDF5Dataset``.

    Raises:
        ImportError: h5py is not installed (``pip install composetrain[hdf5]``).
        FileNotFoundError / ValueError / KeyError / TypeError: no such file, not an HDF5 file, a name that is
            not a dataset of it, lengths that differ, a dtype torch has no tensor for (strings, compound,
            variable-length), all named.

    Example:
        >>> train = ct.hdf5("digits.h5", ["images", "labels"])       # items (image, label)
        >>> ct.run(ct.accumulate(2)(step), state, train, batch_size=256)
    """
    h5py = _h5py()
    names = _names(keys)
    path = os.path.abspath(os.fspath(file))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{NAME}: no file {path}")
    if not h5py.is_hdf5(path):
        raise ValueError(f"{NAME}: {path} is not an HDF5 file (no HDF5 signature in it)")
    with h5py.File(path, "r") as f:
        columns = {}
        for name in names:
            dset = f.get(name)
            if not isinstance(dset, h5py.Dataset):
                what = "no such dataset" if dset is None else f"a {type(dset).__name__}, not a dataset"
                raise KeyError(f"{NAME}: {name!r} in {path}: {what}; its top level has {sorted(f.keys())}")
            _check_dtype(name, dset, path)
            if dset.ndim == 0:
                raise ValueError(f"{NAME}: {name!r} in {path} is a scalar; a dataset needs a first dimension of rows")
            columns[name] = dset
        lengths = {name: dset.shape[0] for name, dset in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{NAME}: the datasets of {path} differ in rows (first dimension): {lengths}")
        return HDF5Dataset(path, keys, columns)


def _check_dtype(name: str, dset: Any, path: str) -> None:
    dtype = dset.dtype
    try:
        if dtype.kind not in "biufc":
            raise TypeError
        torch.from_numpy(np.empty(0, native(dtype)))
    except TypeError:
        raise TypeError(
            f"{NAME}: {name!r} in {path} has dtype {dtype} ({'variable-length' if dtype.kind == 'O' else dtype.kind}),"
            " which torch has no tensor for; give numeric or bool datasets (encode strings as integer ids)"
        ) from None

"""ct.hdf5: an existing HDF5 file's datasets as a map-style Dataset that ct.run reads a whole batch at a time.

A dataset whose bytes lie in the file as one flat array (contiguous layout, no filter, no external storage,
allocated) is memory-mapped at its offset and gathered as a ``ct.cache`` store's arrays are (an ``HDF5Dataset`` is
a ``MappedDataset``), as fast as memory; any other (chunked, compressed, shuffled, compact, external, virtual) is
read by h5py, one call per batch for the sorted distinct rows, then put back in the order asked. Nothing is
loaded whole: a file larger than memory works. h5py is optional (``pip install composetrain[hdf5]``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from composetrain.core.util import HDF5, check_int, show
from composetrain.data.h5files import (
    Rows,
    Swapped,
    broken_link,
    check_filters,
    check_unchanged,
    file_of,
    flat_offset,
    h5py_module,
    native,
    open_file,
    stamp,
    virtual_sources,
)
from composetrain.data.layout import Field
from composetrain.data.mapped import Augment, MappedDataset, Region

__all__ = ["HDF5Dataset", "hdf5"]


class HDF5Dataset(MappedDataset):
    """A ``MappedDataset`` over datasets of one HDF5 file, row ``i`` of each: see ``hdf5``. ct.run reads it a
    whole batch at a time (``read_batch``), as it reads a ``ct.cache`` store.

    Attributes:
        path: the file (absolute).
        keys: the datasets read, as given (a name, a sequence of names, or ``{item key: name}``).
        mapped: the names read through a memory map; the others are read by h5py.
    """

    described = "an HDF5 file's memory maps"

    def __init__(self, path: str, keys: Any, columns: Mapping[str, Any], augment: Augment | None, seed: int) -> None:
        offsets = {name: flat_offset(dset) if dset.shape[0] else None for name, dset in columns.items()}
        regions = {  # an external link's dataset lies in the file the link leads to
            name: Region(file_of(dset), offset, dset.dtype.str, tuple(dset.shape))
            for (name, dset), offset in zip(columns.items(), offsets.values(), strict=True)
            if offset is not None
        }
        # read from the file found now, at the dataset's name there: a relative external link is followed once
        sources = {name: virtual_sources(d, file_of(d)) for name, d in columns.items()}
        self._by_h5py = {
            name: (file_of(d), d.name, tuple(d.shape), d.dtype, sources[name])
            for name, d in columns.items()
            if offsets[name] is None
        }
        fields = {name: Field("tensor", _torch_name(d.dtype), tuple(d.shape[1:]), name) for name, d in columns.items()}
        if isinstance(keys, str):
            item: Any = fields[keys]
        elif isinstance(keys, Mapping):
            item = {item_key: fields[name] for item_key, name in keys.items()}
        else:
            item = tuple(fields[name] for name in keys)
        super().__init__(regions, item, next(iter(columns.values())).shape[0], augment=augment, seed=seed)
        self.path, self.keys, self.mapped = path, keys, list(regions)
        self._files: dict[str, Any] = {}
        self._pid = -1
        # what each file was when opened here (a virtual dataset's sources too, each checked to be there): checked
        # once per process, before it maps or opens them
        files = [path, *(file_of(d) for d in columns.values())]
        files += [found for found_here in sources.values() for _, found in found_here]
        self._stamps = {p: stamp(p) for p in dict.fromkeys(files)}

    @property
    def memory_mapped(self) -> bool:
        """Whether every dataset is read by one gather from a memory map (else h5py reads some: slower)."""
        return not self._by_h5py

    @property
    def read_by_h5py(self) -> list[str]:
        """The names read by h5py (chunked, compressed, external, virtual, unwritten): not memory-mapped."""
        return list(self._by_h5py)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_files": {}, "_pid": -1}  # an h5py file does not pickle: opened again

    def h5file(self, file: str | None = None) -> Any:
        """``file`` (default: ``path``) opened by h5py in this process (a handle inherited across fork is not safe
        to read)."""
        if self._pid != os.getpid():  # the files were checked when this process mapped them (``arrays``)
            self._files, self._pid = {}, os.getpid()
        file = self.path if file is None else file
        if file not in self._files:
            self._files[file] = open_file(file)
        return self._files[file]

    def arrays(self) -> dict[str, Any]:
        """The memory maps (big-endian ones swapped as they are gathered), and h5py's readers for the rest."""
        if self._arrays is None:
            check_unchanged(self._stamps)
            opened: dict[str, Any] = super().arrays()
            for name, array in opened.items():
                if native(array.dtype) != array.dtype:
                    opened[name] = Swapped(array)
            opened.update({name: Rows(self.h5file, *spec) for name, spec in self._by_h5py.items()})
        return self._arrays  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"{HDF5}({self.path!r}, {self.keys!r}): {len(self)} rows, memory-mapped {self.mapped}"


def _torch_name(dtype: np.dtype) -> str:
    return str(torch.from_numpy(np.empty(0, native(dtype))).dtype).removeprefix("torch.")


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
            f"{HDF5}: keys must be a dataset name, a list or tuple of names, or a dict {{item key: name}}, with "
            f"at least one name, got {show(keys)}; e.g. ['images', 'labels']"
        )
    return list(dict.fromkeys(names))


def hdf5(
    file: str | os.PathLike[str],
    keys: str | Sequence[str] | Mapping[str, str],
    *,
    augment: Augment | None = None,
    seed: int = 0,
) -> HDF5Dataset:
    """The datasets ``keys`` of an existing HDF5 file as one map-style Dataset: item ``i`` is row ``i`` of each.

    Contiguous uncompressed datasets are memory-mapped at their offset in the file and gathered a whole batch
    at a time, as fast as an in-memory gather for large batches; chunked, compressed or filtered ones are read
    through h5py (one read per batch of the sorted distinct rows; slower: write such a file contiguous, or
    ``ct.cache`` it). ct.run reads either a whole batch at a time (``read_batch``, as it reads a ``ct.cache``
    store; under ``num_workers="auto"`` workers only for datasets h5py reads). The file must not change while
    it is read: each process checks, before its first read, that it is as ``ct.hdf5`` found it (one ``stat``).
    The dataset pickles by path, so loader workers open it again. A dataset behind an external link is read
    from the file the link led to when ``ct.hdf5`` opened it.

    Args:
        file: the HDF5 file's path.
        keys: a dataset name (items are tensors), a list or tuple of names (items are tuples of tensors, in
            that order), or a dict ``{item key: name}`` (items are dicts). Names may have groups: ``"train/x"``.
            Every dataset needs the same number of rows (its first dimension) and a numeric or bool dtype; rows
            come in this machine's byte order.
        augment: ``augment(batch, generator) -> batch``, applied to each batch read, as ``ct.cache``'s: the
            generator is seeded from ``seed``, the epoch, the rank and the batch's indices.
        seed: the augmentation's seed.

    Returns:
        An ``HDF5Dataset``.

    Raises:
        ImportError: h5py is not installed (``pip install composetrain[hdf5]``).
        FileNotFoundError / IsADirectoryError / ValueError / KeyError / TypeError: no such file, a directory,
            not an HDF5 file, a name that is not a dataset of it, lengths that differ, a dtype torch has no
            tensor for (strings, compound, variable-length, references), a seed past 64 bits, all named.
        ImportError: a dataset is stored with an HDF5 filter this process has no plugin for (``import hdf5plugin``).
        BlockingIOError / OSError: another process has the file open for writing; h5py cannot open it.
        RuntimeError (at the first read in a process): the file changed since ``ct.hdf5``; (at a read) a virtual
            dataset's relative source would be read from another file than the one ``ct.hdf5`` found.

    Example:
        >>> train = ct.hdf5("digits.h5", ["images", "labels"])       # items (image, label)
        >>> ct.run(ct.accumulate(2)(step), state, train, batch_size=256)
    """
    h5py = h5py_module()
    names = _names(keys)
    if augment is not None and not callable(augment):
        raise TypeError(
            f"{HDF5}: augment must be a function (batch, generator) -> batch, got {show(augment)}; or leave it out"
        )
    # it seeds the augmentation as an int64
    seed = check_int(seed, HDF5, "seed", minimum=-(2**63), maximum=2**63 - 1, example="seed=0")
    if not isinstance(file, str | bytes | os.PathLike):
        raise TypeError(f"{HDF5}: file must be a path (str or os.PathLike), got {show(file)}; e.g. 'digits.h5'")
    path = os.path.abspath(os.fsdecode(file))
    if os.path.isdir(path):
        raise IsADirectoryError(f"{HDF5}: {path} is a directory, not an HDF5 file; give the path of an HDF5 file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{HDF5}: no file {path}; give the path of an existing HDF5 file")
    if not h5py.is_hdf5(path):
        raise ValueError(
            f"{HDF5}: {path} is not an HDF5 file (no HDF5 signature in it); give an HDF5 file, or "
            "ct.cache a Dataset over the data"
        )
    with open_file(path) as f:
        columns = {}
        for name in names:
            dset = f.get(name)
            if not isinstance(dset, h5py.Dataset):
                if dset is None and (broken := broken_link(f, name)) is not None:
                    raise FileNotFoundError(
                        f"{HDF5}: {name!r} in {path}: {broken}; restore what the link leads to, or give another name"
                    )
                what = "no such dataset" if dset is None else f"a {type(dset).__name__}, not a dataset"
                raise KeyError(
                    f"{HDF5}: {name!r} in {path}: {what}; its top level has {sorted(f.keys())}: give "
                    "a dataset's name, with its groups ('train/x')"
                )
            _check_dtype(h5py, name, dset, path)
            check_filters(name, dset, path)
            if dset.ndim == 0:
                raise ValueError(
                    f"{HDF5}: {name!r} in {path} is a scalar; a dataset needs a first dimension of rows: "
                    "give datasets of rows (read a scalar with h5py)"
                )
            columns[name] = dset
        lengths = {name: dset.shape[0] for name, dset in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"{HDF5}: the datasets of {path} differ in rows (first dimension): {lengths}; give "
                "datasets with the same number of rows (one row per item)"
            )
        return HDF5Dataset(path, keys, columns, augment, seed)


def _check_dtype(h5py: Any, name: str, dset: Any, path: str) -> None:
    try:
        dtype = dset.dtype
    except TypeError:  # an HDF5 type NumPy has no dtype for: integers of 3 or 16 bytes, ...
        stored = dset.id.get_type()
        what = {h5py.h5t.INTEGER: "integer", h5py.h5t.FLOAT: "float"}.get(stored.get_class(), "value")
        raise TypeError(
            f"{HDF5}: {name!r} in {path} holds {stored.get_size()}-byte {what}s, which NumPy (and torch) has no "
            "dtype for; write it again as a numeric dtype NumPy has (int32 for 24-bit samples, int64, float32), "
            "or read it with h5py and ct.cache it converted"
        ) from None
    try:
        if dtype.kind not in "biufc":
            raise TypeError
        torch.from_numpy(np.empty(0, native(dtype)))
    except TypeError:
        kind = (
            "object references"
            if h5py.check_ref_dtype(dtype)
            else "variable-length"
            if dtype.kind == "O"
            else dtype.kind
        )
        raise TypeError(
            f"{HDF5}: {name!r} in {path} has dtype {dtype} ({kind}),"
            " which torch has no tensor for; give numeric or bool datasets (encode strings as integer ids)"
        ) from None

"""How ct.hdf5 reads an HDF5 dataset's rows: where they lie flat in a file (then memory-mapped), byte order,
h5py's reads of the rest, and the check that a file did not change between ``ct.hdf5`` and a process's reads."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from composetrain.core.util import HDF5

__all__ = [
    "INSTALL",
    "Rows",
    "Swapped",
    "broken_link",
    "check_unchanged",
    "file_of",
    "flat_offset",
    "h5py_module",
    "native",
    "open_file",
    "stamp",
    "virtual_files",
]

INSTALL = "pip install composetrain[hdf5]"

Stamp = tuple[int, int, int, int] | None


def h5py_module() -> Any:
    """h5py, or an ImportError that says how to install it."""
    try:
        import h5py
    except ImportError as error:
        raise ImportError(
            f"{HDF5} reads HDF5 files with h5py, which is not installed: install it ({INSTALL})"
        ) from error
    return h5py


def open_file(path: str) -> Any:
    """``h5py.File(path, "r")``; a file another process holds open for writing (HDF5's lock) named, with the fix."""
    try:
        return h5py_module().File(path, "r")
    except BlockingIOError as error:
        raise BlockingIOError(
            error.errno,
            f"{HDF5}: {path} is open for writing in another process (HDF5 locks it: {error}); close it there "
            "first, or let that process open it with locking=False if it does not change what is read",
        ) from None
    except OSError as error:  # cut short, damaged: h5py's words, with whose file it is
        raise OSError(
            f"{HDF5}: h5py cannot open {path}: {error}; if it was cut short or damaged, copy or write it again"
        ) from error


def file_of(dset: Any) -> str:
    """The file that holds ``dset``'s bytes: the one opened, or the one an external link led to (h5py gives
    the path HDF5 resolved, relative to the linking file's folder)."""
    return os.path.abspath(dset.file.filename)


def flat_offset(dset: Any) -> int | None:
    """Where ``dset``'s rows lie in ``file_of(dset)`` as one C-ordered array (bytes from the file's start,
    userblock included), or None where they do not and h5py must read them: chunked or filtered (compressed,
    shuffled), external, virtual, not yet written (HDF5 allocates a contiguous dataset's space at its first write),
    or of a type whose bytes NumPy does not lay out as h5py reads them."""
    h5py = h5py_module()
    plist = dset.id.get_create_plist()
    if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_nfilters() or plist.get_external_count():
        return None
    # bytes laid out as NumPy lays out the dtype h5py reads it as; else h5py converts (an enum over a C int read
    # as bool, integers of fewer bits than their size, at a bit offset, padded with ones) and must read it
    if not dset.id.get_type().equal(h5py.h5t.py_create(dset.dtype, logical=True)):
        return None
    offset = dset.id.get_offset()
    end = None if offset is None else offset + dset.id.get_storage_size()
    # an unwritten dataset has no address (None, or an undefined one past the end of the file)
    if end is None or dset.id.get_storage_size() != dset.size * dset.dtype.itemsize:
        return None
    return int(offset) if end <= os.path.getsize(file_of(dset)) else None


def _found(name: str, parent: str, env: str) -> str | None:
    """Where HDF5 finds the file ``name`` that ``parent`` links to (an external link, a virtual dataset's source):
    as given if absolute, else after ``env``'s prefixes, in ``parent``'s folder, then as is; None: nowhere."""
    folder = os.path.dirname(parent)
    tried = [name] if os.path.isabs(name) else []
    base = os.path.basename(name) if os.path.isabs(name) else name
    prefixes = [p.replace("${ORIGIN}", folder) for p in os.environ.get(env, "").split(":") if p]
    tried += [os.path.join(p, base) for p in prefixes] + [os.path.join(folder, base), base]
    return next((os.path.abspath(t) for t in tried if os.path.isfile(t)), None)


def broken_link(f: Any, name: str) -> str | None:
    """Why ``name`` in the open file ``f`` leads nowhere, where a link on its way does (an external link to a
    missing file or name, a soft link to nothing), or None."""
    h5py = h5py_module()
    parts = name.strip("/").split("/")
    for n in range(1, len(parts) + 1):
        here = "/".join(parts[:n])
        if f.get(here) is not None:
            continue
        link = f.get(here, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            target = _found(link.filename, f.filename, "HDF5_EXT_PREFIX")
            if target is None:
                return (
                    f"{here!r} is an external link to {link.path!r} in the file {link.filename!r}, which is not "
                    f"there (looked for beside {f.filename} and in the working folder)"
                )
            return f"{here!r} is an external link to {link.path!r} in {target}, which has no such object"
        if isinstance(link, h5py.SoftLink):
            return f"{here!r} is a soft link to {link.path!r}, which is not in the file"
        return None
    return None


def virtual_files(dset: Any, path: str) -> list[str]:
    """The files a virtual dataset's rows come from (none for another dataset); a source that is missing (whose
    rows h5py would read as the fill value) is refused, naming the file.

    Raises:
        FileNotFoundError: a source file is not there, or has not the dataset it should give rows from.
    """
    if not dset.is_virtual:
        return []
    files: list[str] = []
    for source in dset.virtual_sources():
        if "%" in source.file_name or "%" in source.dset_name:  # a printf-style pattern: HDF5's to expand
            continue
        file = path if source.file_name == "." else _found(source.file_name, path, "HDF5_VDS_PREFIX")
        if file is None:
            raise FileNotFoundError(
                f"{HDF5}: {dset.name!r} in {path} is a virtual dataset whose rows come from {source.dset_name!r} in "
                f"the file {source.file_name!r}, which is not there (looked for beside {path} and in the working "
                "folder); h5py would read the fill value for its rows: restore that file"
            )
        with contextlib.nullcontext(dset.file) if source.file_name == "." else open_file(file) as f:
            if not isinstance(f.get(source.dset_name), h5py_module().Dataset):
                raise FileNotFoundError(
                    f"{HDF5}: {dset.name!r} in {path} is a virtual dataset whose rows come from "
                    f"{source.dset_name!r} in {file}, which has no such dataset; h5py would read the fill value "
                    "for its rows: restore that dataset in it"
                )
        files.append(file)
    return list(dict.fromkeys(files))


def native(dtype: np.dtype) -> np.dtype:
    """The dtype rows are handed out in: the file's, in this machine's byte order (torch has no big-endian)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


def stamp(path: str) -> Stamp:
    """What identifies a file's contents cheaply: device, inode, size and modification time (None: gone)."""
    try:
        s = os.stat(path)
    except FileNotFoundError:
        return None
    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)


def check_unchanged(stamps: Mapping[str, Stamp]) -> None:
    """Raise unless every file still has the stamp it had when ``ct.hdf5`` opened it: the offsets and shapes
    found then would read other bytes of a rewritten file (or fault on a shorter one)."""
    for path, then in stamps.items():
        now = stamp(path)
        if now == then:
            continue
        if now is None:
            what = "it is gone"
        elif then is not None and now[:2] != then[:2]:
            what = "another file is at its path now"
        elif then is not None and now[2] != then[2]:
            what = f"its size went from {then[2]} to {now[2]} bytes"
        else:
            what = "it was written to"
        raise RuntimeError(
            f"{HDF5}: {path} changed since ct.hdf5 opened it ({what}); the offsets and shapes read then would read "
            "other bytes now: call ct.hdf5 again on the file as it is (and keep it unchanged while it is read)"
        )


class Swapped:
    """A memory map of another byte order, gathered like an array and handed out in native order."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        return self.array[index].astype(native(self.array.dtype))


class Rows:
    """Rows of a dataset that h5py reads (chunked, filtered), gathered like an array: one read of the sorted
    distinct rows (h5py reads a list of rows only increasing and distinct), then put in the order asked.

    Args:
        opened: the dataset's bound method giving the h5py file opened in this process, held weakly so that a
            dataset dropped closes its file at once, not at the next garbage collection.
    """

    def __init__(self, opened: Callable[[], Any], key: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.opened = weakref.WeakMethod(opened)  # a bound method: see Args
        self.key, self.shape, self.dtype = key, shape, native(dtype)

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        if not len(index):
            return np.empty((0, *self.shape[1:]), self.dtype)
        unique, inverse = np.unique(index, return_inverse=True)
        opened = self.opened()
        if opened is None:
            raise RuntimeError(
                f"{HDF5}: the rows of {self.key!r} were asked for after their dataset was dropped; "
                "keep the HDF5Dataset while its rows are read"
            )
        out = opened()[self.key][unique]
        out = out if len(unique) == len(index) and (unique == index).all() else out[inverse.reshape(-1)]
        return out.astype(self.dtype, copy=False)

"""A store's files: one ``.npy`` per array and ``manifest.json``; written durably, read back only after checks.

The manifest is written last, inside a temporary folder that is then renamed into place: a store without a
manifest is incomplete, and a folder at ``path`` is either a complete store or nothing ever published.
Reading checks everything the manifest and the headers claim before mapping a byte: plain file names only,
no symbolic links, the dtype and shape each field needs, and a file size that matches exactly.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from composetrain.core.util import CACHE
from composetrain.data.layout import NAME, Field, from_json, to_json, unflatten
from composetrain.data.mapped import Region

__all__ = [
    "FORMAT",
    "MANIFEST",
    "REWRITE",
    "NotAStore",
    "NpyWriter",
    "StoreError",
    "fsync_folder",
    "manifest_text",
    "read_json",
    "read_manifest",
    "regions",
    "write_manifest",
]

FORMAT, MANIFEST = 1, "manifest.json"
REWRITE = "pass rebuild=True to write the store again"  # the fix for a store that cannot be read as it claims
# never through a symbolic link, and never waiting: opening a FIFO for reading would block until it has a writer
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
_LIMIT = 1 << 24  # the largest manifest read (a crafted one must not exhaust memory): none larger is written
_HEADER = 256  # bytes kept for the .npy header, written once the number of items is known


class StoreError(ValueError):
    """A store on disk that cannot be read as what it claims to be."""


class NotAStore(StoreError):
    """A ``manifest.json`` that is not a cache manifest: the folder is something else, never ct.cache's to replace."""


class NpyWriter:
    """An ``.npy`` file written as a stream of items' bytes; its header (shape) is filled in at the end.

    No file stays open between writes: an item may have thousands of leaves (one file each), more than a
    process may hold open. The bytes wait in memory until ``limit`` of them, then are appended in one open.
    """

    def __init__(self, path: Path, dtype: np.dtype[Any], limit: int = 1 << 20) -> None:
        self.path, self.dtype, self.count, self.limit = path, dtype, 0, limit
        self.pending: list[bytes] = [b"\0" * _HEADER]
        self.size = _HEADER
        with open(path, "xb"):
            pass  # created now: a path that cannot be written fails before any item is read

    def append(self, values: np.ndarray[Any, Any]) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtype).tobytes()
        self.pending.append(data)
        self.size += len(data)
        self.count += values.size
        if self.size >= self.limit:
            self.flush()

    def flush(self) -> None:
        with open(self.path, "ab") as f:
            f.writelines(self.pending)
        self.pending, self.size = [], 0

    def finish(self, shape: tuple[int, ...]) -> None:
        """Write the header for ``shape`` (its size must be what was appended), then fsync."""
        assert int(np.prod(shape)) == self.count, (shape, self.count)
        header = repr({"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape})
        header = header.ljust(_HEADER - 10 - 1) + "\n"
        if len(header) + 10 != _HEADER:
            raise ValueError(
                f"{CACHE}: an array of shape {shape} needs a longer .npy header than {_HEADER} bytes; "
                "give the item's leaves fewer dimensions (reshape them in __getitem__)"
            )
        self.flush()
        with open(self.path, "r+b") as f:
            f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1"))
            f.flush()
            os.fsync(f.fileno())


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest_text(item: Any, length: int, origin: dict[str, Any]) -> str:
    """The manifest's JSON; a ValueError where it is larger than ``read_manifest`` reads (never published)."""
    text = json.dumps({"format": FORMAT, "length": length, "item": to_json(item), "origin": origin}, indent=1)
    if len(text.encode()) > _LIMIT:
        raise ValueError(
            f"{CACHE}: the store's manifest would take {len(text.encode())} bytes, more than its reader "
            f"reads ({_LIMIT}): give items fewer leaves, or a shorter key"
        )
    return text


def write_manifest(folder: Path, item: Any, length: int, origin: dict[str, Any]) -> None:
    """The manifest that makes ``folder`` a complete store: written, fsynced, then the folder fsynced."""
    text = manifest_text(item, length, origin)
    with open(folder / MANIFEST, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    fsync_folder(folder)


def _read_plain(path: Path, limit: int) -> bytes:
    """A regular file's bytes, never through a symbolic link, at most ``limit`` of them."""
    fd = os.open(path, _READ)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAStore(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:  # a buffer of the file's size: read(limit + 1) takes the limit
            data = f.read(min(info.st_size, limit) + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotAStore(f"{path} is larger than a manifest can be ({limit} bytes)")
    return data


def read_json(folder: Path) -> Any:
    """The JSON value of ``folder``'s manifest, unchecked; FileNotFoundError when there is none, NotAStore when it
    is not JSON Python reads (nested too deep, an integer past its 4300 digits) or cannot be read."""
    try:
        return json.loads(_read_plain(folder / MANIFEST, _LIMIT))
    except (ValueError, RecursionError) as e:  # ValueError: not JSON, not UTF-8, or an int too long to convert
        raise NotAStore(f"{folder / MANIFEST} is not JSON: {e}") from None
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise NotAStore(f"{folder / MANIFEST} cannot be read: {e.strerror or e}") from None


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a complete store, its structure checked; FileNotFoundError when there is none."""
    raw = read_json(folder)
    if not isinstance(raw, dict) or set(raw) != {"format", "length", "item", "origin"}:
        raise NotAStore(f"{folder / MANIFEST} is not a cache manifest")
    if type(raw["format"]) is not int or raw["format"] < 1:  # another tool's manifest with these keys ("webdataset")
        raise NotAStore(f"{folder / MANIFEST} is not a cache manifest (its format is {raw['format']!r}, not a version)")
    if raw["format"] != FORMAT:
        raise StoreError(
            f"{folder} has format version {raw['format']!r}; this composetrain reads version {FORMAT}: "
            f"{REWRITE}, or read it with the composetrain that wrote it"
        )
    if type(raw["length"]) is not int or raw["length"] < 0 or not isinstance(raw["origin"], dict):
        raise StoreError(f"{folder / MANIFEST}: its length or origin is malformed; {REWRITE}")
    try:
        raw["item"] = from_json(raw["item"])
    except (ValueError, TypeError) as e:
        raise StoreError(f"{folder / MANIFEST}: {e}; {REWRITE}") from None
    return raw


def regions(folder: Path, item: Any, length: int) -> dict[str, Region]:
    """Every array the item's fields name, checked against its ``.npy`` file: a plain name in ``folder``, a
    regular file (no link), the dtype and shape the field needs, and exactly the bytes they take."""
    fields: list[Field] = []
    unflatten(item, fields.append)
    expected: dict[str, tuple[np.dtype[Any], tuple[int, ...] | None]] = {}
    for f in fields:
        if f.shape is not None:
            expected[f.data] = (f.storage, (length, *f.shape))
        else:
            assert f.offsets is not None and f.shapes is not None
            expected[f.data] = (f.storage, None)  # its length is the last offset
            expected[f.offsets] = (np.dtype("<i8"), (length + 1,))
            expected[f.shapes] = (np.dtype("<i8"), None)
    found = {name: _region(folder, name, dtype, shape) for name, (dtype, shape) in expected.items()}
    for f in fields:
        if f.shape is None:
            _check_ragged(folder, f, found, length)
    return found


def _region(folder: Path, name: str, dtype: np.dtype[Any], shape: tuple[int, ...] | None) -> Region:
    if not NAME.match(name):
        raise StoreError(f"{folder}: the array name {name!r} is not a plain name; {REWRITE}")
    path = folder / f"{name}.npy"
    try:
        fd = os.open(path, _READ)
    except OSError as e:
        raise StoreError(
            f"{path} cannot be opened ({e.strerror or e}): a store's arrays are regular files; {REWRITE}"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before fdopen, which refuses a folder naming only the descriptor
        os.close(fd)
        raise StoreError(f"{path} is not a regular file; {REWRITE}")
    with os.fdopen(fd, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0(f, max_header_size=_HEADER) if version == (1, 0) else None
            why = f"version {version}"
        except ValueError as e:
            header, why = None, str(e)
        if header is None:
            raise StoreError(f"{path} is not a .npy file this store wrote: {why}; {REWRITE}")
        got_shape, fortran, got_dtype = header
        offset = f.tell()
    if fortran or got_dtype != dtype or (shape is not None and got_shape != shape):
        raise StoreError(
            f"{path} holds {got_dtype} {got_shape}{' (Fortran order)' if fortran else ''}; "
            f"the manifest needs {dtype} {shape if shape is not None else '(any length)'}; "
            f"{REWRITE}"
        )
    size = offset + int(np.prod(got_shape)) * dtype.itemsize
    if info.st_size != size:
        raise StoreError(f"{path} has {info.st_size} bytes; its header says {size} (truncated or altered): {REWRITE}")
    return Region(str(path), offset, dtype.str, tuple(got_shape))


def _check_ragged(folder: Path, f: Field, found: dict[str, Region], length: int) -> None:
    """A ragged field's offsets and shapes must describe its data exactly (read now: they are small)."""
    assert f.offsets is not None and f.shapes is not None
    data, offsets = found[f.data], np.load(found[f.offsets].path, allow_pickle=False)
    shapes = np.load(found[f.shapes].path, allow_pickle=False)
    ok = (
        len(data.shape) == 1
        and shapes.ndim == 2
        and shapes.shape[0] == length
        and offsets[0] == 0
        and offsets[-1] == data.shape[0]
        and bool(np.all(np.diff(offsets) >= 0))
        and bool(np.all(shapes >= 0))
        and bool(np.all(np.prod(shapes.astype(np.float64), axis=1) < 2**62))  # no product wraps around
        and bool(np.all(np.prod(shapes, axis=1) == np.diff(offsets)))
    )
    if not ok:
        raise StoreError(
            f"{folder}: the offsets and shapes of ragged array {f.data!r} do not match its data; {REWRITE}"
        )

"""``ct.write_tokens``: token ids appended to a token file (raw ``.bin`` or ``.npy``) that ``ct.tokens`` reads.

A call writes the file's tokens and the new ones into a temporary file beside it, fsyncs it, and renames it over
the path (then fsyncs the folder): the path holds the old file or the new one, never a part, and a call that fails
(an id the dtype cannot hold, an array of floats, a full disk, an exception in the caller's iterable) leaves the
file as it was and no temporary file behind. Writers in one folder take turns (``fcntl.flock`` on the folder), so the
temporary file of a writer that was killed (SIGKILL, a node lost) is removed by the next write to that path. A file
with no write permission for anyone is not appended to.
Each call copies the file it appends to: write a shard in few calls (``arrays`` may be a generator of documents).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composetrain.core.util import WRITE_TOKENS, show
from composetrain.data.store_files import fsync_folder
from composetrain.data.token_files import layout_of, token_dtype

__all__ = ["write_tokens"]

HEADER = 128  # bytes of the .npy header written: room for any count, so the data starts at a fixed place
_COPY = 1 << 23  # bytes copied at a time from the file appended to


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """This process alone writes token files in ``folder`` until it leaves (the lock dies with it)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _target(path: Any) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{WRITE_TOKENS}: path must be a file path, got {show(path)}; e.g. 'shards/train_000.bin'")
    target = Path(os.path.abspath(path))
    if target.is_symlink():
        raise ValueError(
            f"{WRITE_TOKENS}: {target} is a symbolic link, which the new file would replace; give the path of the "
            f"file it points to ({os.path.realpath(target)})"
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{WRITE_TOKENS}: no folder {target.parent} for {target.name}; create it first")
    return target


def _arrays(arrays: Any) -> Iterator[Any]:
    """The arrays of ids given: one array (or tensor) alone, or each element of an iterable."""
    if isinstance(arrays, np.ndarray | torch.Tensor):
        yield arrays
        return
    if isinstance(arrays, str | bytes | dict) or not isinstance(arrays, Iterable):
        raise TypeError(
            f"{WRITE_TOKENS}: arrays must be an array of token ids or an iterable of them (one per document), got "
            f"{show(arrays)}; e.g. ct.write_tokens([ids_1, ids_2], 'train.bin', dtype=np.uint16)"
        )
    yield from arrays


def _ids(array: Any, n: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Array ``n`` as a flat ``dtype`` array, refused unless it is integers that ``dtype`` holds, none negative."""
    if isinstance(array, int | np.integer):
        raise TypeError(
            f"{WRITE_TOKENS}: element {n} of arrays is the number {show(array)}, not an array of ids; give one array "
            "of ids as np.array(ids), or several as a list of arrays"
        )
    values = array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    if values.size == 0:
        return values.astype(dtype).reshape(-1)
    if values.dtype.kind not in "ui" or values.ndim != 1:
        raise TypeError(
            f"{WRITE_TOKENS}: array {n} must be a flat array of integer token ids, got {values.dtype} of shape "
            f"{values.shape}; convert it first (ids.reshape(-1).astype(np.int64))"
        )
    low, high, top = int(values.min()), int(values.max()), int(np.iinfo(dtype).max)
    if low < 0:  # no dtype holds it as a token: a wider one is no fix
        at = int(np.argmin(values))
        raise ValueError(
            f"{WRITE_TOKENS}: array {n} holds the negative id {low} at position {at}, and token ids are 0 or more; "
            "nothing was written; give the tokenizer's ids (an ignore label such as -100 belongs in a batch's "
            "labels, not in a token file)"
        )
    if high > top:
        at = int(np.argmax(values))
        raise ValueError(
            f"{WRITE_TOKENS}: array {n} holds the id {high} at position {at}, which {dtype} cannot hold "
            f"(0 to {top}); nothing was written; write a file of a wider dtype (dtype=np.uint32, in a new file)"
        )
    return values.astype(dtype, copy=False)


def _npy_header(dtype: np.dtype[Any], count: int) -> bytes:
    header = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (count,)})
    return b"\x93NUMPY\x01\x00" + (HEADER - 10).to_bytes(2, "little") + header.ljust(HEADER - 11).encode() + b"\n"


def write_tokens(arrays: Any, path: str | os.PathLike[str], *, dtype: Any = None) -> int:
    """Append token ids to the token file at ``path`` (created if missing), durably and atomically.

    ``path`` ending in ``.npy`` is an ``.npy`` file of a flat array (its header holds the dtype and count);
    any other is a raw file of ``dtype`` (nanoGPT's ``.bin``), as ``ct.tokens`` reads them. The old tokens and
    the new ones go to a temporary file in the same folder, fsynced, then renamed over ``path``: a call that fails
    changes nothing. Ids are checked to fit ``dtype`` (0 to its largest value) before the file is replaced.

    Args:
        arrays: token ids: one flat integer array (NumPy, a tensor), or an iterable of them (a list, a generator
            of documents), appended in order.
        path: the token file.
        dtype: the NumPy integer dtype of a raw file (required: a raw file does not record it), or of a new
            ``.npy`` file (default ``np.uint16``); an existing ``.npy`` file keeps its own (a different one given
            is refused).

    Returns:
        The number of tokens the file holds now.

    Example:
        >>> ids = [np.frombuffer(text.encode(), np.uint8) for text in documents]  # doctest: +SKIP
        >>> ct.write_tokens(ids, "shards/train_000.bin", dtype=np.uint16)  # doctest: +SKIP
        >>> data = ct.tokens("shards/train_000.bin", 256, dtype=np.uint16, vocab_size=256)  # doctest: +SKIP
    """
    target = _target(path)
    npy = target.suffix == ".npy"
    wanted = None if dtype is None else token_dtype(dtype, WRITE_TOKENS)
    if wanted is None and not npy:
        raise TypeError(
            f"{WRITE_TOKENS}: {target} is a raw token file, which does not record its dtype; give dtype=, e.g. "
            "dtype=np.uint16 (nanoGPT's), and the same to ct.tokens"
        )
    with _folder_lock(target.parent):
        exists = os.path.lexists(target)
        offset, dtype_, count = 0, wanted if wanted is not None else np.dtype(np.uint16), 0
        if exists:
            offset, dtype_, count, _ = layout_of(target, wanted, WRITE_TOKENS)
            _refuse_read_only(target)
        _remove_leftovers(target)  # a killed writer's: no other writer is in the folder while we hold its lock
        temporary = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        ours = True  # False while the caller's iterable runs: an OSError there is its own (a file it reads)
        try:
            with open(temporary, "xb") as out:
                out.write(_npy_header(dtype_, 0) if npy else b"")
                if exists:
                    with open(target, "rb") as old:
                        old.seek(offset)
                        _copy(old, out, count * dtype_.itemsize, target)
                added, n, source = 0, 0, _arrays(arrays)
                while True:
                    ours = False
                    array = next(source, _END)
                    ours = True
                    if array is _END:
                        break
                    ids = _ids(array, n, dtype_)
                    out.write(ids.tobytes())
                    added, n = added + ids.size, n + 1
                if npy:
                    out.seek(0)
                    out.write(_npy_header(dtype_, count + added))
                out.flush()
                os.fsync(out.fileno())
            if exists:
                shutil.copymode(target, temporary)  # the file keeps who may read it
            os.replace(temporary, target)
        except BaseException as e:
            temporary.unlink(missing_ok=True)
            failed = e if isinstance(e, OSError) and ours else None
            fix = _FIXES.get(failed.errno or 0) if failed is not None else None
            if failed is not None and fix is not None:
                raise OSError(
                    failed.errno,
                    f"{WRITE_TOKENS}: writing {target} failed ({failed.strerror}); nothing was written, the file is "
                    f"as it was; {fix.format(folder=target.parent)}",
                ) from e
            raise
        fsync_folder(target.parent)
    return count + added


_END = object()
_FULL = "free space in {folder} (a copy of the file and the new tokens must fit), or write to a new file elsewhere"
_DENIED = "make {folder} writable (the new file is written beside the old one), or write to a new file elsewhere"
_FIXES = {  # how writing the new file beside the old one fails, and the fix
    errno.ENOSPC: _FULL,
    errno.EDQUOT: _FULL,
    errno.EFBIG: _FULL,  # a file size limit (ulimit -f)
    errno.EACCES: _DENIED,
    errno.EPERM: _DENIED,
    errno.EROFS: _DENIED,
}


def _refuse_read_only(target: Path) -> None:
    """A file that nobody may write to is not appended to (the rename that publishes a new file would bypass it)."""
    mode = os.stat(target).st_mode
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"{WRITE_TOKENS}: {target} is read-only (mode {stat.filemode(mode)}), kept from changes; nothing was "
            f"written; make it writable (chmod u+w {target}) to append to it, or write the tokens to a new file"
        )


def _remove_leftovers(target: Path) -> None:
    """Delete the temporary files that writers of ``target`` killed mid-write left beside it (named as ours only)."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.\d+\.[0-9a-f]{{8}}\.tmp")
    for entry in os.scandir(target.parent):
        if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
            warnings.warn(
                f"{WRITE_TOKENS}: removed {entry.path}, the temporary file of a write to {target} that was killed "
                "before it finished (its tokens were never published)",
                stacklevel=3,
            )


def _copy(source: Any, out: Any, size: int, path: Path) -> None:
    """``size`` bytes from ``source`` to ``out``, a bounded piece at a time."""
    while size:
        piece = source.read(min(_COPY, size))
        if not piece:
            raise RuntimeError(
                f"{WRITE_TOKENS}: {path} ended {size} bytes early while it was copied (another process cut it); "
                "nothing was written; write to it from one process at a time"
            )
        out.write(piece)
        size -= len(piece)

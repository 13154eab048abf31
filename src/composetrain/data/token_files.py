"""``ct.tokens``: token files (nanoGPT's raw ``.bin``, or ``.npy``) as a map-style Dataset of ``(inputs, targets)``
windows, memory-mapped and checked before a byte is mapped, a whole batch read with one gather per file.

A file of ``n`` tokens holds ``(n - 1) // seq_len`` windows: window ``k`` is its tokens ``k * seq_len`` to
``k * seq_len + seq_len`` (``seq_len + 1`` of them), so consecutive windows share one token and every token but the
first is a target once. The last ``(n - 1) % seq_len`` tokens of a file (fewer than ``seq_len``) are never read.
Windows are counted file after file. Which windows an update reads, and in which order, is the run's (``ct.run``'s
sampler, or its global order under ``global_batch_size``): an epoch reads every window once, and a resume is exact.
"""

from __future__ import annotations

import os
import stat
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composetrain.core.util import TOKENS, check_int, show
from composetrain.data.layout import Field
from composetrain.data.mapped import MappedDataset, Region

__all__ = ["TokenDataset", "TokenFile", "layout_of", "token_dtype", "tokens"]

CHUNK = 1 << 22  # tokens read at a time when checking them against vocab_size: memory stays bounded
_MAGIC = b"\x93NUMPY"
Stamp = tuple[int, int, int, int]


@dataclass(frozen=True)
class TokenFile:
    """One token file as ``ct.tokens`` found it: ``count`` tokens of ``dtype`` from byte ``offset`` of ``path``."""

    path: str
    offset: int
    dtype: str
    count: int
    stamp: Stamp  # device, inode, size, modification time: what a process checks before it maps the file


def token_dtype(value: Any, who: str, arg: str = "dtype") -> np.dtype[Any]:
    """``value`` as the NumPy dtype of token ids: an integer type of at most 8 bytes that int64 holds."""
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or value is None or dtype.kind not in "ui" or dtype.itemsize > 8 or dtype == np.uint64:
        raise TypeError(
            f"{who}: {arg} must be a NumPy integer dtype that int64 holds (uint8, uint16, uint32, int32, int64, ...), "
            f"got {show(value)}; e.g. {arg}=np.uint16 (what nanoGPT's prepare.py writes)"
        )
    return dtype


def _stamp(s: os.stat_result) -> Stamp:
    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)


def layout_of(path: Path, dtype: np.dtype[Any] | None, who: str) -> tuple[int, np.dtype[Any], int, Stamp]:
    """(header bytes, dtype, tokens, stamp) of the token file at ``path``: an ``.npy`` file's from its header (a
    ``dtype`` given must agree), a raw file's from its size and ``dtype``. Everything checked, nothing mapped.

    Raises:
        FileNotFoundError / ValueError / TypeError: the file, and what is wrong with it, named with the fix.
    """
    try:
        s = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{who}: no file at {path}; give the path of a token file (nanoGPT's train.bin, or an .npy file of ids)"
        ) from None
    if not stat.S_ISREG(s.st_mode):
        what = "a folder" if stat.S_ISDIR(s.st_mode) else "not a regular file"
        raise ValueError(
            f"{who}: {path} is {what}; give the token files themselves, e.g. sorted(glob.glob('shards/*.bin'))"
        )
    with open(path, "rb") as f:
        start = f.read(len(_MAGIC))
        if path.suffix == ".npy":
            offset, found = _npy_header(f, start, path, s.st_size, who)
            if dtype is not None and dtype != found:
                raise ValueError(
                    f"{who}: dtype={dtype} was given, but {path} is an .npy file of {found}; leave dtype out for "
                    f".npy files (their header says theirs), or write the file with {dtype}"
                )
            dtype = found
        else:
            if start == _MAGIC:
                raise ValueError(
                    f"{who}: {path} is an .npy file (its header says so), read here as raw tokens; rename it to "
                    f"{path.with_suffix('.npy').name}, so that its header is read"
                )
            if dtype is None:
                raise TypeError(
                    f"{who}: {path} is a raw token file, which does not say its dtype; give dtype=, e.g. "
                    "dtype=np.uint16 (what nanoGPT's prepare.py writes)"
                )
            offset = 0
    size = s.st_size - offset
    if size % dtype.itemsize:
        raise ValueError(
            f"{who}: {path} holds {size} bytes of tokens, not a whole number of {dtype} tokens ({dtype.itemsize} "
            "bytes each): it was written with another dtype, or cut short; give the dtype it was written with"
        )
    return offset, dtype, size // dtype.itemsize, _stamp(s)


def _npy_header(f: Any, start: bytes, path: Path, size: int, who: str) -> tuple[int, np.dtype[Any]]:
    """The data offset and dtype of the ``.npy`` file open at ``f``: a flat array of integers, exactly its size."""
    if start != _MAGIC:
        raise ValueError(
            f"{who}: {path} is named .npy but has no .npy header; rename it .bin and give its dtype (a raw file), "
            "or write it with np.save"
        )
    try:
        f.seek(0)
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, _, dtype = read(f)
    except (KeyError, ValueError, SyntaxError, tokenize.TokenError) as e:  # TokenError: a header cut inside a bracket
        raise ValueError(
            f"{who}: {path} has an .npy header that cannot be read ({e}); write it again with np.save"
        ) from None
    offset = f.tell()
    dtype = token_dtype(dtype, who, f"{path}'s dtype")
    if len(shape) != 1:
        raise ValueError(
            f"{who}: {path} holds an array of shape {shape}, not a flat sequence of token ids; save it flat "
            "(np.save(path, ids.reshape(-1)))"
        )
    if size != offset + shape[0] * dtype.itemsize:
        raise ValueError(
            f"{who}: {path} is {size} bytes, but its header promises {shape[0]} tokens of {dtype} after "
            f"{offset} header bytes ({offset + shape[0] * dtype.itemsize} bytes): it is cut short or has bytes "
            "appended; write it again"
        )
    return offset, dtype


def _check_vocab(file: TokenFile, vocab_size: int) -> None:
    """Every token of ``file`` below ``vocab_size`` (and not negative), read ``CHUNK`` tokens at a time."""
    with open(file.path, "rb") as f:
        f.seek(file.offset)
        done = 0
        while done < file.count:
            chunk = np.fromfile(f, dtype=file.dtype, count=min(CHUNK, file.count - done))
            if not chunk.size:  # cut short since it was opened
                _check_unchanged([file])
                raise RuntimeError(f"{TOKENS}: {file.path} ended at token {done} of {file.count}; write it again")
            low, high = int(chunk.min()), int(chunk.max())
            if low < 0 or high >= vocab_size:
                wide = chunk.astype(np.int64)
                at = int(np.flatnonzero((wide < 0) | (wide >= vocab_size))[0])
                raise ValueError(
                    f"{TOKENS}: {file.path} holds the token {int(wide[at])} at token {done + at} (byte "
                    f"{file.offset + (done + at) * np.dtype(file.dtype).itemsize}), outside the vocabulary "
                    f"(0 to vocab_size - 1 = {vocab_size - 1}); give the dtype the file was written with, or the "
                    "vocabulary size of the tokenizer that wrote it"
                )
            done += chunk.size


def _check_unchanged(files: Sequence[TokenFile]) -> None:
    """Raise unless every file is still the one ``ct.tokens`` checked (a process maps it by path, later)."""
    for file in files:
        try:
            now: Stamp | None = _stamp(os.stat(file.path))
        except FileNotFoundError:
            now = None
        if now == file.stamp:
            continue
        if now is None:
            what = "it is gone"
        elif now[:2] != file.stamp[:2]:
            what = "another file is at its path now (ct.write_tokens publishes a new file)"
        elif now[2] != file.stamp[2]:
            what = f"its size went from {file.stamp[2]} to {now[2]} bytes"
        else:
            what = "it was written to"
        raise RuntimeError(
            f"{TOKENS}: {file.path} changed since ct.tokens checked it ({what}), so its windows would be read from "
            "other tokens; call ct.tokens again on the files as they are, and keep them unchanged while they are read"
        )


class TokenDataset(MappedDataset):
    """What ``ct.tokens`` returns: windows of ``seq_len + 1`` tokens as ``(inputs, targets)``, int64 tensors of
    ``seq_len`` each, ``targets`` the inputs shifted by one. A ``MappedDataset``: ``read_batch(indices)`` gives
    ``[inputs, targets]`` of shape ``(len(indices), seq_len)`` with one gather per file the indices fall in
    (ct.run reads so), ``__getitems__`` those rows as items; files are mapped in each process on first read
    (it pickles small to loader workers) after a check that they are the files ``ct.tokens`` checked.

    Attributes:
        files: the ``TokenFile`` of each path, in order.
        seq_len: tokens per input.
        windows: each file's window count; the dataset's length is their sum.
    """

    described = "ct.tokens' memory-mapped token files"

    def __init__(self, files: Sequence[TokenFile], seq_len: int) -> None:
        self.files, self.seq_len = list(files), seq_len
        self.windows = [(f.count - 1) // seq_len for f in self.files]
        self.first = np.cumsum([0, *self.windows])  # the index of each file's first window, and the length
        regions = {  # the tokens the windows cover: the tail after the last one is never mapped
            str(n): Region(f.path, f.offset, f.dtype, (w * seq_len + 1,))
            for n, (f, w) in enumerate(zip(self.files, self.windows, strict=True))
        }
        item = (Field("tensor", "int64", (seq_len,), "inputs"), Field("tensor", "int64", (seq_len,), "targets"))
        super().__init__(regions, item, int(self.first[-1]))
        self._rows: list[np.ndarray[Any, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_rows": None}  # each process maps the files again, after checking them

    @property
    def dropped(self) -> list[int]:
        """Each file's tokens after its last window, never read: ``(count - 1) % seq_len``, fewer than seq_len."""
        return [f.count - w * self.seq_len - 1 for f, w in zip(self.files, self.windows, strict=True)]

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """Each file's covered tokens, mapped read-only on first use in this process (checked unchanged first)."""
        if self._arrays is None:
            _check_unchanged(self.files)
            flat = super().arrays()
            self._rows = [  # window k of file n is row k: a view with overlapping rows, nothing copied
                np.lib.stride_tricks.as_strided(
                    a, shape=(w, self.seq_len + 1), strides=(self.seq_len * a.itemsize, a.itemsize), writeable=False
                )
                for a, w in zip(flat.values(), self.windows, strict=True)
            ]
        return self._arrays  # type: ignore[return-value]

    def read_batch(self, indices: Sequence[int], epoch: int | None = None, rank: int | None = None) -> Any:
        """``[inputs, targets]`` of the windows at ``indices``: int64 tensors of shape ``(len(indices), seq_len)``,
        read with one gather per file they fall in (``epoch`` and ``rank`` are unused: nothing is augmented)."""
        idx = self._indices(indices).numpy()
        self.arrays()
        assert self._rows is not None
        which = np.searchsorted(self.first, idx, side="right") - 1
        files = np.unique(which)
        # the files read, checked again (one stat each): a file cut short under its map kills the process with
        # SIGBUS at the read, and one written in place would be read as other tokens
        _check_unchanged([self.files[n] for n in files.tolist()])
        if len(files) == 1:
            n = int(files[0])
            rows = self._rows[n][idx - self.first[n]]
        else:  # files of different dtypes may meet in a batch
            rows = np.empty((len(idx), self.seq_len + 1), np.int64)
            for n in files.tolist():
                at = which == n
                rows[at] = self._rows[n][idx[at] - self.first[n]]
        inputs = torch.from_numpy(rows[:, :-1].astype(np.int64))
        return [inputs, torch.from_numpy(rows[:, 1:].astype(np.int64))]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.read_batch([self._index(i)])
        return inputs[0], targets[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The windows at ``indices`` as items, from one ``read_batch`` (rows of its two tensors)."""
        inputs, targets = self.read_batch(indices)
        return list(zip(inputs, targets, strict=True))

    def __repr__(self) -> str:
        names = [f.path for f in self.files]
        shown = names if len(names) <= 3 else [*names[:2], f"... {len(names) - 2} more"]
        return f"{TOKENS}({shown}, seq_len={self.seq_len}): {len(self)} windows"


def _paths(paths: Any) -> list[Path]:
    items = [paths] if isinstance(paths, str | os.PathLike) else paths
    if not isinstance(items, list | tuple) or not items or not all(isinstance(p, str | os.PathLike) for p in items):
        raise TypeError(
            f"{TOKENS}: paths must be a path or a non-empty list of paths, got {show(paths)}; e.g. "
            "ct.tokens(sorted(glob.glob('shards/train_*.bin')), 1024, dtype=np.uint16)"
        )
    return [Path(os.path.abspath(p)) for p in items]


def tokens(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    seq_len: int,
    *,
    dtype: Any = None,
    vocab_size: int | None = None,
) -> TokenDataset:
    """Token files as a map-style Dataset of ``(inputs, targets)`` windows, memory-mapped, never copied whole.

    Item ``k`` is a window of ``seq_len + 1`` tokens: the k-th window of a file starts at its token
    ``k * seq_len``, and windows are counted file after file. A file's last ``(n - 1) % seq_len`` tokens (fewer
    than ``seq_len``; ``data.dropped``) are never read. ``ct.run`` reads a whole batch with one gather per file;
    which windows, in which order, is the run's: shuffled without replacement per epoch, the same on any number of
    processes with ``global_batch_size``, exact on resume.

    Args:
        paths: a token file, or a list of them: raw ``.bin`` files (nanoGPT's) of ``dtype``, or ``.npy`` files
            of a flat integer array (their header gives the dtype).
        seq_len: tokens per input (and per target).
        dtype: the NumPy dtype of raw files (``np.uint16`` for nanoGPT's); ``.npy`` files must agree if given.
        vocab_size: when given, every token of every file is checked to lie in ``[0, vocab_size)``, reading each
            file once in chunks (a file of the wrong dtype or tokenizer is found here, not in training).

    Returns:
        A ``TokenDataset``; ``data[k]`` is ``(inputs, targets)``, int64 tensors of shape ``(seq_len,)``.

    Raises:
        TypeError / ValueError / FileNotFoundError: a missing, empty, malformed or too short file, a size that is
            not a whole number of tokens, a token outside the vocabulary (named by file and offset), bad arguments.

    Example:
        >>> data = ct.tokens(["train_000.bin", "train_001.bin"], 1024, dtype=np.uint16)  # doctest: +SKIP
        >>> step = ct.accumulate(8)(lm_step)  # lm_step(model, (inputs, targets)) -> loss  # doctest: +SKIP
        >>> ct.run(step, state, data, global_batch_size=512, epochs=1, checkpoint_dir="runs/lm")  # doctest: +SKIP
    """
    seq_len = check_int(seq_len, TOKENS, "seq_len", example="ct.tokens(paths, 1024, dtype=np.uint16)")
    if vocab_size is not None:
        vocab_size = check_int(vocab_size, TOKENS, "vocab_size", example="vocab_size=50257")
    given = None if dtype is None else token_dtype(dtype, TOKENS)
    files: list[TokenFile] = []
    seen: dict[tuple[int, int], Path] = {}
    for path in _paths(paths):
        offset, found, count, stamp = layout_of(path, given, TOKENS)
        if stamp[:2] in seen:  # the same file by another name too (a link)
            raise ValueError(
                f"{TOKENS}: paths names the file {seen[stamp[:2]]} twice (also as {path}), so its windows would be "
                "read twice per epoch; give each file once"
            )
        seen[stamp[:2]] = path
        if count < seq_len + 1:
            if count == 0:
                what = "no tokens (an empty shard): leave it out of paths"
            else:
                shorter = f"give seq_len at most {count - 1}, or " if count > 1 else ""
                what = (
                    f"{count} token(s), fewer than one window of seq_len + 1 = {seq_len + 1}: {shorter}join it with "
                    "another file"
                )
            raise ValueError(f"{TOKENS}: {path} holds {what}")
        files.append(TokenFile(str(path), offset, found.str, count, stamp))
    if vocab_size is not None:
        for file in files:
            _check_vocab(file, vocab_size)
    return TokenDataset(files, seq_len)

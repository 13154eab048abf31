"""Write every item of a dataset into a new store folder: in order, in loader workers where reading is slow."""

from __future__ import annotations

import copy
import hashlib
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from composetrain.core.util import CACHE
from composetrain.data.layout import DEPTH, Field, leaf_kind, storage_dtype
from composetrain.data.mapped import same
from composetrain.data.store_files import NpyWriter, manifest_text, write_manifest

__all__ = ["fingerprint", "sampled", "write_store"]

_TIMED = 8  # items read in this process first, to decide on workers
_HELD, _LEAST = 64 << 20, 64 << 10  # bytes held in memory before writing: in all, and at least per field
_WORTH = 2.0  # seconds of reading, as timed, before workers are worth starting
_SEEDED = 5  # fingerprinted items besides the first, middle and last: a change elsewhere shows there too


def _leaves(
    item: Any, where: str, out: list[tuple[str, Any]], depth: int = 0, containers: list[tuple[str, type]] | None = None
) -> list[tuple[str, Any]]:
    """``out`` with (where, value) of every leaf appended, in the item's order (and ``containers`` with (where,
    type) of every container: a tuple and a list, or empty containers, have the same leaves); containers other than
    plain tuples, lists and dicts are refused, and containers deeper than a store's reader reads (``DEPTH``).
    (A list, not a generator: this runs for every item written.)"""
    if depth > DEPTH:
        raise ValueError(
            f"{where} lies inside {depth} containers: a store holds items nested at most {DEPTH} "
            "deep (its reader refuses deeper); flatten the item"
        )
    kind = type(item)
    if containers is not None and kind in (tuple, list, dict):
        containers.append((where, kind))
    if kind is tuple or kind is list:
        for n, x in enumerate(item):
            _leaves(x, f"{where}[{n}]", out, depth + 1, containers)
    elif kind is dict:
        for k, v in item.items():
            if not isinstance(k, str):
                raise ValueError(
                    f"{where} has the key {k!r}: only string keys are stored; make the keys strings in __getitem__"
                )
            _leaves(v, f"{where}[{k!r}]", out, depth + 1, containers)
    elif isinstance(item, tuple | list | dict):
        raise ValueError(
            f"{where} is a {type(item).__name__}: only plain tuples, lists and dicts are stored "
            "(a namedtuple or dataclass would come back as a plain container); return a plain "
            "tuple, list or dict from __getitem__"
        )
    else:
        out.append((where, item))
    return out


def _differs(made: list[tuple[str, type]], first: list[tuple[str, type]]) -> str:
    """Where an item's containers (``made``) differ from item 0's (``first``), in words."""
    theirs, mine = dict(first), dict(made)
    for where, kind in made:
        if theirs.get(where) is not kind:
            other = f"in item 0 a {theirs[where].__name__}" if where in theirs else "item 0 has none there"
            return f"{where} is a {kind.__name__}, and {other}"
    missing = [w for w, _ in first if w not in mine]
    if missing:
        return f"{missing[0]} is missing, and in item 0 a {theirs[missing[0]].__name__}"
    return " has a dict's keys in another order than item 0"  # keys of empty containers only: the leaves agree


def _skeleton(item: Any, fields: Iterator[Field]) -> Any:
    if type(item) in (tuple, list):
        return type(item)(_skeleton(x, fields) for x in item)
    if type(item) is dict:
        return {k: _skeleton(v, fields) for k, v in item.items()}
    return next(fields)


class _Column:
    """One leaf's values across items, streamed to its file; its shapes kept to tell fixed from ragged."""

    def __init__(self, folder: Path, n: int, kind: str, dtype: str, scalar: bool) -> None:
        self.name, self.folder, self.kind, self.dtype, self.scalar = f"f{n}", folder, kind, dtype, scalar
        self.out = NpyWriter(folder / f"{self.name}.npy", storage_dtype(kind, dtype))
        self.shapes: list[tuple[int, ...]] = []

    def add(self, value: Any, shape: tuple[int, ...]) -> None:
        if self.shapes and len(shape) != len(self.shapes[0]):
            raise ValueError(
                f"has {len(shape)} dimensions here and {len(self.shapes[0])} in item 0: "
                "a leaf's number of dimensions must not change; give it the same number in every "
                "item (reshape it in __getitem__)"
            )
        self.out.append(_array(value).reshape(-1))
        self.shapes.append(shape)

    def finish(self, count: int) -> Field:
        first = self.shapes[0] if self.shapes else ()
        if all(s == first for s in self.shapes):
            self.out.finish((count, *first))
            return Field(self.kind, self.dtype, first, self.name, scalar=self.scalar)
        self.out.finish((self.out.count,))
        shapes = np.array(self.shapes, dtype=np.int64).reshape(count, len(first))
        offsets = np.concatenate([[0], np.cumsum(np.prod(shapes, axis=1))]).astype(np.int64)
        for suffix, array in (("o", offsets), ("s", shapes)):
            w = NpyWriter(self.folder / f"{self.name}{suffix}.npy", np.dtype("<i8"))
            w.append(array)
            w.finish(array.shape)
        return Field(self.kind, self.dtype, None, self.name, f"{self.name}o", f"{self.name}s", self.scalar)


_NATIVE = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
}


def _array(value: Any) -> np.ndarray[Any, Any]:
    """A leaf's values as the array of the bytes the store holds."""
    if isinstance(value, torch.Tensor):
        t = value.detach().resolve_conj().resolve_neg().contiguous()  # numpy() refuses lazy views
        return t.numpy() if t.dtype in _NATIVE else t.view(_as_int(t.dtype)).numpy()
    return np.asarray(value)


def sampled(n: int) -> list[int]:
    """The items whose fingerprint a store of ``n`` items records (and every open reads again): the first, the
    middle, the last, and five drawn by a seed fixed for ``n``."""
    seeded = random.Random(n).sample(range(n), min(n, _SEEDED))
    return sorted({0, n // 2, n - 1, *seeded}) if n else []


def fingerprint(items: Iterable[Any]) -> str:
    """A digest of the items' structure, leaf types, dtypes, shapes and bytes.

    Raises:
        ValueError: an item that cannot be stored.
    """
    digest = hashlib.blake2b(digest_size=16)
    for item in items:
        for where, value in _leaves(item, f"{CACHE}: an item", []):
            digest.update(repr((where, leaf_kind(value, where))).encode())
            digest.update(_array(value).tobytes())
    return digest.hexdigest()


def _as_int(dtype: torch.dtype) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]


def _items(dataset: Any, n: int, workers: int | str) -> Iterator[Any]:
    """The dataset's items in order: the first few read here and timed; the rest by loader workers when
    reading them here would take long (``workers="auto"``), else here too."""
    tick = time.perf_counter()
    first = min(n, _TIMED)
    for i in range(first):
        yield dataset[i]
    per_item = (time.perf_counter() - tick) / max(1, first)
    if workers == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = min(8, cores - 1) if per_item * (n - first) > _WORTH else 0
    if int(workers) == 0:
        for i in range(first, n):
            yield dataset[i]
        return
    # its own generator: starting workers draws their base seed from it, never from the global one (a seeded
    # script would draw other numbers after a call that wrote the store than after one that opened it)
    loader = DataLoader(
        dataset,
        batch_size=None,
        sampler=range(first, n),
        num_workers=int(workers),
        collate_fn=same,
        prefetch_factor=4,
        generator=torch.Generator().manual_seed(0),
    )
    yield from loader


def write_store(
    dataset: Any, folder: Path, origin: dict[str, Any], workers: int | str, progress: str | None = None
) -> None:
    """Every item of ``dataset`` into the empty ``folder``, then its manifest (last: it makes the store complete);
    ``progress``: the title of a progress bar (with its ETA), or None for none.

    Raises:
        ValueError: an item that cannot be stored, or unlike item 0 in structure or dtype (named by index).
    """
    n = origin["length"]  # the len the store records: a dataset whose len changes meanwhile is refused at its next open
    columns: list[_Column] = []
    kinds: list[tuple[str, str, bool]] = []
    item0: Any = None
    paths: list[str] = []
    nests: list[tuple[str, type]] = []  # item 0's containers: where, and which type
    count = 0
    bar = _bar(n, progress)
    kept: dict[int, Any] = dict.fromkeys(sampled(n))  # the items the store's fingerprint is made of
    for i, item in enumerate(_items(dataset, n, workers)):
        if i in kept:  # a copy: a dataset may hand out one buffer, filled anew at each read
            kept[i] = copy.deepcopy(item)
        prefix = f"{CACHE}: item {i}"
        containers: list[tuple[str, type]] = []
        leaves = _leaves(item, prefix, [], containers=containers)
        here = [where[len(prefix) :] for where, _ in leaves]
        made = [(where[len(prefix) :], kind) for where, kind in containers]
        if i == 0:
            paths, nests = here, made
            item0 = item
            for where, value in leaves:
                kind, dtype, _, scalar = leaf_kind(value, where)
                kinds.append((kind, dtype, scalar))
                columns.append(_Column(folder, len(columns), kind, dtype, scalar))
            for column in columns:  # bytes held back per field: at most about 64 MB in all, however many
                column.out.limit = max(_LEAST, min(1 << 20, _HELD // len(columns)))
            # a manifest too large for the reader is refused now, not after every item is written
            first = [Field(c.kind, c.dtype, np.shape(v), c.name) for c, (_, v) in zip(columns, leaves, strict=True)]
            manifest_text(_skeleton(item, iter(first)), n, origin)
        elif here != paths:
            raise ValueError(
                f"{CACHE}: item {i} has the leaves {here} and item 0 has {paths}: every item must "
                "have the same structure; return the same keys and lengths for every item"
            )
        elif made != nests:  # the same leaves in other containers: item 0's would come back for this one
            raise ValueError(
                f"{prefix}{_differs(made, nests)}: every item must have the same structure, containers included "
                "(each item comes back in item 0's); return the same containers for every item"
            )
        for (where, value), column, (kind, dtype, scalar) in zip(leaves, columns, kinds, strict=True):
            got = leaf_kind(value, where)
            if (got[0], got[1], got[3]) != (kind, dtype, scalar):
                raise ValueError(
                    f"{where} is a {got[0]} of {got[1]}, and in item 0 a {kind} of {dtype}: every "
                    "item's leaves must keep their type and dtype; convert it to item 0's in "
                    "__getitem__"
                )
            try:
                column.add(value, got[2])
            except ValueError as e:
                raise ValueError(f"{where} {e}") from None
        count += 1
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if count != n:  # a loader worker's StopIteration ends the loader's iteration, as if the items were all read
        raise ValueError(
            f"{CACHE}: item {count}: the dataset's loader stopped after {count} of its {n} items (a StopIteration "
            "raised by __getitem__ in a loader worker ends a DataLoader early); catch it in __getitem__ (a next() "
            "on an exhausted iterator), or raise another exception there"
        )
    fields = iter([c.finish(n) for c in columns])
    item = _skeleton(item0, fields) if n else ()
    origin = {**origin, "fingerprint": {"items": list(kept), "blake2b": fingerprint(kept.values())}}
    write_manifest(folder, item, n, origin)


def _bar(n: int, title: str | None) -> Any:
    if title is None:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=n, desc=title, unit="item", file=sys.stderr, mininterval=0.5)

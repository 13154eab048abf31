"""``ct.cache(dataset, path)``: preprocess once into a memory-mapped store, then read batches as from memory."""

from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import json
import os
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset

from composetrain.core.util import CACHE, check_bool, check_int, check_real, show
from composetrain.data.kinds import augmented_inside
from composetrain.data.mapped import Augment, MappedDataset
from composetrain.data.store import (
    FULL,
    Stamp,
    check_lock_file,
    check_lock_owner,
    check_renamable,
    check_replaceable,
    check_unchanged,
    disk_error,
    leftovers,
    publish_error,
    remove_store,
    stamp,
)
from composetrain.data.store_files import MANIFEST, REWRITE, StoreError, fsync_folder, read_manifest, regions
from composetrain.data.writer import fingerprint, write_store

__all__ = ["CachedDataset", "cache"]

_MOST = 16  # items a fingerprint may name: a second open reads these, never the whole dataset
_AGAIN = "call ct.cache again to open it as it is now"


class CachedDataset(MappedDataset):
    """What ``ct.cache`` returns: a ``MappedDataset`` over the store at ``path`` (see ``MappedDataset``)."""

    path: Path
    origin: dict[str, Any]
    stamps: dict[str, Stamp]  # the store's files as opened: each process checks them before it maps them

    def arrays(self) -> dict[str, Any]:
        """The store's arrays, mapped in this process on first use: only the files it was opened on."""
        if self._arrays is None:
            check_unchanged(self.path, self.stamps)
            try:
                super().arrays()
            except FileNotFoundError:  # removed or rebuilt while mapping: say so, naming the store
                check_unchanged(self.path, self.stamps)
                raise
            try:  # replaced between the check and the maps: the maps may be of the new files
                check_unchanged(self.path, self.stamps)
            except RuntimeError:
                self._arrays, self._views = None, {}
                raise
        return self._arrays  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"CachedDataset({str(self.path)!r}, {self.length} items of {self.origin.get('type')})"


def cache(
    dataset: Any,
    path: str | os.PathLike[str],
    *,
    augment: Augment | None = None,
    rebuild: bool = False,
    seed: int = 0,
    key: Any = None,
    verify: bool = False,
    num_workers: int | str = "auto",
    timeout: float = 3600.0,
    progress: bool = True,
) -> CachedDataset:
    """Write every item of a map-style ``dataset`` once into a store at ``path``, and return a Dataset with
    the same items that maps the store (later calls, runs and processes only map it) and that ``ct.run``
    reads a whole batch at a time.

    One process writes (a lock file beside ``path`` elects it: one per node for node-local storage, one in
    all for a shared path); the others wait for it, then map the store. The store holds ``.npy`` files and a
    JSON manifest, no pickle: opening one never runs code. It records the dataset's type and length (and
    ``key``) and a fingerprint of a few of its items (the first, middle and last, and five drawn by a fixed
    seed), compared at every open: a second open reads those items of the dataset, never iterates it. A store
    made from something else is refused, unless ``rebuild=True``. A path that holds anything but a store (a
    folder with a ``manifest.json`` of its own, a file, a mount point) is refused, and never replaced.

    Args:
        dataset: a map-style Dataset (``len`` and ``__getitem__``) whose items are deterministic: tensors,
            NumPy values, ints, floats and bools, in tuples, lists and dicts with string keys.
        path: the store's folder (created; its parent must exist; an empty folder there is replaced).
        augment: ``augment(batch, generator) -> batch``, applied to each batch read, never stored: ``batch`` as
            ``default_collate`` makes it, ``generator`` a CPU ``torch.Generator`` seeded from ``seed``, the epoch,
            the rank and the batch's indices (so resuming draws as the uninterrupted run). Draw only from it.
        rebuild: write the store again even when one is there.
        seed: the augmentation's seed.
        key: anything JSON can hold that describes how the items were made (a preprocessing config); a store
            written with another key is refused.
        verify: also compare every item of the store with the dataset's (calls ``__getitem__`` for every item).
        num_workers: loader workers reading the dataset while writing; "auto": by the time an item takes.
        timeout: seconds to wait for another process writing the store.
        progress: a progress bar, with its ETA, while writing.

    Returns:
        A ``CachedDataset``: ``cached[i]`` equals ``dataset[i]`` (types and values), ``cached.read_batch(indices)``
        equals ``default_collate`` of those items.

    Raises:
        ValueError: an argument out of range, an item that cannot be stored, a store made from something else,
            or a path that holds something else (never replaced).
        TypeError: an argument of the wrong kind, as ``ct.run`` refuses it (a dataset that is not map-style, a
            path that is not a str or PathLike, an ``augment`` that is not a function, a flag that is not True or
            False, a seed or ``num_workers`` that is not an int, a ``timeout`` that is not a number).
        RuntimeError (at a process's first read): the store was rebuilt or removed since it was opened.
        TimeoutError: another process held the store's lock longer than ``timeout``.
        OSError: the disk is full, or the path cannot take a renamed folder (nothing that looks complete is left).

    Example:
        >>> data = ct.cache(ImageFolderDecoded(root), "/tmp/digits.cache")  # doctest: +SKIP
        >>> ct.run(ct.distributed(ct.mixed_precision(step)), state, data, batch_size=256)  # doctest: +SKIP
    """
    check_bool(verify, CACHE, "verify")
    check_bool(progress, CACHE, "progress")
    path, seed, num_workers, timeout = _check(dataset, path, augment, rebuild, seed, key, num_workers, timeout)
    key = json.loads(json.dumps(key))  # as the manifest will hold it: tuples become lists, dict keys strings
    origin = {"type": f"{type(dataset).__module__}.{type(dataset).__qualname__}", "length": len(dataset), "key": key}
    started = time.time()
    if not rebuild:
        try:
            return _open(dataset, path, origin, augment, seed, verify)
        except FileNotFoundError:
            pass  # no store yet (or a writer is publishing it): take the lock
        except StoreError as e:
            raise StoreError(f"{CACHE}: {e}") from None  # its message says what to do
    with _locked(path, timeout) as waited:
        # another process rebuilt it while this one waited (a store dated later than now is not that)
        fresh = waited or started <= _created(path) <= time.time()
        if (path / MANIFEST).exists() and (not rebuild or fresh):
            try:
                return _open(dataset, path, origin, augment, seed, verify)
            except ValueError:
                if not rebuild:
                    raise
                # rebuild=True: the store another writer left is of something else; this one writes its own
        _write(dataset, path, {**origin, "created": time.time()}, num_workers, progress)
    return _open(dataset, path, origin, augment, seed, verify, written=True)


def _check(
    dataset: Any, path: Any, augment: Any, rebuild: Any, seed: Any, key: Any, workers: Any, timeout: Any
) -> tuple[Path, int, int | str, float]:
    """The arguments checked, before anything is read or written: the store's path, the seed, ``num_workers`` and
    the timeout as plain Python values."""
    if isinstance(dataset, IterableDataset):  # it may define __len__, and inherits a __getitem__ that raises
        raise TypeError(
            f"{CACHE}: dataset is an IterableDataset ({type(dataset).__name__}): ct.cache needs a "
            "map-style Dataset (items by index, __len__ and __getitem__); give a map-style dataset "
            "(a list of the items will do)"
        )
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(
            f"{CACHE}: dataset must be a map-style Dataset (with __len__ and __getitem__), got a "
            f"{type(dataset).__name__}; e.g. a torch Dataset, or a list of the items"
        )
    if isinstance(dataset, MappedDataset) and dataset.augment is not None:  # its items are drawn, not data
        raise ValueError(
            f"{CACHE}: the dataset augments its batches (made with augment=): its store would hold "
            "one draw for all epochs; make it without augment= and give augment= to ct.cache"
        )
    if augmented_inside(dataset):  # a Subset of one: its items are drawn too
        raise ValueError(
            f"{CACHE}: the dataset ({type(dataset).__name__}) wraps one that augments its batches "
            "(made with augment=): its store would hold one draw for all epochs; wrap the store made "
            "without augment=, and give augment= to ct.cache"
        )
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"{CACHE}: path must be a folder path (str or os.PathLike), got {show(path)}; e.g. '/tmp/digits.cache'"
        )
    if not str(path):
        raise ValueError(f"{CACHE}: path must be a folder path, got {show(path)}; e.g. '/tmp/digits.cache'")
    if augment is not None and not callable(augment):
        raise TypeError(
            f"{CACHE}: augment must be a function (batch, generator) -> batch, got {show(augment)}; or leave it out"
        )
    check_bool(rebuild, CACHE, "rebuild")
    seed = check_int(seed, CACHE, "seed", minimum=-(2**63), maximum=2**63 - 1, example="seed=0")
    if not (isinstance(workers, str) and workers == "auto"):
        workers = check_int(workers, CACHE, "num_workers", minimum=0, example="num_workers=2 or 'auto'")
    timeout = check_real(timeout, CACHE, "timeout", finite=False, example="timeout=3600.0 (seconds)")
    try:
        json.dumps(key, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError(
            f"{CACHE}: key must be something JSON can hold (str, finite numbers, lists, dicts), got {show(key)}; "
            "e.g. key={'resize': 256, 'crop': 224}"
        ) from None
    path = Path(os.path.realpath(path))  # a link to a folder on a larger disk: the store is written there
    if not path.parent.is_dir():
        raise ValueError(f"{CACHE}: the folder that holds the store, {path.parent}, does not exist; create it first")
    _check_place(path)
    check_replaceable(path, replacing=rebuild)
    if os.path.lexists(path) and os.path.ismount(path):
        check_renamable(path)  # refused now, before the lock file is made beside it
    return path, seed, workers, timeout


def _check_place(path: Path) -> None:
    """Refuse a store path that is (or holds) the working folder, which publishing renames away; or whose name
    leaves no room for the names made beside it (``.NAME.tmp-old-<12 hex digits>``, the longest, see ``_write``)."""
    try:
        here = Path(os.path.realpath(os.getcwd()))
    except FileNotFoundError:  # no working folder to lose
        here = None
    if here is not None and (path == here or path in here.parents):
        what = "is this process's working folder" if path == here else f"holds this process's working folder {here}"
        raise ValueError(
            f"{CACHE}: path {path} {what}: a store is published by renaming a folder into its place, which would "
            f"take the working folder away; give a folder for the store (e.g. {path / 'store'})"
        )
    try:
        most = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    size, longest = len(os.fsencode(path.name)), len(os.fsencode(f".{path.name}.tmp-old-{'0' * 12}"))
    if 0 < most < longest:
        raise ValueError(
            f"{CACHE}: path's name {path.name!r} is {size} bytes long, and ct.cache makes names {longest - size} "
            f"bytes longer beside it (.NAME.lock, .NAME.tmp-old-<12 hex digits>): past this file system's limit "
            f"of {most} bytes per name; give a name of at most {most - (longest - size)} bytes"
        )


def _created(path: Path) -> float:
    try:
        created = read_manifest(path)["origin"].get("created", 0.0)
    except (OSError, StoreError):
        return 0.0
    try:
        return float(created) if isinstance(created, int | float) else 0.0
    except OverflowError:  # an int past the floats: no date this call could have written
        return 0.0


def _open(
    dataset: Any, path: Path, origin: dict[str, Any], augment: Any, seed: int, verify: bool, written: bool = False
) -> CachedDataset:
    """The store at ``path``, checked to be complete, intact and made from ``dataset`` (its fingerprint compared,
    unless this process has just ``written`` it); FileNotFoundError if none, or if it was replaced meanwhile."""
    folder = _folder(path)
    try:
        manifest = read_manifest(path)
        made = manifest["origin"]
        differs = [
            f"{k}: the store has {made.get(k)!r}, the dataset {v!r}" for k, v in origin.items() if made.get(k) != v
        ]
        if manifest["length"] != origin["length"]:
            differs.append(f"items: the store holds {manifest['length']}")
        if differs:
            raise ValueError(
                f"{CACHE}: the store at {path} was made from something else ({'; '.join(differs)}); pass "
                "rebuild=True to write it again, or another path"
            )
        found = regions(path, manifest["item"], manifest["length"])
        stamps = {str(path / MANIFEST): stamp(path / MANIFEST), **{r.path: stamp(r.path) for r in found.values()}}
    except ValueError:
        if _folder(path) != folder:  # a rebuild renamed another store into place meanwhile: opened again
            raise FileNotFoundError(
                f"{CACHE}: the store at {path} was replaced while it was opened; {_AGAIN}"
            ) from None
        raise
    if folder is None or _folder(path) != folder:  # rebuilt between the manifest and the files: opened again
        raise FileNotFoundError(f"{CACHE}: the store at {path} was replaced while it was opened; {_AGAIN}")
    data = CachedDataset(found, manifest["item"], manifest["length"], augment=augment, seed=seed)
    if augment is not None and data.ragged:  # augment is given the stacked batch, which ragged items have not
        raise ValueError(
            f"{CACHE}: augment= is given, but the items of the store at {path} differ in shape (a ragged "
            "store: its batches need a collate_fn that pads, and an augmented batch is stacked "
            "first); pad the items in the dataset, or augment in the collate_fn (the store is kept: "
            "it opens without augment=)"
        )
    data.path, data.origin, data.stamps = path, made, stamps
    if verify:  # first: its message names the item that differs
        _verify(dataset, data)
    if not written:
        _compare(dataset, data)
    return data


def _folder(path: Path) -> tuple[int, ...] | None:
    """The folder at ``path`` (device, inode): a rebuild renames another one into place."""
    found = stamp(path)
    return None if found is None else found[:2]


def _compare(dataset: Any, data: CachedDataset) -> None:
    """The dataset's items that the store's fingerprint was made of against it (a handful of reads)."""
    n, recorded = len(data), data.origin.get("fingerprint")
    recorded = recorded if isinstance(recorded, dict) else {}
    sampled = recorded.get("items")
    if not (
        isinstance(sampled, list)
        and len(sampled) <= _MOST
        and all(type(i) is int for i in sampled)
        and sampled == sorted(set(sampled))
        and (not sampled or (sampled[0] >= 0 and sampled[-1] < n))
        and (not n or {0, n // 2, n - 1} <= set(sampled))
        and isinstance(recorded.get("blake2b"), str)
    ):
        raise StoreError(f"{data.path / MANIFEST}: its fingerprint of the items is missing or malformed; {REWRITE}")
    items = {i: copy.deepcopy(dataset[i]) for i in sampled}  # as read: one buffer may be filled anew at each read
    if sampled and fingerprint(items[i] for i in sampled) != recorded.get("blake2b"):
        raise ValueError(
            f"{CACHE}: items {sampled} of the dataset differ from those the store at {data.path} was "
            "made from (the fingerprint it recorded): pass rebuild=True to write it again"
        )
    # the store's own items there too: a manifest or array altered since it was written (same names, dtypes and
    # shapes) passes every other check, and would be served as the dataset's items
    from composetrain.data.equal import same_item

    stored = _plain(data).__getitems__(sampled)  # mapped by a copy: this one maps at its first read, as before
    if not all(same_item(s, items[i]) for i, s in zip(sampled, stored, strict=True)):
        raise StoreError(
            f"items {sampled} of the store at {data.path} differ from the dataset's, which match the "
            "fingerprint it recorded: its files were altered since it was written; "
            f"{REWRITE}"
        )


def _plain(data: CachedDataset) -> CachedDataset:
    """A copy of ``data`` that reads its items as stored (never augmented), with its own maps."""
    plain = CachedDataset(data.regions, data.item, data.length)
    plain.path, plain.origin, plain.stamps = data.path, data.origin, data.stamps
    return plain


def _verify(dataset: Any, data: CachedDataset) -> None:
    """Every item of the store against the dataset's, a batch of reads of the store at a time."""
    from composetrain.data.equal import same_item

    plain = _plain(data)
    for start in range(0, len(data), 256):
        indices = list(range(start, min(start + 256, len(data))))
        for i, stored in zip(indices, plain.__getitems__(indices), strict=True):
            if not same_item(stored, dataset[i]):
                raise ValueError(
                    f"{CACHE}: item {i} of the store at {data.path} differs from the dataset's: pass "
                    "rebuild=True to write it again"
                )


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[bool]:
    """Hold the lock file beside ``path`` (an flock: released when its holder dies); yields whether it waited."""
    lock = path.parent / f".{path.name}.lock"
    check_lock_file(lock)
    fd, created = _open_lock(lock)
    try:
        check_lock_file(lock, os.fstat(fd).st_mode)
        # a file this call did not make is written into only when it holds what a holder wrote (never a user's)
        writable = created or check_lock_owner(lock, fd)
        deadline, waited = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = True
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                    raise TimeoutError(
                        f"{CACHE}: waited {timeout:g} s for {holder} to write {path} (lock {lock}); raise timeout=, "
                        "or remove the store if its writer is gone"
                    ) from None
                time.sleep(0.05)
        if writable:  # who holds it, for waiters' messages; a full disk fails the write itself
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield waited
    finally:
        os.close(fd)  # releases the lock


def _open_lock(lock: Path) -> tuple[int, bool]:
    """The lock file opened for reading and writing, and whether this call created it (O_EXCL: an existing file,
    a user's perhaps, is only opened, never truncated)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
    while True:
        try:
            try:
                return os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                pass
            try:
                return os.open(lock, flags), False
            except FileNotFoundError:
                continue  # removed since: made again
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR):  # made a link or a folder since the check
                check_lock_file(lock)
            if (error := disk_error(lock, e)) is not None:
                raise error from e
            raise


def _write(dataset: Any, path: Path, origin: dict[str, Any], workers: Any, progress: bool) -> None:
    """Write into a temporary folder beside ``path`` and rename it into place; on any failure remove it."""
    for stale in leftovers(path):  # left by a writer that died: this one holds the lock
        remove_store(stale, temporary=True)
    check_replaceable(path)
    check_renamable(path)  # before any item is read: a mount point would fail only once all is written
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    old = path.parent / f".{path.name}.tmp-old-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir()
    except OSError as e:
        if (error := disk_error(path, e)) is not None:
            raise error from e
        raise
    try:
        tick = time.perf_counter()
        write_store(dataset, tmp, origin, workers, f"{CACHE}: writing {path.name}" if progress else None)
        size = sum(f.stat().st_size for f in tmp.iterdir())
        if progress:
            seconds = time.perf_counter() - tick
            print(
                f"{CACHE}: wrote {size / 1e6:.1f} MB to {path} in {seconds:.1f} s "
                f"({size / 1e6 / max(seconds, 1e-9):.0f} MB/s)",
                file=sys.stderr,
            )
        check_replaceable(path)  # again: what is there now is what is renamed away
        try:
            if path.exists() or path.is_symlink():
                os.rename(path, old)  # a rebuild: the new store replaces it whole
        except OSError as e:
            raise publish_error(path, e) from e
        os.rename(tmp, path)
        fsync_folder(path.parent)
        remove_store(old)  # its own files only: checked to hold nothing else, and nothing else is ever removed
        if os.path.lexists(old):  # a file put there between the check and the rename: kept, and said
            warnings.warn(
                f"{CACHE}: {path} held files that are not the store's when it was replaced "
                f"({', '.join(os.listdir(old))}): they were kept in {old}",
                stacklevel=3,
            )
    except BaseException as e:
        remove_store(tmp, temporary=True)
        if os.path.lexists(old) and not os.path.lexists(path):  # renamed away, then not replaced: put it back
            with contextlib.suppress(OSError):
                os.rename(old, path)
        if isinstance(e, OSError) and e.errno in FULL and (error := disk_error(path, e)) is not None:
            raise error from e
        raise

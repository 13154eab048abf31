"""The third data adversary's round: ct.cache, ct.hdf5 and ct.run's loader over them, given hostile, odd and broken
inputs; every result checked against the items the dataset itself returns (read by a plain loop) or h5py's read.

The first tests are the findings: each fails on the code it was written against (a wrong item or batch served, a
user's file overwritten, a bare exception, an epoch silently cut short). The rest are odd inputs that are handled
correctly now, kept as regression tests.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import socket
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import IN, classify, make_state
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, default_collate, random_split

import composetrain as ct
from composetrain.data.equal import same_item
from composetrain.data.files import MANIFEST, StoreError, write_manifest
from composetrain.data.writer import fingerprint, sampled

h5py = pytest.importorskip("h5py")


class Items(Dataset[Any]):
    """The items of a list, as a map-style Dataset (a type of this module: stores record it)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def _rows(n: int = 12, seed: int = 0) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(IN, dtype=torch.float64, generator=g), i % 3) for i in range(n)]


def _all_equal(cached: Any, items: list[Any]) -> bool:
    """Every item read back (one by one and with one ``__getitems__``) the same as the dataset's."""
    together = cached.__getitems__(list(range(len(items))))
    return all(same_item(cached[i], x) and same_item(together[i], x) for i, x in enumerate(items))


def _seen(data: Any, epochs: int = 1, **options: Any) -> list[Any]:
    """The batches ct.run hands the step, in order."""
    seen: list[Any] = []

    def record(model: Any, batch: Any) -> Any:
        seen.append(batch)
        return classify(model, batch)

    if not isinstance(data, DataLoader):
        options = {"batch_size": 4, "shuffle": False, "num_workers": 0, **options}
    ct.run(ct.train_step(record), make_state(), data, epochs=epochs, progress=False, **options)
    return seen


def _same_batches(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(same_item(x, y) for x, y in zip(a, b, strict=True))


def _h5(path: Path, tid: Any, data: np.ndarray, memtype: Any) -> Path:
    """A file with one contiguous dataset "x" of the HDF5 type ``tid``, written from ``data`` in ``memtype``."""
    with h5py.File(path, "w") as f:
        dset = h5py.h5d.create(f.id, b"x", tid, h5py.h5s.create_simple((len(data),)))
        dset.write(h5py.h5s.ALL, h5py.h5s.ALL, data, mtype=memtype)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Findings (each fails on the code this round attacked)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "items",
    [
        [(torch.tensor([1.0]), []), (torch.tensor([2.0]), {}), (torch.tensor([3.0]), ())],
        [[torch.tensor([1.0]), (torch.tensor(1),)], [torch.tensor([2.0]), [torch.tensor(2)]]],
    ],
    ids=["empty containers of other types", "a tuple in item 0, a list in item 1"],
)
def test_items_whose_containers_differ_are_refused_or_come_back_as_they_were(tmp_path: Path, items: Any) -> None:
    """FINDING (wrong item served): the writer compares items by their leaves' paths only, which a tuple and a
    list (or empty containers of any type) share: the store serves item 0's containers for every item."""
    try:
        cached = ct.cache(Items(items), tmp_path / "store", progress=False)
    except ValueError as e:  # refused as items of another structure: as good
        assert "cache: item 1" in str(e)
        return
    assert _all_equal(cached, items)


@pytest.mark.parametrize(
    "indices",
    [np.array([2**64 - 1], dtype=np.uint64), np.array([0, 2**64 - 3], dtype=np.uint64),
     torch.tensor([2**64 - 1], dtype=torch.uint64), torch.tensor(2**64 - 2, dtype=torch.uint64)],
    ids=["numpy uint64", "numpy uint64 with a valid one", "torch uint64", "0-dim torch uint64"],
)  # fmt: skip
@pytest.mark.parametrize("augmented", [False, True])
def test_an_unsigned_index_past_the_end_is_an_index_error_not_an_item_from_the_end(
    tmp_path: Path, indices: Any, augmented: bool
) -> None:
    """FINDING (wrong rows served): ``read_batch`` casts unsigned 64-bit indices to int64, so 2**64 - 1 reads as -1:
    the last item, where ``__getitems__`` of the same indices (and a list) says out of range."""
    augment = (lambda batch, generator: batch) if augmented else None
    cached = ct.cache(Items([torch.tensor([float(i)]) for i in range(5)]), tmp_path / "s", augment=augment,
                      progress=False)  # fmt: skip
    with pytest.raises(IndexError, match="out of range"):
        cached.read_batch(indices)


@pytest.mark.parametrize(
    "read",
    [lambda c: c.read_batch([np.uint64(2**64 - 1)]), lambda c: c.read_batch([2**64 - 1]),
     lambda c: c[torch.tensor(2**64 - 1, dtype=torch.uint64)],
     lambda c: c.__getitems__(torch.tensor([2**64 - 1], dtype=torch.uint64))],
    ids=["list of numpy uint64", "a Python int past int64", "0-dim uint64 tensor", "uint64 tensor to getitems"],
)  # fmt: skip
def test_an_index_past_int64_is_an_index_error_naming_it(tmp_path: Path, read: Any) -> None:
    """FINDING (bare exception): TypeError "an integer is required", ValueError "Overflow when unpacking long long",
    RuntimeError "value cannot be converted to type int64_t without overflow", none naming the dataset or index."""
    cached = ct.cache(Items([torch.tensor([float(i)]) for i in range(5)]), tmp_path / "s", progress=False)
    with pytest.raises(IndexError, match="CachedDataset"):
        read(cached)


def test_a_manifest_of_another_tool_with_a_huge_integer_is_named_and_never_replaced(tmp_path: Path) -> None:
    """FINDING (bare exception; a non-cache manifest taken for a damaged store): json's 4300-digit limit raises a
    plain ValueError, which ``read_manifest`` does not turn into NotAStore; ``check_replaceable`` then takes the
    folder for a damaged store, and only a second bare ValueError in ``_created`` stops rebuild=True replacing it."""
    folder = tmp_path / "export"
    folder.mkdir()
    text = '{"version": ' + "9" * 5000 + "}"
    (folder / MANIFEST).write_text(text)
    for rebuild in (False, True):
        with pytest.raises(ValueError, match=r"cache: .*export.* not a cache store"):
            ct.cache(Items(_rows()), folder, rebuild=rebuild, progress=False)
        assert (folder / MANIFEST).read_text() == text and os.listdir(folder) == [MANIFEST]


def test_an_array_file_that_is_a_folder_is_refused_as_a_store_error(tmp_path: Path) -> None:
    """FINDING (bare exception): ``_region`` opens a folder named ``f0.npy`` (O_RDONLY opens folders) and
    ``os.fdopen`` raises IsADirectoryError "[Errno 21] Is a directory: 3", naming a file descriptor."""
    path = tmp_path / "store"
    ct.cache(Items(_rows()), path, progress=False)
    (path / "f0.npy").unlink()
    (path / "f0.npy").mkdir()
    with pytest.raises(StoreError, match=r"cache: .*f0\.npy"):
        ct.cache(Items(_rows()), path, progress=False)


def test_a_store_dated_past_the_floats_is_rebuilt_on_request(tmp_path: Path) -> None:
    """FINDING (bare exception): a manifest whose "created" is an int too large for a float opens, but
    rebuild=True dies in ``_created`` with OverflowError "int too large to convert to float"."""
    path = tmp_path / "store"
    ct.cache(Items(_rows()), path, progress=False)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["origin"]["created"] = 10**400
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert _all_equal(ct.cache(Items(_rows()), path, progress=False), _rows())  # it opens
    rebuilt = ct.cache(Items(_rows(seed=1)), path, rebuild=True, progress=False)
    assert _all_equal(rebuilt, _rows(seed=1))


@pytest.mark.parametrize("how", ["a file of the user's", "a hard link to a file of the user's"])
def test_a_file_at_the_lock_files_path_is_never_overwritten(tmp_path: Path, how: str) -> None:
    """FINDING (a user's file overwritten): the lock file ``.NAME.lock`` beside the store is opened without O_EXCL
    and then truncated and written with "process N on HOST"; a file the user has there (or a hard link to one,
    which the regular-file check lets through) loses its contents."""
    mine = tmp_path / ("notes.txt" if "link" in how else ".store.lock")
    mine.write_text("my notes\n")
    if "link" in how:
        os.link(mine, tmp_path / ".store.lock")
    try:
        ct.cache(Items(_rows()), tmp_path / "store", progress=False)
    except ValueError as e:  # refused, naming the file: as good
        assert ".store.lock" in str(e)
    assert mine.read_text() == "my notes\n"


def test_rebuild_never_removes_a_users_array_named_like_one_the_store_does_not_have(tmp_path: Path) -> None:
    """FINDING (a user's files deleted): "the store's own files" are matched by name (``f<n>[os].npy``), not by
    the arrays its manifest names: a store of two fields (f0.npy, f1.npy) with the user's ``f7.npy`` and
    ``f0s.npy`` saved into it is replaced by rebuild=True, and both are deleted."""
    path, items = tmp_path / "store", _rows()
    ct.cache(Items(items), path, progress=False)
    np.save(path / "f7.npy", np.arange(1000))  # an array of the user's ("f" for features), saved into the folder
    (path / "f0s.npy").write_bytes(b"mine")
    try:
        ct.cache(Items(_rows(seed=1)), path, rebuild=True, progress=False)
    except ValueError as e:  # refused, naming them: as good
        assert "f7.npy" in str(e) and "f0s.npy" in str(e)
    kept = [p for p in tmp_path.rglob("f7.npy")] + [p for p in tmp_path.rglob("f0s.npy")]
    assert len(kept) == 2 and kept[1].read_bytes() == b"mine"
    assert np.array_equal(np.load(kept[0]), np.arange(1000))


@pytest.mark.parametrize("length", [238, 250, 255])
def test_a_store_name_too_long_for_the_files_beside_it_is_refused_before_anything_is_made(
    tmp_path: Path, length: int
) -> None:
    """FINDING (bare exception, a file left): a name of 238 to 255 bytes is a valid folder name, but ``.NAME.lock``
    and ``.NAME.tmp-old-<hex>`` are not: a bare OSError "[Errno 36] File name too long" naming a file the user
    never gave, after the lock file was made (238 to 244 bytes)."""
    with pytest.raises(ValueError, match=r"cache: .*(long|255)"):
        ct.cache(Items(_rows()), tmp_path / ("x" * length), progress=False)
    assert os.listdir(tmp_path) == []


def test_caching_into_the_working_folder_leaves_the_process_a_working_folder(tmp_path: Path, monkeypatch: Any) -> None:
    """FINDING (the process's working folder removed): ``ct.cache(data, ".")`` in an empty working folder renames
    that folder away and removes it (the store is renamed into its place): os.getcwd() then raises
    FileNotFoundError, and every relative path after it (a checkpoint_dir="runs") fails."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    try:
        ct.cache(Items(_rows()), ".", progress=False)
    except ValueError as e:  # refused, naming the working folder: as good
        assert "cache:" in str(e)
    assert os.getcwd() == str(tmp_path / "work")  # FileNotFoundError: the folder was removed


class _Empties(Dataset[Any]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return ()


def test_opening_a_store_takes_memory_independent_of_its_length(tmp_path: Path) -> None:
    """FINDING (memory and time linear in the length at every open): ``_compare`` checks the fingerprint's item
    numbers with ``set(sampled) <= set(range(n))``, a set of every index: about 60 GB and a minute for a store of
    10**9 items, in every process at every open. (The store is the one ``write_store`` makes for items ``()``,
    written here from its parts: writing 10**6 items takes seconds.)"""
    n, path = 10**6, tmp_path / "store"
    path.mkdir()
    kept = sampled(n)
    origin = {"type": f"{__name__}._Empties", "length": n, "key": None, "created": 1.0,
              "fingerprint": {"items": kept, "blake2b": fingerprint(() for _ in kept)}}  # fmt: skip
    write_manifest(path, (), n, origin)
    ct.cache(_Empties(10), tmp_path / "warm", progress=False)  # imports and first calls, outside the count
    tracemalloc.start()
    try:
        cached = ct.cache(_Empties(n), path, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(cached) == n and cached[n - 1] == ()
    assert peak < 8 << 20, f"opening a store of {n} items took {peak / 2**20:.0f} MiB"


class _StopsAt(Dataset[Any]):
    """A dataset whose item 13 raises StopIteration (as ``next()`` on an exhausted iterator inside it would)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> Any:
        if i == 13:
            raise StopIteration
        return torch.full((IN,), float(i), dtype=torch.float64), i % 3


def test_a_stopiteration_in_a_loader_worker_is_an_error_not_the_end_of_the_epoch() -> None:
    """FINDING (batches silently dropped): ct.run's loader reads by a DataLoader with workers, which re-raises a
    worker's StopIteration in this process, where ``next(batches, _END)`` takes it for the end of the epoch: the
    run trains on 3 of its 5 batches and reports success. In this process the same dataset is a RuntimeError
    ("generator raised StopIteration"); under num_workers="auto" which one happens depends on timing."""
    for workers in (0, 1):
        try:
            seen = _seen(_StopsAt(), num_workers=workers)
        except Exception as e:  # the fix chooses the type; it must say why
            assert "StopIteration" in f"{type(e).__name__}: {e}", e
        else:
            raise AssertionError(f"num_workers={workers}: the epoch ended after {len(seen)} of 5 batches, no error")


def test_a_stopiteration_while_a_store_is_written_by_workers_is_named(tmp_path: Path) -> None:
    """FINDING (bare exception): ct.cache's writer reads by a DataLoader with workers, which stops at item 13's
    StopIteration; the writer then fails on its own bookkeeping: AssertionError ((20, 5), 65) for fixed shapes,
    "cannot reshape array" for ragged ones, and under ``python -O`` "an item is a NoneType"."""
    with pytest.raises(ValueError, match=r"cache: .*13"):
        ct.cache(_StopsAt(), tmp_path / "store", num_workers=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == [".store.lock"]


def test_writing_with_loader_workers_leaves_the_global_random_state_alone(tmp_path: Path) -> None:
    """FINDING (a seeded script not reproducible): the writer's DataLoader has no generator of its own, so starting
    its workers draws their base seed from the global torch generator. Whether ct.cache writes with workers
    (num_workers="auto": by timing) or only opens an existing store decides what a seeded script draws next:
    its model is initialised differently on the run that wrote the store."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    ct.cache(Items(_rows(30)), tmp_path / "store", num_workers=1, progress=False)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    ("tid", "values", "memtype"),
    [
        ("bool enum over int32", (np.arange(10) % 3 == 0).astype(np.int32), "NATIVE_INT32"),
        ("12-bit signed", -np.arange(1, 11, dtype=np.int16) * 100, "NATIVE_INT16"),
        ("16 bits at offset 8 of int32", np.arange(1, 11, dtype=np.int32) * 3, "NATIVE_INT32"),
        ("12-bit unsigned padded with ones", np.arange(1, 11, dtype=np.uint16) * 100, "NATIVE_UINT16"),
    ],
)
def test_a_contiguous_dataset_of_a_type_numpy_does_not_lay_out_reads_as_h5py_reads_it(
    tmp_path: Path, tid: str, values: np.ndarray, memtype: str
) -> None:
    """FINDING (wrong values served): ``flat_offset`` maps any contiguous unfiltered dataset and reads its bytes as
    ``dset.dtype``, but h5py converts from the file's type: a boolean enum over a C int (h5py: bool; the map reads
    the first bytes of the ints as booleans), integers of fewer bits than their size, at a bit offset, or padded
    with ones. h5py reads [True, False, False, True, ...], the map [True, False, False, False, ...]; -100 as 3996.
    The fix: map only where ``dset.id.get_type().equal(h5py.h5t.py_create(dset.dtype, logical=True))``."""
    if tid == "bool enum over int32":
        t = h5py.h5t.enum_create(h5py.h5t.NATIVE_INT32)
        t.enum_insert(b"FALSE", 0)
        t.enum_insert(b"TRUE", 1)
    elif tid == "12-bit signed":
        t = h5py.h5t.STD_I16LE.copy()
        t.set_precision(12)
    elif tid == "16 bits at offset 8 of int32":
        t = h5py.h5t.STD_I32LE.copy()
        t.set_precision(16)
        t.set_offset(8)
    else:
        t = h5py.h5t.STD_U16LE.copy()
        t.set_precision(12)
        t.set_pad(h5py.h5t.PAD_ONE, h5py.h5t.PAD_ONE)
    path = _h5(tmp_path / "odd.h5", t, values, getattr(h5py.h5t, memtype))
    with h5py.File(path, "r") as f:
        want = f["x"][()]
    data = ct.hdf5(path, "x")
    order = [9, 0, 3, 3, 5]
    assert np.array_equal(data.read_batch(order).numpy(), want[order])
    assert all(np.array_equal(data[i].numpy(), want[i]) for i in range(len(want)))


def _fail_on(monkeypatch: Any, what: str, err: int) -> None:
    """``os.open`` of the lock file, or the mkdir of the temporary folder, fails with ``err``."""
    if what == "lock":
        real = os.open

        def fake_open(path: Any, *a: Any, **k: Any) -> int:
            if str(path).endswith(".lock"):
                raise OSError(err, os.strerror(err), str(path))
            return real(path, *a, **k)

        monkeypatch.setattr(os, "open", fake_open)
    else:
        real_mkdir = pathlib.Path.mkdir

        def fake_mkdir(self: Path, *a: Any, **k: Any) -> None:
            if ".tmp-" in self.name:
                raise OSError(err, os.strerror(err), str(self))
            real_mkdir(self, *a, **k)

        monkeypatch.setattr(pathlib.Path, "mkdir", fake_mkdir)


@pytest.mark.parametrize(("what", "err"), [("lock", errno.ENOSPC), ("temporary folder", errno.ENOSPC),
                                           ("lock", errno.EROFS), ("lock", errno.EACCES)])  # fmt: skip
def test_a_full_or_read_only_disk_before_the_first_item_is_a_cache_error_with_the_fix(
    tmp_path: Path, monkeypatch: Any, what: str, err: int
) -> None:
    """FINDING (bare exception): a disk out of space or inodes, read-only, or not writable fails at the lock file
    or the temporary folder with a raw OSError naming ``.store.lock`` / ``.store.tmp-<hex>`` (files the user never
    named), without "cache:" or the fix the same failure gets one item later ("free space, or give a path on a
    larger disk"). Seen for real on a tmpfs mounted read-only and on one with nr_inodes=4."""
    _fail_on(monkeypatch, what, err)
    with pytest.raises(OSError, match=r"^(\[Errno \d+\] )?cache: .*store") as e:
        ct.cache(Items(_rows()), tmp_path / "store", progress=False)
    assert e.value.errno == err


# ---------------------------------------------------------------------------------------------------------------
# Odd inputs handled correctly now (regression tests)
# ---------------------------------------------------------------------------------------------------------------

_TENSOR_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.int32,
    torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
    torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip
_NUMPY_DTYPES = ["?", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "c8", "c16"]


def _odd_item(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    bits = torch.randint(0, 256, (2, 48), generator=g, dtype=torch.uint8)
    item: dict[str, Any] = {}
    for dt in _TENSOR_DTYPES:  # random bytes viewed as each dtype: NaN payloads, -0.0, subnormals, edges
        size = torch.empty(0, dtype=dt).element_size()
        item[f"t {dt}"] = bits[:, : 48 // size * size].contiguous().view(dt)
    for dt in _NUMPY_DTYPES:
        a = bits.numpy().reshape(-1)[: 48 // np.dtype(dt).itemsize * np.dtype(dt).itemsize]
        item[f"np {dt}"] = a.view(dt).copy() if dt != "?" else a.astype(bool)
        item[f"npscalar {dt}"] = item[f"np {dt}"][0]
    item["0-d"] = torch.tensor(float(i))
    item["empty"] = torch.empty(0, 3)
    item["numpy 0-d"] = np.array(i, dtype=np.int16)
    item["python"] = [2**63 - 1, -(2**63), True, -0.0, float("nan"), float("inf"), i]
    item["non-contiguous"] = torch.arange(12.0).reshape(3, 4).t() + i
    item["strange keys"] = {"a\nb": 1, "[0]": 2.0, "": False, "é😀": torch.ones(1)}
    return item


def test_items_of_every_dtype_come_back_bit_for_bit_and_batches_as_default_collate_makes_them(tmp_path: Path) -> None:
    items = [_odd_item(i) for i in range(5)]
    cached = ct.cache(Items(items), tmp_path / "store", progress=False)
    assert _all_equal(cached, items)
    ct.cache(Items(items), tmp_path / "store", verify=True, progress=False)
    collatable = [{k: v for k, v in x.items() if k != "npscalar u8"} for x in items]  # torch cannot collate those
    batch = cached.read_batch([4, 0, 2])
    want = default_collate([collatable[i] for i in (4, 0, 2)])
    assert same_item({k: v for k, v in batch.items() if k in want}, want)


@pytest.mark.parametrize("name", ["a\nb", "é😀", "s[1]*?", "bad\udcff", "-rf", " lead", "x" * 230])
def test_odd_store_names_are_written_and_opened_again(tmp_path: Path, name: str) -> None:
    items = _rows()
    assert _all_equal(ct.cache(Items(items), tmp_path / name, progress=False), items)
    assert _all_equal(ct.cache(Items(items), tmp_path / name, progress=False), items)


def test_paths_that_are_not_stores_are_refused_and_left_as_they_were(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "afile").write_text("x")
    os.symlink("/", tmp_path / "root")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    (tmp_path / "d" / "inner").mkdir(parents=True)
    (tmp_path / "d" / "keep.txt").write_text("mine")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path / "d" / "inner")
    for path in [tmp_path / "afile", tmp_path / "root", tmp_path / "loop", "..", tmp_path / "d" / "keep.txt"]:
        for rebuild in (False, True):
            with pytest.raises(ValueError, match="cache: "):
                ct.cache(Items(_rows()), path, rebuild=rebuild, progress=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "afile").read_text() == "x" and (tmp_path / "d" / "keep.txt").read_text() == "mine"


def test_a_link_to_nowhere_writes_the_store_where_it_points(tmp_path: Path) -> None:
    os.symlink(tmp_path / "target", tmp_path / "dangling")
    items = _rows()
    ct.cache(Items(items), tmp_path / "dangling", progress=False)
    assert (tmp_path / "dangling").is_symlink() and _all_equal(
        ct.cache(Items(items), tmp_path / "target", progress=False), items
    )


def _edit_manifest(change: Any) -> Any:
    def damage(path: Path) -> None:
        manifest = json.loads((path / MANIFEST).read_text())
        change(manifest)
        (path / MANIFEST).write_text(json.dumps(manifest))

    return damage


def _field(n: int, key: str, value: Any) -> Any:
    return _edit_manifest(lambda m: m["item"]["tuple"][n]["field"].__setitem__(key, value))


def _npy(path: Path, old: bytes, new: bytes) -> None:
    data = (path / "f0.npy").read_bytes()
    (path / "f0.npy").write_bytes(data.replace(old, new, 1))


def _extend(path: Path) -> None:
    with open(path / "f0.npy", "ab") as f:
        f.write(b"\0" * 8)


def _swap(path: Path) -> None:
    os.rename(path / "f1.npy", path / "t")
    os.rename(path / "f0.npy", path / "f1.npy")
    os.rename(path / "t", path / "f0.npy")


def _socket(path: Path) -> None:
    (path / "f1.npy").unlink()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path / "f1.npy"))


@pytest.mark.parametrize(
    ("damage", "replaced"),
    [
        (_field(0, "dtype", ">f8"), True),  # a big-endian dtype NumPy accepts: not the file's
        (_field(0, "dtype", "__class__"), True),
        (_field(0, "dtype", "bits8"), True),
        (_field(1, "data", "f0"), True),  # two fields naming one array
        (_field(1, "kind", "float"), True),
        (_edit_manifest(lambda m: m.update(length=2**70)), True),
        (_edit_manifest(lambda m: m.update(format=2**80)), True),
        (_edit_manifest(lambda m: m["origin"]["fingerprint"].update(items=[0, 6, 11, 2**80])), True),
        (
            _edit_manifest(
                lambda m: m.update(item={"dict": [["a", m["item"]["tuple"][0]], ["a", m["item"]["tuple"][1]]]})
            ),
            True,
        ),
        (lambda p: _npy(p, b"'shape': (12, 5)", b"'shape': (3*4, 5)"), True),
        (lambda p: _npy(p, b"\x93NUMPY\x01\x00\xf6\x00", b"\x93NUMPY\x01\x00\x60\xea"), True),  # header length
        (lambda p: _npy(p, b"", b"\0" * 8), True),  # 8 bytes in front: no .npy magic
        (_extend, True),  # 8 bytes at the end: a size the header does not say
        (_swap, True),
        (_socket, False),  # never removed: not the store's own kind of file
        (lambda p: ((p / MANIFEST).unlink(), (p / MANIFEST).mkdir()), False),
        (lambda p: (p / MANIFEST).write_text("[" * 100000 + "]" * 100000), False),
    ],
)
def test_a_damaged_or_crafted_store_is_refused_and_rebuilt_only_where_it_is_ct_caches(
    tmp_path: Path, damage: Any, replaced: bool
) -> None:
    path, items = tmp_path / "store", _rows()
    ct.cache(Items(items), path, progress=False)
    damage(path)
    with pytest.raises(ValueError, match="cache: "):
        ct.cache(Items(items), path, progress=False)
    if replaced:
        assert _all_equal(ct.cache(Items(items), path, rebuild=True, progress=False), items)
    else:
        with pytest.raises(ValueError, match="cache: "):
            ct.cache(Items(items), path, rebuild=True, progress=False)


def _killed_at(call: int, path: Path, items: list[Any], rebuild: bool) -> bool:
    """ct.cache in a forked child that SIGKILLs itself before its ``call``-th rename, unlink, rmdir, fsync or mkdir;
    whether it was killed (else it finished)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            count = [0]

            def killing(real: Any) -> Any:
                def wrapped(*a: Any, **k: Any) -> Any:
                    count[0] += 1
                    if count[0] == call:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*a, **k)

                return wrapped

            for name in ("rename", "unlink", "rmdir", "fsync", "mkdir"):
                setattr(os, name, killing(getattr(os, name)))
            ct.cache(Items(items), path, rebuild=rebuild, num_workers=0, progress=False)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


@pytest.mark.parametrize("scenario", ["first write", "rebuild of another dataset's store", "into an empty folder"])
def test_a_writer_killed_at_any_file_operation_leaves_no_wrong_store_and_no_users_file_touched(
    tmp_path: Path, scenario: str
) -> None:
    old, new = _rows(6, seed=0), _rows(6, seed=1)
    for call in range(1, 40):
        folder = tmp_path / str(call)
        folder.mkdir()
        path = folder / "store"
        (folder / "user.txt").write_text("mine")
        if scenario.startswith("rebuild"):
            ct.cache(Items(old), path, progress=False)
        elif scenario == "into an empty folder":
            path.mkdir()
        killed = _killed_at(call, path, new, rebuild=scenario.startswith("rebuild"))
        assert (folder / "user.txt").read_text() == "mine"
        if path.exists() and os.listdir(path):  # a store, complete: the old one or the new one, never a mix
            opened = [ct.cache(Items(x), path, verify=True, progress=False) for x in (old, new) if _opens(x, path)]
            assert len(opened) == 1, f"killed at call {call}: the store at the path is neither whole store"
        again = ct.cache(Items(new), path, rebuild=True, progress=False)
        assert _all_equal(again, new)
        left = sorted(n for n in os.listdir(folder) if n not in ("store", ".store.lock", "user.txt"))
        assert left in ([], [".store.tmp-probe"]), left  # an empty folder of the user's, probed, is all
        if not killed:
            assert call > 5
            return
    raise AssertionError("the writer was still being killed at its 40th file operation")


def _opens(items: list[Any], path: Path) -> bool:
    try:
        ct.cache(Items(items), path, verify=True, progress=False)
    except ValueError:
        return False
    return True


def test_a_dataset_that_raises_while_a_store_is_rebuilt_leaves_the_old_store_whole(tmp_path: Path) -> None:
    class Breaks(Items):
        def __getitem__(self, i: int) -> Any:
            if i == 9:
                raise KeyError("decoder broke")
            return super().__getitem__(i)

    path, old = tmp_path / "store", _rows()
    ct.cache(Items(old), path, progress=False)
    with pytest.raises(KeyError, match="decoder broke"):
        ct.cache(Breaks(_rows(seed=1)), path, rebuild=True, progress=False)
    assert _all_equal(ct.cache(Items(old), path, verify=True, progress=False), old)
    assert sorted(os.listdir(tmp_path)) == [".store.lock", "store"]


def test_two_writers_of_other_keys_at_once_leave_one_whole_store_and_refuse_the_other(tmp_path: Path) -> None:
    path, items = tmp_path / "store", _rows(40)
    pid = os.fork()
    if pid == 0:
        try:
            ct.cache(Items(items), path, key="child", num_workers=0, progress=False)
        finally:
            os._exit(0)
    try:
        mine = ct.cache(Items(items), path, key="parent", num_workers=0, progress=False)
    except ValueError as e:
        assert "key" in str(e)
        mine = None
    os.waitpid(pid, 0)
    key = json.loads((path / MANIFEST).read_text())["origin"]["key"]
    assert key in ("child", "parent") and (mine is None) == (key == "child")
    assert _all_equal(ct.cache(Items(items), path, key=key, verify=True, progress=False), items)
    assert sorted(os.listdir(tmp_path)) == [".store.lock", "store"]


@pytest.mark.parametrize("workers", [0, 2, "auto"])
def test_runs_over_wrappers_of_a_store_see_the_batches_of_the_same_wrappers_of_the_dataset(
    tmp_path: Path, workers: Any
) -> None:
    items = _rows(22)
    cached = ct.cache(Items(items), tmp_path / "store", progress=False)
    picks = [5, 3, 21, 0, 7, 7, 2, 9, -1]
    wraps = [
        lambda d: d,
        lambda d: Subset(d, picks),
        lambda d: ConcatDataset([d, Items(items)]),
        lambda d: ConcatDataset([d, d]),
        lambda d: random_split(d, [0.5, 0.5], torch.Generator().manual_seed(1))[1],
    ]
    for wrap in wraps:
        assert _same_batches(_seen(wrap(cached), num_workers=workers, shuffle=True),
                             _seen(wrap(Items(items)), num_workers=workers, shuffle=True))  # fmt: skip


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_a_dataloader_with_workers_over_a_store_gives_the_datasets_batches(tmp_path: Path, context: str) -> None:
    items = _rows(14)
    cached = ct.cache(Items(items), tmp_path / "store", progress=False)
    got = list(DataLoader(cached, batch_size=4, num_workers=1, multiprocessing_context=context))
    assert _same_batches(got, [default_collate(items[s : s + 4]) for s in range(0, 14, 4)])
    augmented = ct.cache(Items(items), tmp_path / "store", augment=lambda b, g: b, progress=False)
    if context == "fork":  # a lambda does not pickle to a spawned worker
        got = list(DataLoader(augmented, batch_size=4, num_workers=1, multiprocessing_context=context))
        assert _same_batches(got, [default_collate(items[s : s + 4]) for s in range(0, 14, 4)])


def test_a_ragged_store_padded_by_a_collate_fn_gives_the_datasets_batches(tmp_path: Path) -> None:
    items = [(torch.arange(float(i % 4 + IN)), i % 3) for i in range(10)]

    def pad(batch: list[Any]) -> Any:
        n = max(len(x) for x, _ in batch)
        x = torch.stack([torch.nn.functional.pad(x, (0, n - len(x))) for x, _ in batch])
        return [x[:, :IN].to(torch.float64), torch.tensor([y for _, y in batch])]

    cached = ct.cache(Items(items), tmp_path / "store", progress=False)
    for workers in (0, 1):
        assert _same_batches(_seen(cached, collate_fn=pad, num_workers=workers),
                             _seen(Items(items), collate_fn=pad, num_workers=workers))  # fmt: skip


def _make(f: Any, layout: str, x: np.ndarray) -> None:
    if layout == "external raw file":
        raw = Path(f.filename).with_suffix(".raw")
        raw.write_bytes(b"\0" * 16 + x.tobytes())
        f.create_dataset("x", shape=x.shape, dtype=x.dtype, external=[(str(raw), 16, x.nbytes)])
    elif layout == "soft link":
        f.create_dataset("g/x", data=x)
        f["x"] = h5py.SoftLink("/g/x")
    elif layout == "enum int8":
        f.create_dataset("x", data=x.astype(np.int8) % 2, dtype=h5py.enum_dtype({"a": 0, "b": 1}, basetype="i1"))
    else:
        options = {"chunks": (3, *x.shape[1:]), "compression": "gzip", "shuffle": True, "fletcher32": True}
        f.create_dataset("x", data=x, **(options if layout == "chunked" else {}))


@pytest.mark.parametrize("layout", ["contiguous", "chunked", "external raw file", "soft link", "enum int8"])
@pytest.mark.parametrize("dtype", [">f2", "<u8", ">i8", ">c16", "?"])
def test_hdf5_datasets_of_odd_layouts_and_dtypes_read_as_h5py_reads_them(
    tmp_path: Path, layout: str, dtype: str
) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**16, (20, 3)).astype(dtype)
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        _make(f, layout, x)
    with h5py.File(path, "r") as f:
        want = f["x"][()]
    data = ct.hdf5(path, "x")
    order = [19, 0, 7, 7, 3, -1]
    assert np.array_equal(data.read_batch(order).numpy(), want[order].astype(want.dtype.newbyteorder("=")))
    assert all(np.array_equal(data[i].numpy(), want[i]) for i in range(len(want)))

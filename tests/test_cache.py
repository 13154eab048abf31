"""ct.cache: items come back equal (types, dtypes, bits), batches equal default_collate, stores reused and checked."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import IN, StopsAt, classify, labelled, make_state, reads_back
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

import composetrain as ct
from composetrain.data.equal import same_item
from composetrain.data.store_files import StoreError
from composetrain.data.writer import sampled

TENSOR_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.uint16,
]
NUMPY_DTYPES = ["<f4", "<f8", "<f2", "|i1", "|u1", "<i4", "<i8", "|b1", "<c8", "<u4"]


class Items(Dataset[Any]):
    """A dataset of the given items, counting its __getitem__ calls (and recording their indices)."""

    def __init__(self, items: list[Any]) -> None:
        self.items, self.calls, self.read = items, 0, []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        self.calls += 1
        self.read.append(i)
        return self.items[i]


def _bits(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _leaf(spec: tuple[Any, ...], rng: np.random.Generator, ragged: bool) -> Any:
    kind, dtype, shape = spec
    if ragged and shape:
        shape = (int(rng.integers(0, 4)), *shape[1:])
    size = int(np.prod(shape))
    if kind == "tensor":
        if dtype == torch.bool:
            return torch.from_numpy(rng.integers(0, 2, shape).astype(bool))
        raw = torch.frombuffer(bytearray(_bits(rng, size * dtype.itemsize) or b"\0"), dtype=torch.uint8)
        return raw[: size * dtype.itemsize].view(dtype).reshape(shape).clone()
    if kind in ("numpy", "npscalar"):
        d = np.dtype(dtype)
        a = rng.integers(0, 2, shape).astype(bool) if d.kind == "b" else np.frombuffer(_bits(rng, size * d.itemsize), d)
        a = a.reshape(shape).copy()
        return a[()] if kind == "npscalar" else a
    return {
        "int": lambda: int(rng.integers(-(2**63), 2**63 - 1)),
        "bool": lambda: bool(rng.integers(0, 2)),
        "float": lambda: float(np.frombuffer(_bits(rng, 8), "<f8")[0]),
    }[kind]()


shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)
leaf_specs = st.one_of(
    st.tuples(st.just("tensor"), st.sampled_from(TENSOR_DTYPES), shapes),
    st.tuples(st.just("numpy"), st.sampled_from(NUMPY_DTYPES), shapes),
    st.tuples(st.just("npscalar"), st.sampled_from(NUMPY_DTYPES), st.just(())),
    st.tuples(st.sampled_from(["int", "float", "bool"]), st.none(), st.just(())),
)
structures = st.recursive(
    leaf_specs,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(tuple),
        st.lists(inner, min_size=1, max_size=3),
        st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), inner, min_size=1, max_size=3),
    ),
    max_leaves=5,
)


def _make(structure: Any, rng: np.random.Generator, ragged: bool) -> Any:
    if (
        isinstance(structure, tuple)
        and len(structure) == 3
        and isinstance(structure[0], str)
        and structure[0] in ("tensor", "numpy", "npscalar", "int", "float", "bool")
    ):
        return _leaf(structure, rng, ragged)
    if isinstance(structure, dict):
        return {k: _make(v, rng, ragged) for k, v in structure.items()}
    return type(structure)(_make(s, rng, ragged) for s in structure)


def _as_arrays(item: Any) -> Any:
    """``item`` with its NumPy scalars as 0-d arrays: default_collate turns a list of NumPy scalars into a tensor
    through Python floats, which makes every NaN the canonical one; the store keeps each NaN's bits."""
    if isinstance(item, np.generic):
        return np.asarray(item)
    if isinstance(item, dict):
        return {k: _as_arrays(v) for k, v in item.items()}
    if isinstance(item, tuple | list):
        return type(item)(_as_arrays(v) for v in item)
    return item


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(structure=structures, n=st.integers(1, 6), seed=st.integers(0, 2**32 - 1), ragged=st.booleans())
def test_items_come_back_equal_for_every_structure_and_dtype(
    tmp_path_factory: Any, structure: Any, n: int, seed: int, ragged: bool
) -> None:
    rng = np.random.default_rng(seed)
    items = [_make(structure, rng, ragged) for _ in range(n)]
    data = Items(items)
    path = tmp_path_factory.mktemp("c") / "store"
    cached = ct.cache(data, path, progress=False)
    assert len(cached) == n
    for i in range(n):
        assert same_item(cached[i], items[i]), (i, cached[i], items[i])
    order = list(rng.permutation(n))
    for got, i in zip(cached.__getitems__(order), order, strict=True):
        assert same_item(got, items[i])
    if not cached.ragged:
        assert same_item(cached.read_batch(order), default_collate([_as_arrays(items[i]) for i in order]))
    assert data.read == list(range(n))  # written: each item once, in order
    again = ct.cache(data, path, progress=False)
    recorded = json.loads((path / "manifest.json").read_text())["origin"]["fingerprint"]["items"]
    assert data.read[n:] == recorded == sampled(n)  # a second open reads the fingerprint's items only, once each
    assert same_item(again[n - 1], items[n - 1])


def _store(tmp_path: Path, n: int = 12) -> tuple[Items, Path]:
    g = torch.Generator().manual_seed(0)
    items = [(torch.randn(3, generator=g), i % 3) for i in range(n)]
    return Items(items), tmp_path / "store"


@pytest.mark.parametrize("workers", [0, 1])
def test_a_given_dataloader_over_the_cache_gives_the_original_batches(tmp_path: Path, workers: int) -> None:
    data, path = _store(tmp_path)
    cached = ct.cache(data, path, progress=False)
    loader = DataLoader(cached, batch_size=5, shuffle=False, num_workers=workers)
    reference = DataLoader(data, batch_size=5, shuffle=False)
    for got, want in zip(loader, reference, strict=True):
        assert same_item(got, want)


def test_a_store_made_from_another_dataset_is_refused_and_rebuilt_on_request(tmp_path: Path) -> None:
    data, path = _store(tmp_path)
    ct.cache(data, path, progress=False)
    shorter = Items(data.items[:-1])
    with pytest.raises(ValueError, match=r"made from something else.*length.*rebuild=True"):
        ct.cache(shorter, path, progress=False)
    with pytest.raises(ValueError, match=r"key: the store has None, the dataset 'v2'"):
        ct.cache(data, path, key="v2", progress=False)
    rebuilt = ct.cache(shorter, path, rebuild=True, progress=False)
    assert len(rebuilt) == len(shorter) and shorter.calls == len(shorter)
    assert same_item(rebuilt[3], shorter.items[3])
    assert sorted(p.name for p in tmp_path.iterdir()) == [".store.lock", "store"]  # nothing stale left beside it


def test_rebuild_writes_again_a_store_whose_fingerprint_items_agree(tmp_path: Path) -> None:
    data, path = _store(tmp_path)
    ct.cache(data, path, progress=False)
    j = min(set(range(len(data.items))) - set(sampled(len(data.items))))
    x, y = data.items[j]
    changed = Items([*data.items[:j], (x + 1, y), *data.items[j + 1 :]])
    assert same_item(ct.cache(changed, path, progress=False)[j], data.items[j])  # unseen without rebuild (a limit)
    assert same_item(ct.cache(changed, path, rebuild=True, progress=False)[j], changed.items[j])


def test_changed_items_are_refused_by_the_fingerprint_and_by_verify(tmp_path: Path) -> None:
    data, path = _store(tmp_path)
    ct.cache(data, path, progress=False)
    changed = Items([(x + 1, y) for x, y in data.items])
    with pytest.raises(ValueError, match=r"items \[0, .*\] of the dataset differ from those the store"):
        ct.cache(changed, path, progress=False)  # same type and length: the fingerprint tells
    assert changed.read == sampled(12)
    with pytest.raises(ValueError, match=r"item 0 of the store .* differs"):
        ct.cache(changed, path, verify=True, progress=False)


def test_items_that_cannot_be_stored_are_refused_by_name(tmp_path: Path) -> None:
    cases = [
        ([("a", 1)], r"item 0\[0\] is a str"),
        ([(None,)], r"item 0\[0\] is a NoneType"),
        ([{1: torch.ones(1)}], r"has the key 1: only string keys"),
        ([(torch.ones(2),), (torch.ones(2), 1)], r"item 1 has the leaves"),
        ([{"a": 1, "b": 2.0}, {"b": 3, "a": 4.0}], r"item 1 has the leaves \[\"\['b'\]\", \"\['a'\]\"\]"),
        ([torch.ones(2), torch.ones(2, dtype=torch.int64)], r"item 1 is a tensor of int64, and in item 0 a tensor"),
        ([torch.ones(2), torch.ones(2, 1)], r"item 1 has 2 dimensions here and 1 in item 0"),
        ([np.array(["x"])], r"NumPy <U1"),
        ([np.ones(2, ">f4")], r"not in this machine's byte order: return value.astype\('<f4'\)"),
        ([2**70], r"outside int64"),
    ]
    for n, (items, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            ct.cache(Items(items), tmp_path / f"s{n}", progress=False)
        assert not (tmp_path / f"s{n}").exists() and not list(tmp_path.glob(f".s{n}.tmp-*"))


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    data, path = _store(tmp_path)
    for kwargs, error, message in [  # the wrong kind a TypeError, as in ct.run; a value out of range a ValueError
        ({"num_workers": -1}, ValueError, "num_workers must be"),
        ({"timeout": 0}, ValueError, "timeout must be"),
        ({"augment": 3}, TypeError, "augment must be a function"),
        ({"rebuild": 1}, TypeError, "rebuild must be True or False"),
        ({"key": object()}, ValueError, "key must be something JSON"),
        ({"key": float("nan")}, ValueError, "key must be something JSON"),
        ({"seed": 1.5}, TypeError, "seed must be a 64-bit int"),
    ]:
        with pytest.raises(error, match=message):
            ct.cache(data, path, **kwargs)
    with pytest.raises(TypeError, match=r"^cache: path must be a folder path \(str or os\.PathLike\), got 3 \(int\); "):
        ct.cache(data, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not exist"):
        ct.cache(data, tmp_path / "missing" / "store")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a cache store"):
        ct.cache(data, tmp_path / "mine", rebuild=True)
    with pytest.raises(ValueError, match="is a file, not a cache store"):
        ct.cache(data, tmp_path / "mine" / "notes.txt")
    assert data.calls == 0 and not path.exists()


def test_the_manifest_records_what_the_store_was_made_from(tmp_path: Path) -> None:
    data, path = _store(tmp_path)
    ct.cache(data, path, key={"size": 28, "mean": (0.5, 0.5)}, progress=False)
    ct.cache(data, path, key={"size": 28, "mean": (0.5, 0.5)}, progress=False)  # the same key, read back from JSON
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["length"] == 12
    assert manifest["origin"]["type"] == f"{__name__}.Items" and manifest["origin"]["key"] == {
        "size": 28,
        "mean": [0.5, 0.5],
    }


def test_every_file_and_the_folder_are_fsynced_before_the_store_is_renamed_into_place(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import os

    events: list[tuple[str, str]] = []
    fsync, rename = os.fsync, os.rename
    monkeypatch.setattr(
        os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd)
    )
    monkeypatch.setattr(os, "rename", lambda a, b: events.append(("rename", str(b))) or rename(a, b))
    data, path = _store(tmp_path)
    ct.cache(data, path, progress=False)
    published = events.index(("rename", str(path)))
    synced = {Path(p).name for kind, p in events[:published] if kind == "fsync"}
    assert synced >= {"f0.npy", "f1.npy", "manifest.json"} and any(n.startswith(".store.tmp-") for n in synced)
    assert ("fsync", str(tmp_path)) in events[published:]  # the rename itself made durable


def test_processes_waiting_for_a_rebuild_map_it_instead_of_rebuilding_again(tmp_path: Path) -> None:
    import fcntl
    import os
    import threading

    from composetrain.data.cache import _write

    data, path = _store(tmp_path)
    ct.cache(data, path, progress=False)
    fd = os.open(tmp_path / ".store.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # this "process" is rebuilding it
    waiter = Items(data.items)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(ct.cache(waiter, path, rebuild=True, progress=False)))
    thread.start()
    import time

    time.sleep(0.3)
    _write(data, path, {"type": f"{__name__}.Items", "length": 12, "key": None, "created": 0.0}, 0, False)
    os.close(fd)
    thread.join(30)
    assert waiter.read == sampled(12) and len(got[0]) == 12  # it waited, then mapped the fresh store


def test_items_read_by_loader_workers_are_written_in_order(tmp_path: Path) -> None:
    data, path = _store(tmp_path)
    cached = ct.cache(data, path, num_workers=1, progress=False)
    assert all(same_item(cached[i], data.items[i]) for i in range(len(data)))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_dtypes_numpy_lacks_come_back_as_themselves(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    odd = [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32]
    items = [tuple(torch.randn(2, 3, generator=g).to(d) for d in odd) for _ in range(4)]
    cached = ct.cache(Items(items), tmp_path / "store", progress=False)
    assert all(same_item(cached[i], items[i]) for i in range(4))
    assert all(same_item(a, items[i]) for a, i in zip(cached.__getitems__([2, 0]), [2, 0], strict=True))
    assert same_item(cached.read_batch([3, 1]), default_collate([items[3], items[1]]))


def test_the_store_is_mapped_never_loaded_and_loader_workers_get_no_copy_of_it(tmp_path: Path) -> None:
    import mmap
    import pickle

    cached = ct.cache(Items([torch.full((1000,), float(i)) for i in range(12)]), tmp_path / "s", progress=False)
    cached.read_batch([0, 1])
    for array in cached.arrays().values():
        assert isinstance(array.base, mmap.mmap | np.memmap)  # pages read on demand: a store may exceed memory
    assert len(pickle.dumps(cached)) < 4000 < 12 * 4000  # what a worker receives: the file names, not the data


# -- items in other containers, a loader that stops early, the global random state, every dtype -----------------


@pytest.mark.parametrize(
    "items",
    [
        [(torch.tensor([1.0]), []), (torch.tensor([2.0]), {}), (torch.tensor([3.0]), ())],
        [[torch.tensor([1.0]), (torch.tensor(1),)], [torch.tensor([2.0]), [torch.tensor(2)]]],
    ],
    ids=["empty containers of other types", "a tuple in item 0, a list in item 1"],
)
def test_items_whose_containers_differ_are_refused_or_come_back_as_they_were(tmp_path: Path, items: Any) -> None:
    """The bug (wrong item served): the writer compares items by their leaves' paths only, which a tuple and a
    list (or empty containers of any type) share: the store serves item 0's containers for every item."""
    try:
        cached = ct.cache(Items(items), tmp_path / "store", progress=False)
    except ValueError as e:  # refused as items of another structure: as good
        assert "cache: item 1" in str(e)
        return
    assert reads_back(cached, items)


def test_a_stopiteration_while_a_store_is_written_by_workers_is_named(tmp_path: Path) -> None:
    """The bug (bare exception): ct.cache's writer reads by a DataLoader with workers, which stops at item 13's
    StopIteration; the writer then fails on its own bookkeeping: AssertionError ((20, 5), 65) for fixed shapes,
    "cannot reshape array" for ragged ones, and under ``python -O`` "an item is a NoneType"."""
    with pytest.raises(ValueError, match=r"cache: .*13"):
        ct.cache(StopsAt(), tmp_path / "store", num_workers=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == [".store.lock"]


def test_writing_with_loader_workers_leaves_the_global_random_state_alone(tmp_path: Path) -> None:
    """The bug (a seeded script not reproducible): the writer's DataLoader has no generator of its own, so starting
    its workers draws their base seed from the global torch generator. Whether ct.cache writes with workers
    (num_workers="auto": by timing) or only opens an existing store decides what a seeded script draws next:
    its model is initialised differently on the run that wrote the store."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    ct.cache(Items(labelled(30)), tmp_path / "store", num_workers=1, progress=False)
    assert torch.equal(torch.get_rng_state(), before)


_TENSOR_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


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
    assert reads_back(cached, items)
    ct.cache(Items(items), tmp_path / "store", verify=True, progress=False)
    collatable = [{k: v for k, v in x.items() if k != "npscalar u8"} for x in items]  # torch cannot collate those
    batch = cached.read_batch([4, 0, 2])
    want = default_collate([collatable[i] for i in (4, 0, 2)])
    assert same_item({k: v for k, v in batch.items() if k in want}, want)


# -- odd items, indices and stores: what a skeptical user (or a hostile file) would try -------------------------------


def test_an_iterable_dataset_is_refused_even_with_a_len(tmp_path: Path) -> None:
    class Stream(IterableDataset[Any]):
        def __iter__(self) -> Any:
            yield torch.ones(2)

        def __len__(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"cache: dataset is an IterableDataset \(Stream\).*map-style"):
        ct.cache(Stream(), tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()


def test_conjugate_and_negative_views_are_stored_as_their_values(tmp_path: Path) -> None:
    x = torch.randn(2, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    items = [(x.conj(), x.conj().imag), (x[1].conj().expand(2, 3), x.conj().imag * 2)]
    assert items[0][0].is_conj() and items[0][1].is_neg()
    cached = ct.cache(items, tmp_path / "store", progress=False, num_workers=0)
    for i in range(2):
        assert same_item(cached[i], tuple(t.resolve_conj().resolve_neg() for t in items[i]))
        assert torch.equal(cached[i][0], items[i][0].resolve_conj())
    assert same_item(cached.read_batch([1, 0]), default_collate([items[1], items[0]]))


def test_quantized_tensors_are_refused_rather_than_read_back_without_their_scale(tmp_path: Path) -> None:
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.1, 3, torch.quint8)
    with pytest.raises(ValueError, match=r"item 0\[1\] is a quantized tensor \(quint8\).*int_repr\(\)"):
        ct.cache([(torch.ones(1), q)], tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()


def test_numpy_memmap_rows_are_stored_and_verify_accepts_them_other_subclasses_are_refused(tmp_path: Path) -> None:
    rows = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype="<f4", shape=(3, 2))
    rows[:] = np.arange(6, dtype="<f4").reshape(3, 2)
    items = [rows[i] for i in range(3)]
    cached = ct.cache(items, tmp_path / "store", progress=False)
    again = ct.cache(items, tmp_path / "store", progress=False, verify=True)  # values equal: not "differs"
    assert all(np.array_equal(again[i], rows[i]) and cached[i].dtype == rows.dtype for i in range(3))
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    with pytest.raises(ValueError, match=r"item 0 is a NumPy MaskedArray.*filled"):
        ct.cache([masked], tmp_path / "masked", progress=False)
    with pytest.raises(ValueError, match=r"item 0 is a NumPy matrix"):
        ct.cache([np.asmatrix(np.ones((1, 2)))], tmp_path / "matrix", progress=False)


def test_indices_that_are_not_ints_are_refused_and_integer_tensors_index_as_in_the_dataset(tmp_path: Path) -> None:
    items = [torch.full((2,), float(i)) for i in range(5)]
    cached = ct.cache(items, tmp_path / "store", progress=False)
    for bad in ([1.7, 2.2], [True, False], np.array([1.9]), torch.tensor([0.5])):
        with pytest.raises(TypeError, match=r"indices must be a flat list of ints, got"):
            cached.read_batch(bad)
    assert torch.equal(cached.read_batch([]), torch.empty(0, 2))
    # what indexes the original (a list, a TensorDataset) indexes the cache: 0-dim integer tensors too
    assert torch.equal(cached[torch.tensor(3)], items[3]) and torch.equal(cached[np.int16(-1)], items[-1])
    assert same_item(cached.__getitems__(torch.tensor([4, 1])), [items[4], items[1]])
    for bad_index in (2.0, True, torch.tensor(1.0), torch.tensor([1, 2])):
        with pytest.raises(TypeError, match="an index must be an int"):
            cached[bad_index]  # type: ignore[index]


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", ["f0.npy", "manifest.json"])
def test_a_fifo_in_a_store_is_refused_without_blocking(tmp_path: Path, name: str) -> None:
    path = tmp_path / "store"
    ct.cache([torch.ones(2)] * 3, path, progress=False)
    _fifo(path / name)
    result: list[Any] = []
    opener = threading.Thread(target=lambda: result.append(_refusal(path)), daemon=True)
    opener.start()
    opener.join(timeout=20)
    if opener.is_alive():  # unblock the open, so the thread (and the test run) can end
        os.close(os.open(path / name, os.O_WRONLY | os.O_NONBLOCK))
        opener.join(timeout=5)
        pytest.fail(f"opening a store whose {name} is a FIFO blocked")
    assert "is not a regular file" in result[0]


def _refusal(path: Path) -> str:
    try:
        ct.cache([torch.ones(2)] * 3, path, progress=False)
    except StoreError as e:
        return str(e)
    return "opened"


def test_a_deeply_nested_or_overflowing_manifest_is_refused_as_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "store"
    items = [(torch.ones(1 + i % 2),) for i in range(4)]  # a ragged field
    ct.cache(items, path, progress=False)
    good = (path / "manifest.json").read_text()
    (path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreError, match="is not JSON"):
        ct.cache(items, path, progress=False)
    (path / "manifest.json").write_text(good)
    shapes = np.array([[1], [2], [1], [2]], np.int64)
    shapes2 = np.array([[1, 1], [2**32, 2**32], [1, 1], [4, 1]], np.int64)  # 2**64 elements: 0 once it wraps
    manifest = json.loads(good)
    assert np.array_equal(np.load(path / "f0s.npy"), shapes)
    np.save(path / "f0s.npy", shapes2)
    np.save(path / "f0o.npy", np.array([0, 1, 1, 2, 6], np.int64))  # all else consistent with the 6 values
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="offsets and shapes of ragged array"):
        ct.cache(items, path, progress=False)


def noisy_store(tmp_path: Path) -> Any:
    """Eight items in a store whose augment adds noise drawn from its generator (seeded per epoch and batch)."""
    g = torch.Generator().manual_seed(0)
    items = [(torch.randn(IN, dtype=torch.float64, generator=g), i % 3) for i in range(8)]

    def noise(batch: Any, generator: torch.Generator) -> Any:
        x, y = batch
        return [x + torch.randn(x.shape, generator=generator, dtype=x.dtype), y]

    return ct.cache(items, tmp_path / "store", augment=noise, progress=False)


def test_a_given_dataloader_run_by_ct_run_augments_each_epoch_anew(tmp_path: Path) -> None:
    cached = noisy_store(tmp_path)
    seen: list[torch.Tensor] = []

    def record(model: Any, batch: Any) -> Any:
        seen.append(batch[0].clone())
        return classify(model, batch)

    ct.run(ct.train_step(record), make_state(), DataLoader(cached, batch_size=4), epochs=2, progress=False)
    want = [cached.read_batch(range(s, s + 4), epoch=e)[0] for e in range(2) for s in (0, 4)]
    assert len(seen) == 4 and all(torch.equal(a, b) for a, b in zip(seen, want, strict=True))


def test_items_with_more_leaves_than_open_files_allowed_are_written(tmp_path: Path) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    items = [{f"k{j}": float(i * j) for j in range(300)} for i in range(3)]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # fewer than the item's leaves
    try:
        cached = ct.cache(items, tmp_path / "store", progress=False, num_workers=0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert all(same_item(cached[i], items[i]) for i in range(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".store.lock", "store"]


def test_a_link_to_a_store_is_followed_and_a_rebuild_writes_where_it_points(tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    os.symlink(tmp_path / "big" / "store", tmp_path / "link")  # dangling until the store is written
    ct.cache([torch.ones(2)] * 3, tmp_path / "link", progress=False)
    again = ct.cache([torch.zeros(2)] * 3, tmp_path / "link", rebuild=True, progress=False)
    assert torch.equal(again[0], torch.zeros(2)) and again.path == tmp_path / "big" / "store"
    assert os.path.islink(tmp_path / "link") and sorted(p.name for p in (tmp_path / "big").iterdir()) == [
        ".store.lock",
        "store",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "link"]


def test_an_augment_that_changes_the_batch_size_is_named(tmp_path: Path) -> None:
    cached = ct.cache(
        [(torch.ones(3) * i, i) for i in range(6)],
        tmp_path / "store",
        progress=False,
        augment=lambda b, g: [b[0][:1], b[1]],
    )
    with pytest.raises(
        ValueError, match=r"augment returned a batch of 1 rows for 3 indices \(a tensor of shape \(1, 3\)\)"
    ):
        next(iter(DataLoader(cached, batch_size=3)))


def test_empty_complex_tensors_come_back_viewable_and_verify_compares_them(tmp_path: Path) -> None:
    items = [(torch.empty(0, dtype=torch.complex128), torch.empty(2, 0, dtype=torch.complex64))] * 2
    ct.cache(items, tmp_path / "store", progress=False)
    cached = ct.cache(items, tmp_path / "store", progress=False, verify=True)  # same_item of empty tensors
    for got in (cached[1], cached.__getitems__([0])[0]):
        assert same_item(got, items[0])
        assert got[0].view(torch.float64).shape == (0,) and got[1].view(torch.float32).shape == (2, 0)
    zero_strides = torch.from_numpy(np.array(np.empty((2, 0), np.complex128)[np.asarray([1])][0]))
    assert zero_strides.stride() == (0,)  # what a dataset built on NumPy may return
    assert same_item(zero_strides, items[0][0]) and not same_item(zero_strides, items[0][1])


def test_a_map_refused_for_lack_of_address_space_says_so(tmp_path: Path, monkeypatch: Any) -> None:
    import errno

    cached = ct.cache([torch.ones(4)] * 3, tmp_path / "store", progress=False)

    def no_room(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(np, "memmap", no_room)  # what mmap does past RLIMIT_AS (ulimit -v)
    with pytest.raises(OSError, match=r"mapping .*f0\.npy .* address space limit \(ulimit -v, RLIMIT_AS\)"):
        cached.read_batch([0])


def test_the_store_records_a_fingerprint_of_some_items_and_verify_finds_a_change_in_the_middle(
    tmp_path: Path,
) -> None:
    from composetrain.data.writer import fingerprint, sampled

    items = [(torch.full((3,), float(i)), i, {"m": np.int16(i)}) for i in range(9)]
    path = tmp_path / "store"
    ct.cache(items, path, progress=False, num_workers=0)
    recorded = json.loads((path / "manifest.json").read_text())["origin"]["fingerprint"]
    assert recorded == {"items": sampled(9), "blake2b": fingerprint([items[i] for i in sampled(9)])}
    assert {0, 4, 8} <= set(sampled(9))
    ct.cache(items, path, progress=False, verify=True)  # the same items: accepted
    changed = list(items)
    changed[4] = (torch.full((3,), 4.5), 4, {"m": np.int16(4)})  # same type and length, first and last alike
    shown = str(sampled(9)).replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ValueError, match=rf"items {shown} of the dataset differ from those the store .* made"):
        ct.cache(changed, path, progress=False)  # compared at every open
    retyped = list(items)
    retyped[4] = (torch.full((3,), 4.0).view(torch.int32), 4, {"m": np.int16(4)})  # the same bytes, another dtype
    with pytest.raises(ValueError, match="differ from those the store"):
        ct.cache(retyped, path, progress=False)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_augmented_cache_with_a_collate_fn_is_augmented_per_epoch_by_ct_run(tmp_path: Path, workers: int) -> None:
    cached = noisy_store(tmp_path)
    seen: list[torch.Tensor] = []

    def record(model: Any, batch: Any) -> Any:
        assert isinstance(batch, tuple)  # what the collate_fn made of the augmented rows
        seen.append(batch[0].clone())
        return classify(model, batch)

    ct.run(
        ct.train_step(record),
        make_state(),
        cached,
        batch_size=4,
        epochs=2,
        progress=False,
        shuffle=False,
        num_workers=workers,
        collate_fn=lambda rows: tuple(default_collate(rows)),
    )
    want = [cached.read_batch(range(s, s + 4), epoch=e)[0] for e in range(2) for s in (0, 4)]
    assert len(seen) == 4 and all(torch.equal(a, b) for a, b in zip(seen, want, strict=True))


def test_a_disk_too_full_for_the_lock_files_note_fails_as_a_full_disk_with_the_cache_message(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import errno

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)  # the lock's "who holds it" note: the first byte written
    monkeypatch.setattr("composetrain.data.store_files.NpyWriter.flush", full)
    with pytest.raises(OSError, match=r"cache: writing .*store failed: No space left on device; nothing was kept"):
        ct.cache([torch.ones(2)] * 3, tmp_path / "store", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".store.lock"]


def test_rebuild_is_not_skipped_for_a_store_dated_in_the_future(tmp_path: Path) -> None:
    from composetrain.data.writer import sampled

    path, items = tmp_path / "store", [torch.zeros(2)] * 40
    ct.cache(items, path, progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["origin"]["created"] += 3600.0  # written on a node whose clock is an hour ahead
    (path / "manifest.json").write_text(json.dumps(manifest))
    j = min(set(range(40)) - set(sampled(40)))  # changed where the fingerprint does not look: only a rebuild sees it
    changed = [*items[:j], torch.ones(2), *items[j + 1 :]]
    rebuilt = ct.cache(changed, path, rebuild=True, progress=False)
    assert torch.equal(rebuilt[j], torch.ones(2))


def test_numpy_scalars_of_an_alias_type_pass_verify(tmp_path: Path) -> None:
    items = [(np.array([i], "q")[0], np.array([i], "Q")[0], np.float32(i)) for i in range(3)]
    assert type(items[0][0]) is np.longlong  # the same dtype as np.int64, another type
    ct.cache(items, tmp_path / "store", progress=False)
    cached = ct.cache(items, tmp_path / "store", progress=False, verify=True)
    assert all(same_item(cached[i], items[i]) for i in range(3)) and cached[2][0].dtype == np.int64
    assert not same_item(np.int64(1), np.int32(1)) and not same_item(np.float32(1), np.int32(1))


def test_a_bool_timeout_is_refused_rather_than_taken_for_one_second(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"cache: timeout must be a positive number, got True \(bool\); e\.g\."):
        ct.cache([torch.ones(1)], tmp_path / "store", timeout=True, progress=False)  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()


class Growing(torch.utils.data.Dataset[Any]):
    """A dataset whose len grows after its first call (another process appending to its index)."""

    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        self.calls += 1
        return 10 if self.calls < 2 else 11

    def __getitem__(self, i: int) -> Any:
        return torch.ones(1) * i


def test_a_dataset_whose_len_changes_while_written_is_written_at_its_first_len_then_refused(tmp_path: Path) -> None:
    data, path = Growing(), tmp_path / "store"
    cached = ct.cache(data, path, progress=False)  # no bare AssertionError from the writer
    assert len(cached) == 10 and all(same_item(cached[i], torch.ones(1) * i) for i in range(10))
    with pytest.raises(ValueError, match=r"length: the store has 10, the dataset 11"):
        ct.cache(data, path, progress=False)

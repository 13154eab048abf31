"""ct.hdf5: an HDF5 file's datasets read as h5py reads them, memory-mapped where they lie flat in the file,
through h5py otherwise; a run over them bit-identical to a run over the same tensors in memory."""

import gc
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from helpers import assert_states_equal
from hypothesis import given, settings
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import composetrain as ct

h5py = pytest.importorskip("h5py")

N = 37
LAYOUTS = {  # name: create_dataset options
    "contiguous": {},
    "chunked": {"chunks": (5, 3)},
    "gzip": {"chunks": (4, 3), "compression": "gzip"},
    "shuffled": {"chunks": (6, 3), "compression": "gzip", "shuffle": True},
}
DTYPES = ["<f4", "float16", "int8", "bool", ">f4", ">i8", "uint16", "float64"]


def values(dtype, shape, seed=0):
    g = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "b":
        return g.random(shape) < 0.5
    return (g.standard_normal(shape) * 50).astype(dtype)


@pytest.fixture(scope="module")
def h5file(tmp_path_factory):
    path = tmp_path_factory.mktemp("h5") / "data.h5"
    with h5py.File(path, "w") as f:
        for name, options in LAYOUTS.items():
            f.create_dataset(name, data=values("<f4", (N, 3), seed=len(name)), **options)
        for dtype in DTYPES:
            f.create_dataset(f"dtypes/{dtype}", data=values(dtype, (N, 2, 2)))
            f.create_dataset(
                f"packed/{dtype}", data=values(dtype, (N, 2, 2)), chunks=(4, 2, 1), compression="gzip", shuffle=True
            )
        f["scalar"] = np.arange(N, dtype="<i8")  # one number per row: items are 0-dim tensors
        f["empty"] = np.zeros((0, 4), "<f4")
        f["empty_chunked"] = np.zeros((0, 4), "<f4")
        f.create_dataset("unwritten", shape=(N, 3), dtype="<f4")  # contiguous, never written: no address
        f["short"] = np.zeros((N - 1, 3), "<f4")
        f["words"] = np.array([b"a"] * N)
        f.create_dataset("vlen", data=["x"] * N, dtype=h5py.string_dtype())
        f["pairs"] = np.zeros(N, dtype=[("a", "<f4"), ("b", "<i4")])
        f["one"] = np.float32(1)
        f.create_group("group")
    return path


def expected(path, name, index):
    with h5py.File(path, "r") as f:
        return np.stack([f[name][i] for i in index]) if len(index) else None


def test_flat_datasets_are_memory_mapped_the_others_read_by_h5py(h5file):
    data = ct.hdf5(h5file, [*LAYOUTS, "unwritten", "scalar"])
    assert data.mapped == ["contiguous", "scalar"]  # an unwritten dataset has no bytes to map: h5py reads fill values
    assert len(data) == N


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(-N, N - 1), max_size=20),
    st.sampled_from([*LAYOUTS, *(f"{g}/{d}" for g in ("dtypes", "packed") for d in DTYPES)]),
)
def test_any_index_list_reads_what_h5py_reads(h5file, index, name):
    """Unsorted, repeated and negative indices: the rows h5py reads one by one, native byte order."""
    data = ct.hdf5(h5file, [name])
    (batch,) = data.read_batch(index)
    want = expected(h5file, name, index)
    assert batch.shape == ((len(index), 2, 2) if name.startswith(("dtypes", "packed")) else (len(index), 3))
    if want is not None:
        assert batch.dtype == torch.from_numpy(want.astype(want.dtype.newbyteorder("="))).dtype
        assert np.array_equal(batch.numpy(), want)
    items = data.__getitems__(index)
    assert len(items) == len(index)
    for item, row in zip(items, want if want is not None else [], strict=True):
        assert isinstance(item, tuple) and np.array_equal(item[0].numpy(), row)


def test_big_endian_rows_come_native(h5file):
    data = ct.hdf5(h5file, "dtypes/>f4")
    assert data.mapped == ["dtypes/>f4"]
    row = data[3]
    assert row.dtype == torch.float32 and np.array_equal(row.numpy(), expected(h5file, "dtypes/>f4", [3])[0])


def test_items_have_the_structure_of_the_keys(h5file):
    with h5py.File(h5file, "r") as f:
        x, s = f["contiguous"][5], f["scalar"][5]
    one = ct.hdf5(h5file, "contiguous")[5]
    assert isinstance(one, torch.Tensor) and np.array_equal(one.numpy(), x)
    pair = ct.hdf5(h5file, ("scalar", "gzip"))[-32]  # the order given, not the file's
    assert isinstance(pair, tuple) and pair[0].shape == () and pair[0].item() == s and pair[1].shape == (3,)
    named = ct.hdf5(h5file, {"x": "contiguous", "n": "scalar"})[5]
    assert named.keys() == {"x", "n"} and np.array_equal(named["x"].numpy(), x) and named["n"].item() == s
    batch = ct.hdf5(h5file, {"x": "chunked", "n": "scalar"}).read_batch([4, 2])
    assert batch["x"].shape == (2, 3) and batch["n"].tolist() == [4, 2]


def test_batches_equal_a_dataloaders_over_the_items(h5file):
    """read_batch() is what default_collate makes of the items: the list / dict / tensor a DataLoader gives."""
    for keys in ("contiguous", ["gzip", "scalar"], {"x": "contiguous", "n": "scalar"}):
        data = ct.hdf5(h5file, keys)
        index = [7, 3, 3, 30]
        (want,) = DataLoader(data, batch_size=4, sampler=index)
        got = data.read_batch(index)
        assert type(got) is type(want)
        for a, b in zip(
            *(g.values() if isinstance(g, dict) else [g] if torch.is_tensor(g) else g for g in (got, want)), strict=True
        ):
            assert a.dtype == b.dtype and torch.equal(a, b)


def test_zero_rows(h5file):
    data = ct.hdf5(h5file, ["empty", "empty_chunked"])
    assert len(data) == 0 and data.mapped == []
    assert [t.shape for t in data.read_batch([])] == [(0, 4), (0, 4)]
    with pytest.raises(IndexError, match="index 0 out of range for 0 items"):
        data[0]


def test_out_of_range_and_wrong_index_types_are_refused(h5file):
    data = ct.hdf5(h5file, "contiguous")
    for bad in (N, -N - 1):
        with pytest.raises(IndexError, match=f"HDF5Dataset: index {bad} out of range for {N} items"):
            data[bad]
    with pytest.raises(TypeError, match="an index must be an int, got slice"):
        data[1:3]


@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        (["contiguous", "short"], ValueError, r"differ in rows .*'contiguous': 37, 'short': 36"),
        ("missing", KeyError, r"'missing' in .*no such dataset; its top level has \['chunked', 'contiguous'"),
        ("group", KeyError, "a Group, not a dataset"),
        ("words", TypeError, r"'words' .*dtype \|S1 \(S\), which torch has no tensor for"),
        ("vlen", TypeError, r"'vlen' .*variable-length"),
        ("pairs", TypeError, r"'pairs' .* \(V\)"),
        ("one", ValueError, "'one' in .* is a scalar"),
        ([], TypeError, "keys must be a dataset name, a list or tuple of names, or a dict"),
        ({"x": 3}, TypeError, "keys must be"),
        (b"contiguous", TypeError, "keys must be"),
    ],
)
def test_bad_keys_are_refused_by_name(h5file, keys, error, match):
    with pytest.raises(error, match=match):
        ct.hdf5(h5file, keys)


def test_a_file_that_is_not_hdf5_or_not_there(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"\x93NUMPY" + bytes(200))
    with pytest.raises(ValueError, match=r"ct.hdf5: .*x.h5 is not an HDF5 file"):
        ct.hdf5(tmp_path / "x.h5", "x")
    with pytest.raises(FileNotFoundError, match=r"ct.hdf5: no file .*nothing.h5"):
        ct.hdf5(tmp_path / "nothing.h5", "x")


def test_without_h5py_the_error_says_what_to_install(h5file, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py now raises ImportError
    with pytest.raises(ImportError, match=r"pip install composetrain\[hdf5\]"):
        ct.hdf5(h5file, "contiguous")


def test_a_userblock_before_the_data_is_counted(tmp_path):
    path = tmp_path / "ub.h5"
    with h5py.File(path, "w", userblock_size=1024) as f:
        f["x"] = np.arange(40, dtype="<f8").reshape(20, 2)
    data = ct.hdf5(path, "x")
    assert data.mapped == ["x"] and data.read_batch([19, 0]).tolist() == [[38, 39], [0, 1]]


def test_it_pickles_by_path_and_reads_in_another_process(h5file):
    data = ct.hdf5(h5file, ["contiguous", "gzip"])
    data.read_batch([1, 2])  # the map and the h5py file are open now: neither may travel
    blob = pickle.dumps(data)
    assert len(blob) < 4000
    again = pickle.loads(blob)
    for a, b in zip(again.read_batch([5, 1]), data.read_batch([5, 1]), strict=True):
        assert torch.equal(a, b)
    # forked workers inherit the parent's open h5py file: each must open its own
    workers = DataLoader(data, batch_size=8, num_workers=2)
    got = [torch.cat(batch) for batch in zip(*workers, strict=True)]
    assert all(torch.equal(g, w) for g, w in zip(got, data.read_batch(list(range(N))), strict=True))


def model_state():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))


def step(model, batch):
    x, y, w = batch
    return (nn.functional.cross_entropy(model(x.double().flatten(1)), y, reduction="none") * w).mean()


@pytest.mark.parametrize(("layout", "workers"), [("contiguous", 0), ("gzip", 0), ("gzip", 2)])
def test_a_run_over_hdf5_is_bit_identical_to_one_over_the_tensors(tmp_path, layout, workers):
    g = np.random.default_rng(1)
    x, y, w = g.standard_normal((90, 3, 4)).astype(">f4"), g.integers(0, 3, 90), g.random(90).astype("float16")
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, **({"chunks": (7, 3, 4), "compression": "gzip"} if layout == "gzip" else {}))
        f["y"], f["w"] = y, w
    tensors = TensorDataset(*(torch.from_numpy(a.astype(a.dtype.newbyteorder("="))) for a in (x, y, w)))
    options = {"epochs": 2, "batch_size": 16, "progress": False, "log_every": 1}
    a, b = model_state(), model_state()
    ra = ct.run(ct.accumulate(2)(step), a, ct.hdf5(path, ["x", "y", "w"]), num_workers=workers, **options)
    rb = ct.run(ct.accumulate(2)(step), b, tensors, num_workers=0, **options)
    assert_states_equal(a, b)
    losses = [[r["loss"] for r in result.history] for result in (ra, rb)]
    assert losses[0] == losses[1] and len(losses[0]) == 12


def test_auto_reads_memory_maps_here_and_weighs_workers_for_what_h5py_reads(tmp_path):
    path = tmp_path / "two.h5"
    with h5py.File(path, "w") as f:
        f["flat"] = np.zeros((64, 12), "<f4")
        f.create_dataset("packed", data=np.zeros((64, 12), "<f4"), chunks=(8, 12), compression="gzip")
        f["y"] = np.zeros(64, "<i8")
    runs = {}
    for name in ("flat", "packed"):
        runs[name] = ct.run(step, model_state(), ct.hdf5(path, [name, "y", "y"]), batch_size=4, progress=False)
    assert "chose 0: a memory-mapped HDF5Dataset is read a whole batch at a time" in runs["flat"].bottleneck
    assert 'num_workers="auto" chose ' in runs["packed"].bottleneck
    assert "(reading whole batches: " in runs["packed"].bottleneck  # timed, then chosen


def test_augment_is_applied_to_every_batch_seeded_by_epoch_and_indices(h5file):
    def noise(batch, generator):
        x, n = batch
        return [x + torch.rand(x.shape, generator=generator), n]

    plain = ct.hdf5(h5file, ["contiguous", "scalar"])
    noisy = ct.hdf5(h5file, ["contiguous", "scalar"], augment=noise, seed=3)
    x, n = plain.read_batch([3, 1])
    a, b, c = noisy.read_batch([3, 1], 0), noisy.read_batch([3, 1], 0), noisy.read_batch([3, 1], 1)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0]) and torch.equal(a[1], n)
    assert ((a[0] - x) >= 0).all() and ((a[0] - x) < 1).all()
    with pytest.raises(TypeError, match=r"ct\.hdf5: augment must be a function"):
        ct.hdf5(h5file, "contiguous", augment=3)


def test_external_compact_and_unwritten_data_are_read_by_h5py(tmp_path):
    """Only bytes that lie in the file as one array are mapped; a userblock shifts an unwritten dataset's
    undefined address into the file, where a map would read the superblock."""
    path, rows = tmp_path / "odd.h5", np.arange(12.0).reshape(6, 2)
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("external", data=rows, external=[(str(tmp_path / "rows.raw"), 0, h5py.h5f.UNLIMITED)])
        compact = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        compact.set_layout(h5py.h5d.COMPACT)
        f.create_dataset("compact", data=rows, dcpl=compact)
        f.create_dataset("unwritten", shape=(6, 2), dtype="<f8", fillvalue=7.0)
        f["flat"] = rows
    data = ct.hdf5(path, ["external", "compact", "unwritten", "flat"])
    assert data.mapped == ["flat"] and not data.memory_mapped
    external, compact, unwritten, flat = data.read_batch([5, 0, 5])
    for got in (external, compact, flat):
        assert got.tolist() == rows[[5, 0, 5]].tolist()
    assert (unwritten == 7).all()


def test_a_relative_path_still_reads_after_a_change_of_folder(h5file, monkeypatch):
    monkeypatch.chdir(h5file.parent)
    data = ct.hdf5(h5file.name, ["contiguous", "gzip"])
    monkeypatch.chdir(h5file.parent.parent)
    with h5py.File(h5file, "r") as f:
        assert np.array_equal(data.read_batch([2])[0].numpy(), f["contiguous"][[2]])
        assert np.array_equal(pickle.loads(pickle.dumps(data)).read_batch([2])[1].numpy(), f["gzip"][[2]])


def test_a_forked_process_opens_the_file_again(h5file):
    """An h5py handle inherited across fork shares the parent's HDF5 state: each process opens its own."""
    import multiprocessing

    data = ct.hdf5(h5file, "gzip")
    parent = data.h5file()
    FORKED["data"] = data  # inherited by the child as it is, open handle included (not pickled)
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            assert pool.apply(_opens_its_own, (id(parent),))
    finally:
        FORKED.clear()
    assert data.h5file() is parent  # and this process keeps its own


FORKED = {}


def _opens_its_own(parent_id):
    data = FORKED["data"]
    return id(data._file) == parent_id and id(data.h5file()) != parent_id and data.read_batch([3]).shape == (1, 3)


def test_big_endian_rows_that_h5py_reads_come_native(h5file):
    """A chunked, compressed big-endian dataset: h5py hands back big-endian rows, which torch cannot hold; they
    are swapped to native order (the sampled property above reaches this case only now and then)."""
    data = ct.hdf5(h5file, "packed/>f4")
    assert data.mapped == []
    batch = data.read_batch([3, 1, 3])
    assert batch.dtype == torch.float32 and np.array_equal(batch.numpy(), expected(h5file, "packed/>f4", [3, 1, 3]))


# -- types h5py converts, odd layouts and dtypes ----------------------------------------------------------------


def _h5(path: Path, tid: Any, data: np.ndarray, memtype: Any) -> Path:
    """A file with one contiguous dataset "x" of the HDF5 type ``tid``, written from ``data`` in ``memtype``."""
    with h5py.File(path, "w") as f:
        dset = h5py.h5d.create(f.id, b"x", tid, h5py.h5s.create_simple((len(data),)))
        dset.write(h5py.h5s.ALL, h5py.h5s.ALL, data, mtype=memtype)
    return path


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
    """The bug (wrong values served): ``flat_offset`` maps any contiguous unfiltered dataset and reads its bytes as
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


# -- hostile files and arguments: links, changed files, odd indices and seeds, augments, the bottleneck's advice ------


ROWS = np.arange(12 * 3, dtype="<f4").reshape(12, 3)


def h5(path, **datasets):
    with h5py.File(path, "w") as f:
        f["pad"] = np.full(500, 9.0)  # the datasets below do not start where a smaller file's would
        for name, (data, options) in datasets.items():
            f.create_dataset(name, data=data, **options)
    return path


def test_a_dataset_behind_an_external_link_is_read_from_the_linked_file(tmp_path, monkeypatch):
    """An external link's dataset lies in another file: its rows come from there (mapped there), not from the
    same offset in the file that holds the link."""
    (tmp_path / "sub").mkdir()
    h5(tmp_path / "sub" / "other.h5", z=(-ROWS, {}), zc=(-ROWS, {"chunks": (5, 3), "compression": "gzip"}))
    path = h5(tmp_path / "sub" / "main.h5", x=(ROWS, {}))
    with h5py.File(path, "a") as f:
        f["ext"] = h5py.ExternalLink("other.h5", "z")  # relative to the linking file's folder
        f["extc"] = h5py.ExternalLink("other.h5", "zc")
    monkeypatch.chdir(tmp_path)  # not the files' folder
    data = ct.hdf5(path, ["x", "ext", "extc"])
    assert data.mapped == ["x", "ext"]
    index = [5, 0, 11, 5]
    copy = pickle.dumps(data)
    for got in (data.read_batch(index), pickle.loads(copy).read_batch(index)):
        assert [t.tolist() for t in got] == [ROWS[index].tolist(), (-ROWS[index]).tolist(), (-ROWS[index]).tolist()]
    h5(tmp_path / "sub" / "other.h5", z=(ROWS, {}), zc=(ROWS, {}))  # the linked file rewritten: checked too
    with pytest.raises(RuntimeError, match=r"ct\.hdf5: .*other\.h5 changed since ct\.hdf5 opened it"):
        pickle.loads(copy).read_batch(index)


@pytest.mark.parametrize("layout", [{}, {"chunks": (4, 3), "compression": "gzip"}])
@pytest.mark.parametrize("change", ["rewritten", "moved", "truncated", "deleted"])
def test_a_file_changed_after_ct_hdf5_is_refused_not_misread(tmp_path, layout, change):
    """Rewritten with other values of the same size, rewritten with the dataset elsewhere, cut short or
    removed between ct.hdf5 and the first read (or a loader worker's): named, never rows of the new file."""
    path = h5(tmp_path / "data.h5", x=(ROWS, layout))
    data = ct.hdf5(path, "x")
    copy = pickle.dumps(data)  # what a loader worker gets
    if change == "rewritten":
        h5(path, x=(ROWS + 100, layout))
    elif change == "moved":
        with h5py.File(path, "w") as f:
            f["x"] = ROWS + 100
    elif change == "truncated":
        os.truncate(path, 100)
    else:
        os.remove(path)
    for reader in (data, pickle.loads(copy)):
        with pytest.raises(
            RuntimeError, match=r"ct\.hdf5: .*data\.h5 .*changed since ct\.hdf5 opened it.*ct\.hdf5 again"
        ):
            reader.read_batch([1])


def test_a_file_read_before_it_changed_is_not_checked_again(tmp_path):
    """The check costs one stat per file and process, when it maps or opens: reads after it cost nothing more."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    data = ct.hdf5(path, "x")
    assert data.read_batch([2]).tolist() == [ROWS[2].tolist()]
    os.utime(path, ns=(1, 1))  # a new mtime: too late to matter for the map already open
    assert data.read_batch([3]).tolist() == [ROWS[3].tolist()]


def test_a_dropped_dataset_closes_its_file_at_once(tmp_path):
    """The h5py handle of a dataset no longer used is closed when it is dropped (no reference cycle keeps it
    open until a garbage collection), so the same process can write the file again."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {"chunks": (4, 3)}))
    data = ct.hdf5(path, "x")
    assert data.read_batch([2]).tolist() == [ROWS[2].tolist()]
    gc.disable()
    try:
        del data
        with h5py.File(path, "a") as f:  # "file is already open for read-only" while the handle lives
            f["y"] = ROWS
    finally:
        gc.enable()


@pytest.mark.parametrize("bad", [[1.5], [True, False], [[1, 2], [3, 4]], np.array([1.0]), torch.tensor([0.5])])
@pytest.mark.parametrize("augmented", [False, True])
def test_index_lists_that_are_not_integers_are_refused(tmp_path, bad, augmented):
    """read_batch (and __getitems__ with an augment, which goes through it) never rounds, casts or flattens."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    data = ct.hdf5(path, "x", augment=(lambda b, g: b) if augmented else None)
    with pytest.raises(TypeError, match=r"HDF5Dataset\.read_batch: indices must be a flat list of ints"):
        data.read_batch(bad)
    with pytest.raises(TypeError, match=r"HDF5Dataset.*must be .*int"):
        data.__getitems__(bad)
    assert data.read_batch(np.array([3, 1], dtype=np.int32)).tolist() == ROWS[[3, 1]].tolist()
    assert data.read_batch(torch.tensor([3, -1])).tolist() == ROWS[[3, -1]].tolist()


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**70])
def test_a_seed_beyond_64_bits_is_refused_when_made(tmp_path, seed):
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    with pytest.raises(ValueError, match=r"ct\.hdf5: seed must be a 64-bit int \(-2\*\*63 <= seed < 2\*\*63\), got"):
        ct.hdf5(path, "x", seed=seed, augment=lambda b, g: b)
    for edge in (2**63 - 1, -(2**63)):
        assert ct.hdf5(path, "x", seed=edge, augment=lambda b, g: b).read_batch([1]).shape == (1, 3)


def test_a_path_that_is_not_a_path_or_a_directory_is_named(tmp_path):
    with pytest.raises(TypeError, match=r"ct\.hdf5: file must be a path \(str or os\.PathLike\), got 123"):
        ct.hdf5(123, "x")
    with pytest.raises(IsADirectoryError, match=r"ct\.hdf5: .* is a directory, not an HDF5 file"):
        ct.hdf5(tmp_path, "x")


def test_a_dataset_of_object_references_is_named_as_such(tmp_path):
    path = tmp_path / "refs.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("refs", (len(ROWS),), dtype=h5py.ref_dtype)
    with pytest.raises(TypeError, match=r"'refs' .*object references.*torch has no tensor for") as refused:
        ct.hdf5(path, "refs")
    assert "variable-length" not in str(refused.value)


@pytest.mark.parametrize("rows", [1, 3])
def test_an_augment_that_changes_the_number_of_rows_is_named(tmp_path, rows):
    """Items are split from the augmented batch: one row per index asked, or a clear error."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    data = ct.hdf5(path, ["x"], augment=lambda b, g: [torch.cat([b[0], b[0]])[:rows]])
    with pytest.raises(ValueError, match=rf"augment returned a batch of {rows} rows for 2 indices"):
        data.__getitems__([4, 5])


def test_the_bottleneck_report_advises_what_fits_an_hdf5_file(tmp_path):
    """Not "a ct.cache store already: make its augment cheaper" for a file h5py reads without any augment."""
    from composetrain.driver.monitor import _cheaper
    from composetrain.driver.reader import Reader

    path = h5(tmp_path / "data.h5", x=(ROWS, {}), packed=(ROWS, {"chunks": (4, 3), "compression": "gzip"}))

    def advice(data):
        return _cheaper(Reader(data, range(len(data)), 4, False, None, 0, lambda n: None, 1))

    slow = advice(ct.hdf5(path, ["x", "packed"]))
    assert "['packed'] through h5py" in slow and "contiguous" in slow and "augment" not in slow
    assert "ct.cache store" not in slow
    flat = advice(ct.hdf5(path, "x", augment=lambda b, g: b))
    assert "make its augment cheaper" in flat and "ct.cache store" not in flat and "memory map" in flat
    assert "augment" not in advice(ct.hdf5(path, "x"))


def _noise(batch, generator):
    x, y = batch
    return [x + torch.rand(x.shape, generator=generator, dtype=x.dtype), y]


def _as_dict(items):
    return {"x": torch.stack([x for x, _ in items]), "y": torch.stack([y for _, y in items])}


@pytest.mark.parametrize("workers", [0, 1])
def test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn(tmp_path, workers):
    """With a collate_fn ct.run read items (__getitems__) with the dataset's own epoch, never set: every epoch
    drew the same "random" augmentation. Now as without one: the batch read whole, then the collate_fn."""
    path = h5(tmp_path / "data.h5", x=(np.zeros((8, 2)), {}), y=(np.arange(8), {"chunks": (4,)}))
    data = ct.hdf5(path, ["x", "y"], augment=_noise, seed=4)
    runs = {}
    for name, collate in (("none", None), ("default", torch.utils.data.default_collate), ("dict", _as_dict)):
        seen = []

        def step(model, batch, seen=seen, collate=collate):
            assert isinstance(batch, dict) == (collate is _as_dict)  # the collate_fn given made it
            x = batch["x"] if isinstance(batch, dict) else batch[0]
            seen.append(x.clone())
            return model(x).sum()

        model = torch.nn.Linear(2, 1).double()
        ct.run(
            step,
            ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.0)),
            data,
            batch_size=8,
            epochs=3,
            shuffle=False,
            collate_fn=collate,
            num_workers=workers,
            progress=False,
        )
        runs[name] = seen
    assert len(runs["none"]) == 3 and not torch.equal(runs["none"][0], runs["none"][1])
    for name in ("default", "dict"):
        assert all(torch.equal(a, b) for a, b in zip(runs[name], runs["none"], strict=True)), name


def test_a_file_another_process_writes_is_named_with_the_fix(tmp_path):
    """HDF5 locks a file open for writing: h5py's "unable to lock file, errno = 11" becomes what to do."""
    import subprocess
    import sys

    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    holder = "import h5py, sys, time; f = h5py.File(sys.argv[1], 'a'); print('open', flush=True); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", holder, str(path)], stdout=subprocess.PIPE, text=True) as writer:
        try:
            assert writer.stdout.readline().strip() == "open"
            with pytest.raises(BlockingIOError, match=r"ct\.hdf5: .*data\.h5 is open for writing in another process"):
                ct.hdf5(path, "x")
        finally:
            writer.kill()


def test_a_file_cut_short_before_ct_hdf5_is_named(tmp_path):
    """HDF5 refuses a file shorter than its superblock says: named by ct.hdf5, with the file, not h5py alone."""
    path = h5(tmp_path / "data.h5", x=(np.zeros((1000, 10)), {}))
    os.truncate(path, os.path.getsize(path) - 1000)
    with pytest.raises(OSError, match=r"ct\.hdf5: h5py cannot open .*data\.h5: .*truncated file"):
        ct.hdf5(path, "x")


def test_caching_an_augmented_dataset_is_refused_not_one_draw_frozen(tmp_path):
    """ct.cache of a ct.hdf5 (or ct.cache) dataset made with augment= would store one draw of the augmentation
    for every epoch; refused with the fix, before anything is written. Without augment= it caches the rows."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {"chunks": (4, 3)}))
    with pytest.raises(ValueError, match=r"cache: the dataset augments its batches.*give augment= to ct\.cache"):
        ct.cache(ct.hdf5(path, ["x", "x"], augment=_noise), tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()
    cached = ct.cache(ct.hdf5(path, ["x", "x"]), tmp_path / "store", augment=_noise, progress=False)
    assert cached.__getitems__([2])[0][0].tolist() != ROWS[2].tolist()  # augmented as read, never stored
    assert ct.cache(ct.hdf5(path, ["x", "x"]), tmp_path / "store", progress=False)[2][0].tolist() == ROWS[2].tolist()


def _augmented_run(data, loader, epochs=3, folder=None, max_steps=None):
    seen = []

    def step(model, batch):
        seen.append(batch[0].clone())
        return model(batch[0]).sum()

    model = torch.nn.Linear(2, 1).double()
    ct.run(
        step,
        ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.0)),
        loader,
        epochs=epochs,
        progress=False,
        checkpoint_dir=folder,
        max_steps=max_steps,
    )
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_given_to_ct_run_augments_per_epoch(tmp_path, workers):
    """ct.run sets the epoch of an augmented dataset under a DataLoader it was given (it never did: every epoch
    drew the same augmentation), as a loop calling data.set_epoch(epoch) would; a resumed run draws alike."""
    from torch.utils.data import DataLoader

    path = h5(tmp_path / "data.h5", x=(np.zeros((8, 2)), {}), y=(np.arange(8), {"chunks": (4,)}))
    data = ct.hdf5(path, ["x", "y"], augment=_noise, seed=1)
    seen = _augmented_run(data, DataLoader(data, batch_size=4, num_workers=workers))
    want = [data.read_batch(i, epoch)[0] for epoch in range(3) for i in ([0, 1, 2, 3], [4, 5, 6, 7])]
    assert len(seen) == 6 and all(torch.equal(a, b) for a, b in zip(seen, want, strict=True))
    _augmented_run(data, DataLoader(data, batch_size=4, num_workers=workers), folder=tmp_path / "ck", max_steps=3)
    resumed = _augmented_run(data, DataLoader(data, batch_size=4, num_workers=workers), folder=tmp_path / "ck")
    assert all(torch.equal(a, b) for a, b in zip(resumed, want[3:], strict=True)) and len(resumed) == 3


def test_a_dataloader_whose_persistent_workers_never_see_the_epoch_is_refused(tmp_path):
    from torch.utils.data import DataLoader

    path = h5(tmp_path / "data.h5", x=(np.zeros((8, 2)), {}), y=(np.arange(8), {}))
    data = ct.hdf5(path, ["x", "y"], augment=_noise)
    loader = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match=r"persistent workers .*never see the epoch.*persistent_workers=False"):
        _augmented_run(data, loader)
    assert loader._iterator is None  # refused before any worker started

"""The fourth data adversary: ct.cache, ct.hdf5 and ct.run's loader over them, attacked where the three earlier
rounds did not look. The tests above the line ``# regression cases`` fail on the code they were written against
(one per finding, worst first); the ones below it are odd inputs that pass, kept so that they stay passing."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import subprocess
import threading
import time
import tracemalloc
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Listed, batches_seen, labelled, reads_back
from torch.utils.data import ConcatDataset, Dataset, Subset, default_collate, random_split

import composetrain as ct
from composetrain.data.cache import _write
from composetrain.data.equal import same_item
from composetrain.data.layout import Field
from composetrain.data.store_files import write_manifest
from composetrain.data.writer import fingerprint, sampled

h5py = pytest.importorskip("h5py")


class Fixed(Dataset[Any]):
    """100 items ``tensor([i])``; with ``fixed=False`` item 3 is wrong (-999): a preprocessing bug whose fix changes
    one item the fingerprint does not look at (3 is not in ``sampled(100)``)."""

    def __init__(self, fixed: bool = True) -> None:
        self.fixed = fixed

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> Any:
        return torch.tensor([-999.0 if (i == 3 and not self.fixed) else float(i)])


def _user_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- worst kind: a user's file overwritten or deleted, data served that differs from the dataset's -------------


def test_a_lock_file_longer_than_a_holders_line_is_never_truncated(tmp_path: Path) -> None:
    """The bug (a user's file overwritten): ``check_lock_owner`` reads the first 512 bytes and takes the file for a
    holder's when they match ``process <digits> on <up to 255 non-newline bytes>``; it never looks at the size. A
    2.5 kB file of someone else's whose first 512 bytes read so is truncated to ``process <pid> on <host>``.
    (Contrived content: the digits are unbounded, so 245 or more of them fill the 512 bytes.) The fix: a holder's
    file is exactly its line: ``info.st_size == len(text) <= 300``, and a bounded pid (``[0-9]{1,10}``)."""
    lock = tmp_path / ".store.lock"
    mine = b"process " + b"1" * 300 + b" on " + b"h" * 200 + b"\nMY NOTES, NOT A LOCK\n" * 100
    lock.write_bytes(mine)
    try:
        ct.cache(labelled(6), tmp_path / "store", progress=False)
    except ValueError as e:
        assert "lock file" in str(e)
    assert lock.read_bytes() == mine


def test_a_store_just_written_is_not_swapped_for_another_writers_before_it_is_opened(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The bug (another dataset's items served, no refusal): ``cache`` releases the lock after publishing, then
    opens the store with ``written=True``, which skips the comparison with the dataset. A process that takes the lock
    in that gap with ``rebuild=True`` (another dataset of the same type, length and key) publishes its own store, and
    this call returns it as its own. Here the gap is filled in-process at the moment another process would; the
    fix: open the written store while still holding the lock (the ``_open(..., written=True)`` inside ``with
    _locked``)."""
    import composetrain.data.cache as cache_module

    path, opened = tmp_path / "store", cache_module._open
    mine, theirs = Fixed(fixed=True), Fixed(fixed=False)
    busy = []

    def other_process_in_the_gap(*args: Any, written: bool = False, **kwargs: Any) -> Any:
        if written and not busy:  # the lock was just released: another rank / job rebuilds now
            busy.append(1)
            ct.cache(theirs, path, rebuild=True, progress=False, num_workers=0)
        return opened(*args, written=written, **kwargs)

    monkeypatch.setattr(cache_module, "_open", other_process_in_the_gap)
    try:
        got = ct.cache(mine, path, progress=False, num_workers=0)
    except (ValueError, FileNotFoundError, RuntimeError):
        return  # refused: fine
    assert same_item(got[3], mine[3]), f"served {got[3]} for item 3, the dataset has {mine[3]}"


def _external(tmp_path: Path, monkeypatch: Any) -> tuple[Path, Path]:
    """main/main.h5 whose 'x' (chunked, read by h5py) and 'c' (contiguous, mapped) are external links to the
    relative 'part.h5', found through the working folder a/ (no part.h5 beside main.h5); b/part.h5 another file
    of that name."""
    for sub, value in (("a", 1.0), ("b", 2.0), ("main", None)):
        (tmp_path / sub).mkdir()
        if value is not None:
            with h5py.File(tmp_path / sub / "part.h5", "w") as f:
                f.create_dataset("x", data=np.full((8, 2), value, np.float32), chunks=(2, 2), compression="gzip")
                f.create_dataset("c", data=np.full((8, 2), value, np.float32))
    main = tmp_path / "main" / "main.h5"
    with h5py.File(main, "w") as f:
        f["x"] = h5py.ExternalLink("part.h5", "/x")
        f["c"] = h5py.ExternalLink("part.h5", "/c")
    monkeypatch.chdir(tmp_path / "a")
    return main, tmp_path / "b" / "part.h5"


@pytest.mark.parametrize("change", ["a file of that name appears beside main.h5", "the process changes folder"])
def test_rows_behind_an_external_link_come_from_the_file_ct_hdf5_found(
    tmp_path: Path, monkeypatch: Any, change: str
) -> None:
    """The bug (rows of another file served, mixed with the right file's, no refusal): a mapped dataset behind an
    external link is read from the file ``ct.hdf5`` found (``file_of``, stamped), but one h5py reads goes through
    the link again at every batch (``opened()[key]``), and HDF5 resolves a relative link anew each time: after a
    ``chdir``, or once a file of that name appears beside the linking file, 'x' comes from b/part.h5 while 'c' still
    comes from a/part.h5: items (2., 1.) that neither file holds. The fix: read h5py's datasets from the file the
    link led to when ``ct.hdf5`` opened it (open ``file_of(dset)``, read ``dset.name`` there), or refuse when the
    link now resolves elsewhere."""
    main, other = _external(tmp_path, monkeypatch)
    data = ct.hdf5(main, ["x", "c"])
    first = data.read_batch([0, 1])
    assert float(first[0][0, 0]) == 1.0 and float(first[1][0, 0]) == 1.0
    if change == "the process changes folder":
        monkeypatch.chdir(other.parent)
    else:
        other.rename(main.parent / "part.h5")
    try:
        again = data.read_batch([0, 1])
    except (RuntimeError, ValueError, FileNotFoundError):
        return  # refused: fine
    assert same_item(again, first), f"'x' now reads {again[0][0].tolist()}, 'c' {again[1][0].tolist()}"


@pytest.mark.parametrize("change", ["a file of that name appears beside main.h5", "the process changes folder"])
def test_rows_of_a_virtual_dataset_come_from_the_sources_ct_hdf5_checked(
    tmp_path: Path, monkeypatch: Any, change: str
) -> None:
    """The bug (rows of another file served, no refusal): ``virtual_files`` finds a virtual dataset's relative source
    (here through the working folder) and stamps that file, but h5py resolves the source again at every read: after
    a ``chdir``, or once a file of that name appears beside the virtual dataset's file, the rows come from that
    other file while the stamped one is unchanged. The fix: refuse at a read when a source now resolves to another
    file than the stamped one (``_found`` again, one ``isfile`` per source), or pin HDF5's virtual prefix to the
    folder found."""
    for sub, value in (("a", 1.0), ("b", 2.0), ("main", None)):
        (tmp_path / sub).mkdir()
        if value is not None:
            with h5py.File(tmp_path / sub / "part.h5", "w") as f:
                f.create_dataset("x", data=np.full((8, 2), value, np.float32))
    layout = h5py.VirtualLayout(shape=(8, 2), dtype=np.float32)
    layout[:] = h5py.VirtualSource("part.h5", "x", shape=(8, 2))
    main = tmp_path / "main" / "main.h5"
    with h5py.File(main, "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    monkeypatch.chdir(tmp_path / "a")
    data = ct.hdf5(main, "v")
    first = data.read_batch([0])
    assert float(first[0, 0]) == 1.0
    if change == "the process changes folder":
        monkeypatch.chdir(tmp_path / "b")
    else:
        (tmp_path / "b" / "part.h5").rename(main.parent / "part.h5")
    try:
        again = data.read_batch([0])
    except (RuntimeError, ValueError, FileNotFoundError):
        return
    assert same_item(again, first), f"rows now read {again.tolist()}, from a file ct.hdf5 never checked"


def test_rebuild_after_waiting_for_an_older_write_writes_this_datasets_items(tmp_path: Path) -> None:
    """The bug (the items asked to be written again are not, no refusal): ``rebuild=True`` that had to wait for
    another writer maps that writer's store whenever the fingerprint items agree (``fresh = waited or ...``), even
    when that writer began before this call asked for a rebuild. A job writing with a preprocessing bug, and a job
    started with the bug fixed and ``rebuild=True``, end with the second training on the buggy item 3. The fix:
    after waiting, take the other store only if it was begun after this call started (``started <= created``),
    else write again (or compare every item, as ``verify=True`` does, before taking it)."""
    path = tmp_path / "store"
    fixed, buggy = Fixed(fixed=True), Fixed(fixed=False)
    assert 3 not in sampled(100)
    fd = os.open(tmp_path / ".store.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another job has been writing the buggy items since before this call
    begun = time.time() - 1.0
    got: list[Any] = []
    errors: list[BaseException] = []

    def rebuild() -> None:
        try:
            got.append(ct.cache(fixed, path, rebuild=True, progress=False, num_workers=0))
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=rebuild)
    thread.start()
    time.sleep(0.3)
    origin = {"type": f"{__name__}.Fixed", "length": 100, "key": None, "created": begun}
    _write(buggy, path, origin, 0, False)
    os.close(fd)
    thread.join(60)
    assert not errors, errors
    assert same_item(got[0][3], fixed[3]), f"rebuild=True served {got[0][3]} for item 3; the dataset has {fixed[3]}"


def test_a_users_folder_named_like_a_writers_temporary_keeps_its_files(tmp_path: Path) -> None:
    """The bug (a user's files deleted, a manifest that is not ct.cache's among them): a folder beside the store
    named ``.NAME.tmp-<12 hex digits>`` is taken for a dead writer's and ``remove_store(..., temporary=True)``
    removes its ``manifest.json`` without reading it and every ``f<n>.npy``: the rule that a folder holding another
    tool's manifest is never touched does not hold here. (Contrived name: the writer's own pattern.) The fix: a
    leftover's ``manifest.json`` only when it is a cache manifest, and only arrays a writer of it made (its
    manifest's, or any ``f<n>[os].npy`` only when there is no manifest)."""
    theirs = tmp_path / ".store.tmp-0123456789ab"
    theirs.mkdir()
    (theirs / "manifest.json").write_text('{"shards": ["a-000.tar"], "count": 40}')
    (theirs / "f0.npy").write_bytes(b"their array")
    (theirs / "README").write_text("theirs")
    before = _user_files(tmp_path)
    ct.cache(labelled(6), tmp_path / "store", progress=False)
    after = _user_files(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before, sorted(set(before) - set(after))


def test_a_field_the_manifest_does_not_call_ragged_owns_no_offsets_or_shapes(tmp_path: Path) -> None:
    """The bug (a user's files deleted): ``store._own`` names a field's arrays by its position and by ``"shape":
    null`` alone, not by the names the field gives: a manifest whose field 1 says ``shape: null`` but names no
    ``offsets`` or ``shapes`` (``null``) owns ``f1o.npy`` and ``f1s.npy``, and ``rebuild=True`` deletes a user's
    files of those names. README: a store's own files are "the arrays its manifest's fields name". (Needs a
    hand-damaged manifest.) The fix: own exactly the names a field gives (``data``, ``offsets``, ``shapes``) that
    are the writer's names for its position."""
    path = tmp_path / "store"
    ct.cache(labelled(6), path, progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["item"]["tuple"][1]["field"]["shape"] = None
    (path / "manifest.json").write_text(json.dumps(manifest))
    for name in ("f1o.npy", "f1s.npy"):
        (path / name).write_bytes(b"the user's " + name.encode())
    with contextlib.suppress(ValueError):
        ct.cache(labelled(6), path, rebuild=True, progress=False)
    leftover = [p for p in tmp_path.rglob("f1[os].npy")]
    assert sorted(p.read_bytes() for p in leftover) == [b"the user's f1o.npy", b"the user's f1s.npy"]


# ---- high: unbounded memory, bare exceptions ---------------------------------------------------------------------


class _Ragged(Dataset[Any]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.zeros(1 + i % 2, dtype=torch.int8)


def test_opening_a_ragged_store_takes_memory_independent_of_its_length(tmp_path: Path) -> None:
    """The bug (memory linear in the length, at every open, in every process): ``_check_ragged`` loads a ragged
    field's offsets and shapes whole and makes several temporaries of their size (``np.diff``, ``astype(float64)``,
    ``np.prod`` twice, the comparisons): about 80 bytes per item, 250 MB for a 50 MB store of 3 million short
    sequences here, 8 GB per rank for 10**8 documents. ``test_opening_a_store_takes_memory_independent_of_its_length``
    holds this for fixed shapes only. The fix: check the offsets and shapes in blocks of the memory map (a million
    rows at a time). (The store is the one ``write_store`` makes, written here from its parts.)"""
    n, path = 10**6, tmp_path / "store"
    path.mkdir()
    sizes = 1 + np.arange(n, dtype=np.int64) % 2
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype("<i8")
    np.save(path / "f0.npy", np.zeros(int(offsets[-1]), np.int8))
    np.save(path / "f0o.npy", offsets)
    np.save(path / "f0s.npy", sizes.reshape(n, 1).astype("<i8"))
    kept = sampled(n)
    origin = {"type": f"{__name__}._Ragged", "length": n, "key": None, "created": 1.0,
              "fingerprint": {"items": kept, "blake2b": fingerprint(_Ragged(n)[i] for i in kept)}}  # fmt: skip
    write_manifest(path, Field("tensor", "int8", None, "f0", "f0o", "f0s"), n, origin)
    del sizes, offsets
    ct.cache(_Ragged(10), tmp_path / "warm", progress=False)  # imports and first calls, outside the count
    tracemalloc.start()
    try:
        cached = ct.cache(_Ragged(n), path, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert same_item(cached[n - 1], _Ragged(n)[n - 1])
    assert peak < 8 << 20, f"opening a ragged store of {n} items took {peak / 2**20:.0f} MiB"


def test_an_hdf5_integer_type_numpy_has_no_dtype_for_is_named(tmp_path: Path) -> None:
    """The bug (a bare TypeError, no function named, no fix): a dataset of 3-byte integers (24-bit samples, as
    some instruments write) or 16-byte ones: ``dset.dtype`` raises h5py's "data type '<i3' not understood" from
    inside ``_check_dtype``. The fix: catch it there and say it as the other unreadable types are said (the name,
    the file, the fix)."""
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        t = h5py.h5t.STD_I32LE.copy()
        t.set_size(3)
        t.set_precision(24)
        h5py.h5d.create(f.id, b"i24", t, h5py.h5s.create_simple((5,)))
    with pytest.raises((TypeError, ValueError)) as e:
        ct.hdf5(path, "i24")
    assert "ct.hdf5" in str(e.value) and "i24" in str(e.value)


def test_an_hdf5_dataset_whose_filter_is_not_installed_is_named(tmp_path: Path) -> None:
    """The bug (a bare OSError at the first read, no function named, no fix): a chunked dataset compressed with a
    filter this process lacks (zstd, blosc from ``hdf5plugin``, not imported) opens, and its first batch raises
    h5py's "Can't synchronously read data (can't open directory (/usr/local/lib/plugin) ...)". The fix: at
    ``ct.hdf5``, ``h5py.h5z.filter_avail(id)`` for each filter of each dataset: refuse naming the dataset, the
    filter and the fix (``pip install hdf5plugin`` and ``import hdf5plugin``)."""
    path = tmp_path / "zstd.h5"
    with h5py.File(path, "w") as f:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_chunk((4, 2))
        plist.set_filter(32015, h5py.h5z.FLAG_OPTIONAL, ())  # zstd's registered id, not available here
        dset = h5py.h5d.create(f.id, b"x", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((20, 2)), dcpl=plist)
        for c in range(5):  # chunks written as zstd would have written them: the filter is needed to read them
            dset.write_direct_chunk((c * 4, 0), np.arange(8, dtype=np.float32).tobytes(), filter_mask=0)
    assert not h5py.h5z.filter_avail(32015)
    with pytest.raises(Exception) as e:
        ct.hdf5(path, "x").read_batch([0, 1])
    assert "ct.hdf5" in str(e.value) and "filter" in str(e.value), str(e.value)


class _Interleaved(Dataset[Any]):
    """40 items; reading item 20 runs, once, a second writer of the same store at ``path`` (the other node, where
    flock is not honoured)."""

    def __init__(self, path: Path) -> None:
        self.path, self.done = path, False

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        if i == 20 and not self.done:
            self.done = True
            ct.cache(Listed([torch.full((3,), float(j)) for j in range(40)]), self.path, progress=False, num_workers=0)
        return torch.full((3,), float(i))


def test_a_second_writer_where_flock_is_not_honoured_leaves_the_first_whole(tmp_path: Path, monkeypatch: Any) -> None:
    """The bug (a bare FileNotFoundError, or a store published cut short): README says that where flock is not
    honoured (some NFS setups) two nodes may both write, and "each publishes by an atomic rename, so the store
    stays whole". But a writer that gets the lock removes every ``.NAME.tmp-<hex>`` folder as a dead writer's
    (``leftovers``), the other node's live one too: that writer fails with "[Errno 2] No such file or directory:
    '.../.store.tmp-<hex>/f0.npy'" from ``NpyWriter.flush``, or (seen with processes, at another timing) goes on
    into a new file, writes its header over the first rows and publishes a store whose ``f0.npy`` is cut short
    (refused at every open after). The fix: remove a temporary folder only when its writer is gone (its name
    holds the host and pid, or it holds an flock'd file of its own), and check every array's size before the
    rename."""
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: None)  # both nodes take the lock
    path = tmp_path / "store"
    data = _Interleaved(path)
    try:
        got = ct.cache(data, path, progress=False, num_workers=0)
    except Exception as e:
        assert str(e).startswith("cache:"), f"{type(e).__name__}: {e}"
        return
    assert all(same_item(got[i], torch.full((3,), float(i))) for i in range(40))


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_the_working_folder_seen_through_a_bind_mount_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    """The bug (the working folder taken away): ``_check_place`` compares real paths, which a bind mount does not
    resolve: a process whose working folder is /x/view, a bind mount of the empty folder /x/store, that caches to
    /x/store renames its own working folder away and removes it (``os.getcwd()`` then raises FileNotFoundError).
    The fix: compare the identity (``st_dev``, ``st_ino``) of the path with that of the working folder and each of
    its parents."""
    store, view = tmp_path / "store", tmp_path / "view"
    store.mkdir()
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(store), str(view)], capture_output=True).returncode:
        pytest.skip("bind mounts are not allowed here")
    try:
        monkeypatch.chdir(view)
        try:
            ct.cache(labelled(4), store, progress=False)
        except ValueError as e:
            assert "working folder" in str(e)
        assert os.path.samefile(os.getcwd(), view)
    finally:
        monkeypatch.chdir(tmp_path)
        subprocess.run(["umount", "-l", str(view)], check=False)


# ---- low: unclear messages ----------------------------------------------------------------------------------------


def test_a_numpy_scalar_then_a_zero_dim_array_is_said_as_such(tmp_path: Path) -> None:
    """The bug (an unclear message): item 0 ``np.float32(1)``, item 1 ``np.array(1, np.float32)`` is refused with
    "item 1 is a numpy of <f4, and in item 0 a numpy of <f4": both halves read alike. The fix: say scalar or
    0-dim array (``leaf_kind``'s fourth value)."""
    with pytest.raises(ValueError) as e:
        ct.cache(Listed([np.float32(1), np.array(1, np.float32)]), tmp_path / "store", progress=False)
    assert "scalar" in str(e.value), str(e.value)


def test_read_batch_given_a_slice_names_itself(tmp_path: Path) -> None:
    """The bug (a bare TypeError): ``read_batch(slice(0, 3))`` raises Python's "'slice' object is not iterable"
    (from ``_indices``' fallback loop), naming neither ``read_batch`` nor what to give. The fix: refuse what is not a
    sequence of ints in ``_indices``' words (``read_batch(range(0, 3))``)."""
    data = ct.cache(labelled(6), tmp_path / "store", progress=False)
    with pytest.raises(TypeError) as e:
        data.read_batch(slice(0, 3))  # type: ignore[arg-type]
    assert "read_batch" in str(e.value), str(e.value)


# ---- regression cases: odd inputs that are handled -----------------------------------------------------------------

NT = collections.namedtuple("NT", "a b")


@dataclasses.dataclass
class DC:
    a: int


ROUND_TRIPS = {
    "nested empty containers": [([], {}, ((),)), ([], {}, ((),))],
    "a str subclass key": [{np.str_("a"): 1}] * 2,
    "NFC, NFD and a lone surrogate as keys": [
        {"\ud800": 1, unicodedata.normalize("NFC", "é"): 2, unicodedata.normalize("NFD", "é"): 3}
    ]
    * 2,
    "nan, -0.0, inf": [float("nan"), -0.0, math.inf],
    "np.float64 scalars": [np.float64(1.5), np.float64(-0.0)],
    "0-dim arrays": [np.array(3.0), np.array(4.0)],
    "Fortran-ordered arrays": [np.asfortranarray(np.arange(6.0).reshape(2, 3))] * 3,
    "float16 scalars": [np.float16(1.5)] * 2,
    "uint64 scalar 2**64-1": [np.uint64(2**64 - 1)] * 2,
    "bfloat16": [torch.linspace(-2, 2, 3).bfloat16()] * 2,
    "float8 e4m3fn": [torch.linspace(-2, 2, 3).to(torch.float8_e4m3fn)] * 2,
    "float8 e5m2fnuz": [torch.linspace(-2, 2, 3).to(torch.float8_e5m2fnuz)] * 2,
    "float8 e8m0fnu": [torch.ones(3).to(torch.float8_e8m0fnu)] * 2,
    "float4 e2m1fn x2": [torch.tensor([1, 2, 255], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)] * 2,
    "complex32": [torch.tensor([1 + 2j, -0.5j]).to(torch.complex32)] * 2,
    "uint16, uint32, uint64": [
        (
            torch.tensor([1, 65535], dtype=torch.uint16),
            torch.tensor([2**32 - 1], dtype=torch.uint32),
            torch.tensor([2**63], dtype=torch.uint64),
        )
    ]
    * 2,
    "an expanded (stride 0) tensor": [torch.ones(1).expand(4)] * 2,
    "a negative view": [torch.tensor([1 + 2j, 3 - 1j]).conj().imag] * 2,
    "ints at the edges of int64": [2**63 - 1, -(2**63)],
    "300 leaves": [list(range(300))] * 2,
    "empty tuples": [(), ()],
    "ragged with an empty first item": [torch.zeros(0), torch.ones(3)],
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_odd_items_read_back_as_the_dataset_gives_them(tmp_path: Path, name: str) -> None:
    items = ROUND_TRIPS[name]
    cached = ct.cache(Listed(items), tmp_path / "store", progress=False)
    assert reads_back(cached, items)
    assert reads_back(ct.cache(Listed(items), tmp_path / "store", progress=False, verify=True), items)
    if not cached.ragged and name != "uint64 scalar 2**64-1":  # default_collate cannot stack NumPy uint64 scalars
        assert same_item(cached.read_batch(range(len(items))), default_collate(items))


REFUSED = {
    "dict keys in another order": [{"a": 1, "b": 2}, {"b": 3, "a": 4}],
    "an OrderedDict": [collections.OrderedDict(a=1)] * 2,
    "a namedtuple": [NT(1, 2)] * 2,
    "a dataclass": [DC(1)] * 2,
    "an empty tuple then an empty list": [([], {}, ((),)), ([], {}, ([],))],
    "empty containers' keys in another order": [{"a": {}, "b": []}, {"b": [], "a": {}}],
    "a tuple then a list": [(1, 2), [1, 2]],
    "an int key": [{1: 2}] * 2,
    "a bool then an int": [True, 1],
    "np.bool_ then bool": [np.bool_(True), True],
    "datetime64": [np.datetime64("2020-01-01")] * 2,
    "a Parameter": [torch.nn.Parameter(torch.ones(2))] * 2,
    "a str": ["a", "b"],
    "None": [None, None],
    "bytes": [b"a", b"b"],
    "dimensions that change": [torch.zeros(3), torch.zeros(1, 3)],
    "a dtype that changes": [torch.zeros(3), torch.zeros(3, dtype=torch.float64)],
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_items_that_cannot_come_back_as_given_are_refused_by_index(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=r"^cache: item [01]"):
        ct.cache(Listed(REFUSED[name]), tmp_path / "store", progress=False, num_workers=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".store.lock"]  # nothing published, nothing left


ITEMS = [(torch.tensor([float(i)]), i) for i in range(10)]
ACCEPTED = {
    "a range": (range(2, 5), [2, 3, 4]),
    "a generator": ((i for i in [3, 1]), [3, 1]),
    "int8 negatives": (np.array([-1, -10], np.int8), [9, 0]),
    "uint64 in range": (np.array([9, 0], np.uint64), [9, 0]),
    "int32 tensor with a negative": (torch.tensor([3, -1], dtype=torch.int32), [3, 9]),
    "0-dim tensors, ints and NumPy ints mixed": ([torch.tensor(1), 2, np.int64(3)], [1, 2, 3]),
    "one-element tensors": ([torch.tensor([1]), torch.tensor([2])], [1, 2]),
    "an IntEnum": ([__import__("enum").IntEnum("E", {"A": 3}).A], [3]),
    "an object array of ints": (np.array([1, 2], dtype=object), [1, 2]),
    "nothing": ([], []),
    "an empty float array": (np.array([]), []),
}
OUT_OF_RANGE = {
    "uint8 255": np.array([1, 255], np.uint8),
    "uint64 2**64-1": np.array([2**64 - 1], np.uint64),
    "uint32 tensor 2**32-1": torch.tensor([2**32 - 1], dtype=torch.uint32),
    "uint64 tensor 2**64-1": torch.tensor([2**64 - 1], dtype=torch.uint64),
    "int8 -11": np.array([-11], np.int8),
    "2**63": [2**63],
    "-(2**63)": [-(2**63)],
    "2**64": [2**64],
}
NOT_INTS = {
    "bools": [True, False],
    "a bool array": np.array([True, False]),
    "a bool tensor": torch.tensor([True, False]),
    "floats": [1.0, 2.0],
    "float16 integers": np.array([1, 2], np.float16),
    "a nested list": [[1, 2]],
    "complex": [1j],
    "None among ints": [1, None],
    "a Fraction": [__import__("fractions").Fraction(2, 1)],
    "a Decimal": [__import__("decimal").Decimal(2)],
    "datetime64": np.array(["2020-01-01"], dtype="datetime64[D]"),
    "a float8 tensor": torch.tensor([1.0]).to(torch.float8_e4m3fn),
}


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: Any) -> tuple[Any, Any]:
    folder = tmp_path_factory.mktemp("indices")
    plain = ct.cache(Listed(ITEMS), folder / "store", progress=False)
    return plain, ct.cache(Listed(ITEMS), folder / "store", progress=False, augment=lambda b, g: b)


@pytest.mark.parametrize("name", list(ACCEPTED))
@pytest.mark.parametrize("augmented", [False, True])
def test_index_lists_read_the_rows_a_list_gives(indexed: Any, name: str, augmented: bool) -> None:
    given, rows = ACCEPTED[name]
    if name == "a generator":
        given = (i for i in rows)
    batch = indexed[augmented].read_batch(given)
    assert batch[1].tolist() == rows
    if rows:
        assert same_item(batch, default_collate([ITEMS[i] for i in rows]))


@pytest.mark.parametrize("name", list(OUT_OF_RANGE))
@pytest.mark.parametrize("augmented", [False, True])
def test_indices_past_either_end_are_an_index_error(indexed: Any, name: str, augmented: bool) -> None:
    with pytest.raises(IndexError, match="CachedDataset"):
        indexed[augmented].read_batch(OUT_OF_RANGE[name])
    with pytest.raises(IndexError, match="CachedDataset"):
        indexed[augmented].__getitems__(OUT_OF_RANGE[name])


@pytest.mark.parametrize("name", list(NOT_INTS))
@pytest.mark.parametrize("augmented", [False, True])
def test_indices_that_are_not_ints_are_refused_naming_the_dataset(indexed: Any, name: str, augmented: bool) -> None:
    with pytest.raises(TypeError, match="CachedDataset"):
        indexed[augmented].read_batch(NOT_INTS[name])


USERS_NAMES = ["f7.npy", "f0o.npy", "f1s.npy", "f2.npy", "f00.npy", "F0.npy", "manifest.json.bak", ".keep"]


@pytest.mark.parametrize("name", USERS_NAMES)
def test_a_users_file_in_a_store_stops_a_rebuild_and_is_kept(tmp_path: Path, name: str) -> None:
    path = tmp_path / "store"
    ct.cache(labelled(6), path, progress=False)
    (path / name).write_bytes(b"the user's")
    with pytest.raises(ValueError, match=f"not the store's \\({name.replace('.', '[.]')}\\)"):
        ct.cache(labelled(6), path, rebuild=True, progress=False)
    assert (path / name).read_bytes() == b"the user's"


def test_a_ragged_fields_neighbours_are_not_its_own(tmp_path: Path) -> None:
    path = tmp_path / "store"
    items = [(torch.zeros(i % 3 + 1), i) for i in range(6)]
    ct.cache(Listed(items), path, progress=False)
    (path / "f1o.npy").write_bytes(b"the user's")
    with pytest.raises(ValueError, match=r"f1o\.npy"):
        ct.cache(Listed(items), path, rebuild=True, progress=False)


def test_a_manifest_listing_fewer_fields_than_arrays_disowns_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "store"
    ct.cache(labelled(6), path, progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["item"] = manifest["item"]["tuple"][0]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"f1\.npy"):
        ct.cache(labelled(6), path, rebuild=True, progress=False)
    assert (path / "f1.npy").exists()


def test_a_store_nested_inside_a_store_stops_the_outer_ones_rebuild_not_its_open(tmp_path: Path) -> None:
    outer = tmp_path / "store"
    ct.cache(labelled(6), outer, progress=False)
    ct.cache(labelled(4, seed=1), outer / "inner", progress=False)
    assert reads_back(ct.cache(labelled(6), outer, progress=False), labelled(6))
    with pytest.raises(ValueError, match="inner"):
        ct.cache(labelled(6), outer, rebuild=True, progress=False)
    assert reads_back(ct.cache(labelled(4, seed=1), outer / "inner", progress=False), labelled(4, seed=1))


@pytest.mark.parametrize(
    "content",
    [
        b"process 1 on host\nmy notes",
        b"process " + b"7" * 300 + b" on x\n" + b"y" * 300,
        b"process 1 on h" + b"\0" * 600,
        b"process 1 on " + b"a" * 256,
    ],
)
def test_a_lock_file_with_more_than_a_holders_line_is_refused_and_kept(tmp_path: Path, content: bytes) -> None:
    (tmp_path / ".store.lock").write_bytes(content)
    with pytest.raises(ValueError, match=r"not one ct\.cache made"):
        ct.cache(labelled(4), tmp_path / "store", progress=False)
    assert (tmp_path / ".store.lock").read_bytes() == content


def test_an_empty_file_at_the_lock_path_is_used_and_never_written(tmp_path: Path) -> None:
    (tmp_path / ".store.lock").write_bytes(b"")
    assert reads_back(ct.cache(Listed(labelled(4)), tmp_path / "store", progress=False), labelled(4))
    assert (tmp_path / ".store.lock").read_bytes() == b""


@pytest.mark.parametrize("where", ["cwd", ".", "..", "../cwd", "a link to cwd", "the parent of cwd's child"])
def test_every_spelling_of_the_working_folder_is_refused(tmp_path: Path, monkeypatch: Any, where: str) -> None:
    (tmp_path / "cwd" / "child").mkdir(parents=True)
    os.symlink(tmp_path / "cwd", tmp_path / "link")
    monkeypatch.chdir(tmp_path / ("cwd/child" if where == "the parent of cwd's child" else "cwd"))
    path = {"cwd": tmp_path / "cwd", ".": ".", "..": "..", "../cwd": "../cwd", "a link to cwd": tmp_path / "link",
            "the parent of cwd's child": tmp_path / "cwd"}[where]  # fmt: skip
    with pytest.raises(ValueError, match="working folder"):
        ct.cache(labelled(4), path, progress=False)
    assert os.path.samefile(os.getcwd(), tmp_path / ("cwd/child" if where == "the parent of cwd's child" else "cwd"))


def test_stores_named_in_nfc_and_nfd_are_two_stores(tmp_path: Path) -> None:
    a, b = labelled(5), labelled(5, seed=1)
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    ct.cache(Listed(a), tmp_path / nfc, progress=False)
    ct.cache(Listed(b), tmp_path / nfd, progress=False)
    assert reads_back(ct.cache(Listed(a), tmp_path / nfc, progress=False, verify=True), a)
    assert reads_back(ct.cache(Listed(b), tmp_path / nfd, progress=False, verify=True), b)
    with pytest.raises(ValueError, match="differ"):
        ct.cache(Listed(a), tmp_path / nfd, progress=False)


def test_a_store_copied_or_moved_opens_there_and_one_swapped_in_is_refused(tmp_path: Path) -> None:
    import shutil

    a, b = labelled(6), labelled(6, seed=1)
    ct.cache(Listed(a), tmp_path / "store", progress=False)
    shutil.copytree(tmp_path / "store", tmp_path / "copy")
    assert reads_back(ct.cache(Listed(a), tmp_path / "copy", progress=False, verify=True), a)
    opened = ct.cache(Listed(a), tmp_path / "copy", progress=False)
    ct.cache(Listed(b), tmp_path / "other", progress=False)
    os.rename(tmp_path / "copy", tmp_path / "moved")
    os.rename(tmp_path / "other", tmp_path / "copy")  # another dataset's store where it was opened
    with pytest.raises(RuntimeError, match="changed since"):
        opened[0]
    assert reads_back(ct.cache(Listed(a), tmp_path / "moved", progress=False, verify=True), a)


def _h5(path: Path, name: str, tid: Any, values: np.ndarray, memtype: Any) -> None:
    with h5py.File(path, "a") as f:
        dset = h5py.h5d.create(f.id, name.encode(), tid, h5py.h5s.create_simple(values.shape))
        dset.write(h5py.h5s.ALL, h5py.h5s.ALL, values, mtype=memtype)


def _bf16_layout() -> Any:
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)
    t.set_size(2)
    t.set_ebias(127)
    t.set_precision(16)
    return t


def _no_norm() -> Any:
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_norm(h5py.h5t.NORM_NONE)
    return t


HDF5_TYPES = {
    "a 16-bit float of bfloat16's layout": (_bf16_layout, np.linspace(-3, 3, 10).astype(np.float32), "NATIVE_FLOAT"),
    "a float without an implied bit": (_no_norm, np.linspace(1, 3, 10).astype(np.float32), "NATIVE_FLOAT"),
    "an 8-bit bitfield": (lambda: h5py.h5t.STD_B8LE, np.arange(10, dtype=np.uint8), "NATIVE_B8"),
    "a big-endian half": (lambda: h5py.h5t.IEEE_F16BE, np.linspace(0, 1, 10).astype(np.float32), "NATIVE_FLOAT"),
}


@pytest.mark.parametrize("name", list(HDF5_TYPES))
def test_hdf5_types_h5py_converts_read_as_h5py_reads_them(tmp_path: Path, name: str) -> None:
    make, values, memtype = HDF5_TYPES[name]
    path = tmp_path / "odd.h5"
    _h5(path, "x", make(), values, getattr(h5py.h5t, memtype))
    with h5py.File(path, "r") as f:
        want = f["x"][()]
    data = ct.hdf5(path, "x")
    order = [9, 0, 3, 3, -1]
    got = data.read_batch(order).numpy()
    assert got.dtype == want.dtype.newbyteorder("=") and np.array_equal(got, want[order])
    assert all(np.array_equal(data[i].numpy(), want[i]) for i in range(len(want)))


def test_hdf5_types_torch_has_no_tensor_for_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("compound", data=np.zeros(4, dtype=[("a", "<f4"), ("b", "<i4")]))
        f.create_dataset("vlen str", data=["a"] * 4, dtype=h5py.string_dtype())
        f.create_dataset("fixed str", data=np.array([b"ab"] * 4))
        f.create_dataset("opaque", data=np.zeros(4, dtype="V4"))
        f.create_dataset("refs", data=[f["opaque"].ref] * 4, dtype=h5py.ref_dtype)
        f.create_dataset("region refs", data=[f["opaque"].regionref[0:1]] * 4, dtype=h5py.regionref_dtype)
        h5py.h5d.create(
            f.id, b"array type", h5py.h5t.array_create(h5py.h5t.IEEE_F32LE, (3,)), h5py.h5s.create_simple((4,))
        )
        f.create_dataset("no dataspace", data=h5py.Empty("f4"))
    for name in ["compound", "vlen str", "fixed str", "opaque", "refs", "region refs", "array type", "no dataspace"]:
        with pytest.raises((TypeError, ValueError), match=f"ct.hdf5: '{name}'"):
            ct.hdf5(path, name)


def test_hdf5_behind_links_with_userblocks_big_endian_and_chunks_mixed_reads_as_h5py(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 3)).astype(np.float32)
    y, z = rng.integers(0, 9, 30).astype(">i2"), rng.standard_normal(30).astype(">f8")
    with h5py.File(tmp_path / "part.h5", "w", userblock_size=4096) as f:
        f.create_dataset("x", data=x)
        f.create_dataset("z", data=z, chunks=(7,), compression="gzip")
    with h5py.File(tmp_path / "main.h5", "w", userblock_size=512) as f:
        f["x"] = h5py.ExternalLink("part.h5", "/x")
        f["z"] = h5py.ExternalLink(str(tmp_path / "part.h5"), "/z")
        f.create_dataset("y", data=y)
    data = ct.hdf5(tmp_path / "main.h5", {"x": "x", "y": "y", "z": "z"})
    assert data.mapped == ["x", "y"] and data.read_by_h5py == ["z"]
    order = [29, 0, 5, 5, -1, 17]
    batch = data.read_batch(order)
    assert np.array_equal(batch["x"].numpy(), x[order])
    assert np.array_equal(batch["y"].numpy(), y[order].astype("<i2"))
    assert np.array_equal(batch["z"].numpy(), z[order].astype("<f8"))


WRAPPERS = {
    "a Subset with repeats and a negative index": lambda d, e: Subset(d, [5, 0, 22, 3, 3, -1, 7, 11, 19, 2]),
    "a ConcatDataset of three": lambda d, e: ConcatDataset([d, e, d]),
    "a random_split": lambda d, e: random_split(d, [0.6, 0.4], generator=torch.Generator().manual_seed(1))[1],
    "a Subset of a ConcatDataset": lambda d, e: Subset(ConcatDataset([e, d]), list(range(29, -1, -2))),
}


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("workers", [0, 2])
def test_runs_over_wrapped_stores_see_the_wrapped_datasets_batches(tmp_path: Path, wrapper: str, workers: int) -> None:
    first, second = labelled(23), labelled(7, seed=1)
    stores = [ct.cache(Listed(x), tmp_path / n, progress=False) for x, n in ((first, "a"), (second, "b"))]
    options = {"epochs": 2, "batch_size": 4, "shuffle": True, "drop_last": workers == 2, "seed": 5}
    want = batches_seen(WRAPPERS[wrapper](Listed(first), Listed(second)), num_workers=0, **options)
    got = batches_seen(WRAPPERS[wrapper](*stores), num_workers=workers, **options)
    assert len(got) == len(want) and all(same_item(a, b) for a, b in zip(got, want, strict=True))


def test_auto_switching_to_workers_mid_epoch_over_an_augmented_store_resumes_bit_exactly(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """num_workers="auto" made to choose 2 workers after 3 batches (the switch happens inside the first epoch), a
    run stopped at update 5 and resumed: the batches seen equal the uninterrupted run's."""
    import composetrain.driver.reader as reader

    monkeypatch.setattr(reader, "choose_workers", lambda fetch, step, spare: (2, "chosen by the test"))
    monkeypatch.setattr(reader, "MEASURED", 2)

    def noise(batch: Any, generator: torch.Generator) -> Any:
        x, y = batch
        return [x + torch.randn(x.shape, generator=generator, dtype=x.dtype), y]

    store = ct.cache(Listed(labelled(22)), tmp_path / "store", progress=False, augment=noise)
    options = {"batch_size": 4, "shuffle": True, "seed": 3, "checkpoint_every": 1, "num_workers": "auto"}
    straight = batches_seen(store, epochs=2, checkpoint_dir=tmp_path / "a", **options)
    stopped = batches_seen(store, epochs=2, checkpoint_dir=tmp_path / "b", max_steps=5, **options)
    rest = batches_seen(store, epochs=2, checkpoint_dir=tmp_path / "b", **options)
    assert len(stopped + rest) == len(straight)
    assert all(same_item(a, b) for a, b in zip(stopped + rest, straight, strict=True))

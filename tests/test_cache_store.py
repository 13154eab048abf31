"""ct.cache's store identity: what counts as a store (and is never replaced otherwise), which items a second
open reads to tell the store's data from other data, the files a process maps being the ones opened, where a
store can be published, and edge values (an empty dataset, ints at the edge of int64)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
import re
import shutil
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Listed, labelled, reads_back
from torch.utils.data import DataLoader, Dataset

import composetrain as ct
from composetrain.data.equal import same_item
from composetrain.data.store_files import StoreError, write_manifest
from composetrain.data.writer import fingerprint, sampled


class Logged(Dataset[Any]):
    """The given items, recording the index of every __getitem__ call."""

    def __init__(self, items: list[Any]) -> None:
        self.items, self.read = items, []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        self.read.append(i)
        return self.items[i]


def _items(n: int = 40, seed: int = 0) -> Logged:
    g = torch.Generator().manual_seed(seed)
    return Logged([(torch.randn(3, generator=g), i % 5) for i in range(n)])


def _beside(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


# issue 29 item 1: a folder holding its own manifest.json is not a store, rebuild or not


@pytest.mark.parametrize(
    "manifest",
    [
        '{"shards": ["a-000.tar", "a-001.tar"], "count": 40}',
        "not json at all",
        "[1, 2]",
        '{"format": 1, "length": 40, "item": {}}',
        '{"format": "webdataset", "length": 40, "item": {}, "origin": {}}',
        '{"format": null, "length": null, "item": null, "origin": null}',
        '{"format": true, "length": 1, "item": 1, "origin": 1}',
    ],
)
@pytest.mark.parametrize("rebuild", [False, True])
def test_a_folder_with_a_manifest_of_its_own_is_never_replaced(tmp_path: Path, manifest: str, rebuild: bool) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(manifest)
    (shards / "a-000.tar").write_bytes(b"data")
    data = _items()
    with pytest.raises(ValueError, match=r"cache: .*shards.* is not a cache store.*choose another path") as e:
        ct.cache(data, shards, rebuild=rebuild, progress=False)
    assert "pass rebuild=True" not in str(e.value)  # the advice that would delete it
    assert sorted(p.name for p in shards.iterdir()) == ["a-000.tar", "manifest.json"]
    assert (shards / "manifest.json").read_text() == manifest and (shards / "a-000.tar").read_bytes() == b"data"
    assert data.read == [] and _beside(shards) in (["shards"], [".shards.lock", "shards"])


@pytest.mark.parametrize(
    "how",
    [
        "added to a store",
        "a file named almost as an array",
        "a link named as an array",
        "manifest copied into a folder",
        "store copied into a folder",
        "store inside a store",
    ],
)
def test_rebuild_never_removes_files_that_are_not_the_stores_own(tmp_path: Path, how: str) -> None:
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    folder = tmp_path / "photos" if "copied" in how else path
    if how == "added to a store":
        (path / "notes.txt").write_text("mine")
        (path / "sub").mkdir()
        (path / "sub" / "x.txt").write_text("mine too")
        mine = ["f0.npy", "f1.npy", "manifest.json", "notes.txt", "sub"]
    elif how == "a file named almost as an array":
        (path / "f0.npz").write_bytes(b"mine")
        mine = ["f0.npy", "f0.npz", "f1.npy", "manifest.json"]
    elif how == "a link named as an array":
        os.symlink(tmp_path / "elsewhere", path / "f7.npy")
        mine = ["f0.npy", "f1.npy", "f7.npy", "manifest.json"]
    elif how == "store inside a store":
        ct.cache(_items(6), path / "inner", progress=False)
        mine = [".inner.lock", "f0.npy", "f1.npy", "inner", "manifest.json"]
    else:
        folder.mkdir()
        (folder / "a.jpg").write_bytes(b"jpeg")
        names = ["manifest.json"] if how == "manifest copied into a folder" else ["manifest.json", "f0.npy", "f1.npy"]
        for name in names:
            shutil.copy(path / name, folder / name)
        mine = sorted(["a.jpg", *names])
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}
    with pytest.raises(ValueError, match="rebuild=True"):  # a store of other items: the advice is given, and then
        ct.cache(_items(40, seed=1), folder, progress=False)
    with pytest.raises(ValueError, match=r"cache: .* holds files that are not the store's .*never removes") as e:
        ct.cache(_items(40, seed=1), folder, rebuild=True, progress=False)
    assert "pass rebuild=True" not in str(e.value)
    assert sorted(p.name for p in folder.iterdir()) == mine
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()} == before
    assert not [n for n in os.listdir(folder.parent) if ".tmp-" in n]


def test_a_file_put_in_the_store_as_it_is_replaced_is_kept(tmp_path: Path, monkeypatch: Any) -> None:
    from composetrain.data import cache as cache_module

    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    check, calls = cache_module.check_replaceable, []

    def then_added(where: Path, replacing: bool = True) -> None:  # the last check passes; then the user adds a file
        check(where, replacing)
        calls.append(where)
        if len(calls) == 3:
            (where / "late.txt").write_text("mine")

    monkeypatch.setattr(cache_module, "check_replaceable", then_added)
    with pytest.warns(UserWarning, match=r"late\.txt"):
        ct.cache(_items(40, seed=1), path, rebuild=True, progress=False)
    kept = [p for p in tmp_path.iterdir() if ".tmp-old-" in p.name]
    assert len(kept) == 1 and sorted(os.listdir(kept[0])) == ["late.txt"]  # the old store's own files removed
    assert (kept[0] / "late.txt").read_text() == "mine"
    ct.cache(_items(40, seed=1), tmp_path / "other", progress=False)  # another writer's clean-up keeps it too
    ct.cache(_items(40, seed=1), path, rebuild=True, progress=False)
    assert (kept[0] / "late.txt").read_text() == "mine"


def test_a_manifest_replaced_under_the_lock_is_not_renamed_away(tmp_path: Path, monkeypatch: Any) -> None:
    from composetrain.data import cache as cache_module

    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    write_store = cache_module.write_store

    def exported(*args: Any) -> None:  # someone put their own export at the path while this one wrote
        write_store(*args)
        shutil.rmtree(path)
        path.mkdir()
        (path / "manifest.json").write_text('{"export": true}')

    monkeypatch.setattr(cache_module, "write_store", exported)
    with pytest.raises(ValueError, match="is not a cache store"):
        ct.cache(data, path, rebuild=True, progress=False)
    assert (path / "manifest.json").read_text() == '{"export": true}' and _beside(path) == [".store.lock", "store"]


def test_a_damaged_store_is_still_a_store_and_is_rebuilt_on_request(tmp_path: Path) -> None:
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    (path / "f0.npy").write_bytes((path / "f0.npy").read_bytes()[:-4])
    with pytest.raises(ValueError, match=r"truncated or altered.*pass rebuild=True"):
        ct.cache(data, path, progress=False)
    assert same_item(ct.cache(data, path, rebuild=True, progress=False)[7], data.items[7])


# issue 29 item 2: a store of other items (same type and length) is refused by default


def test_a_second_open_reads_only_the_recorded_fingerprint_items(tmp_path: Path) -> None:
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False, num_workers=0)
    assert data.read == list(range(40))  # written: every item once
    recorded = json.loads((path / "manifest.json").read_text())["origin"]["fingerprint"]["items"]
    assert recorded == sampled(40) and {0, 20, 39} <= set(recorded) and 3 < len(recorded) <= 8
    data.read.clear()
    again = ct.cache(data, path, progress=False)
    assert data.read == recorded and len(again) == 40  # each recorded item once, in order; never iterated


@pytest.mark.parametrize("how", ["seed", "one sampled item", "preprocessing"])
def test_a_store_of_other_items_is_refused_by_default(tmp_path: Path, how: str) -> None:
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    if how == "seed":
        other = _items(seed=1)
    elif how == "one sampled item":  # not the first, middle or last: one of the seeded others
        extra = next(i for i in sampled(40) if i not in (0, 20, 39))
        other = Logged(list(data.items))
        other.items[extra] = (data.items[extra][0] + 1e-3, data.items[extra][1])
    else:
        other = Logged([(x.double(), y) for x, y in data.items])
    with pytest.raises(ValueError, match=r"items \[.*\] of the dataset differ from those the store at .*rebuild=True"):
        ct.cache(other, path, progress=False)
    assert len(other.read) <= 8 and same_item(ct.cache(data, path, progress=False)[5], data.items[5])


class Reused(Dataset[Any]):
    """Every item in one buffer, filled anew at each read (a decoder's preallocated output)."""

    def __init__(self) -> None:
        self.buffer = torch.zeros(3)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        self.buffer.fill_(float(i))
        return self.buffer


def test_items_that_share_one_buffer_are_fingerprinted_as_read(tmp_path: Path) -> None:
    path = tmp_path / "store"
    ct.cache(Reused(), path, progress=False)
    again = ct.cache(Reused(), path, progress=False)  # not refused as "altered since it was written"
    assert all(torch.equal(again[i], torch.full((3,), float(i))) for i in range(40))
    ct.cache(Reused(), path, verify=True, progress=False)


def test_verify_compares_every_item(tmp_path: Path) -> None:
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    hidden = next(i for i in range(40) if i not in sampled(40))
    other = Logged(list(data.items))
    other.items[hidden] = (data.items[hidden][0] * 2, data.items[hidden][1])
    assert len(ct.cache(other, path, progress=False)) == 40  # the fingerprint's items are alike
    with pytest.raises(ValueError, match=rf"item {hidden} of the store at .* differs from the dataset's"):
        ct.cache(other, path, progress=False, verify=True)
    data.read.clear()
    ct.cache(data, path, progress=False, verify=True)
    assert set(data.read) == set(range(40))


@pytest.mark.parametrize("flag", ["verify", "progress"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_verify_and_progress_must_be_bools(tmp_path: Path, flag: str, value: Any) -> None:
    data = _items()
    with pytest.raises(TypeError, match=rf"cache: {flag} must be True or False, got"):
        ct.cache(data, tmp_path / "store", **{flag: value})
    assert data.read == [] and list(tmp_path.iterdir()) == []


# issue 29 item 3: a process maps only the files the dataset was opened on


@pytest.mark.parametrize("change", ["rebuilt", "rebuilt shorter", "a file replaced", "removed"])
def test_a_store_changed_after_it_was_opened_is_refused_before_it_is_mapped(tmp_path: Path, change: str) -> None:
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    opened = ct.cache(data, path, progress=False)  # not read yet: nothing mapped
    shipped = pickle.dumps(opened)  # what a spawn/forkserver loader worker receives
    if change == "rebuilt":
        ct.cache(_items(seed=1), path, rebuild=True, progress=False)
    elif change == "rebuilt shorter":  # mapped with the shapes opened, it would not fit
        ct.cache(_items(10), path, rebuild=True, progress=False)
    elif change == "a file replaced":  # the same size, other bytes: only its identity tells
        other = path / "other.npy"
        other.write_bytes((path / "f0.npy").read_bytes()[:-4] + b"\x01\x02\x03\x04")
        os.replace(other, path / "f0.npy")
    else:
        shutil.rmtree(path)
    for copy in (opened, pickle.loads(shipped)):
        changed = rf"cache: the store at {re.escape(str(path))} changed since .* opened.*ct\.cache again"
        with pytest.raises(RuntimeError, match=changed):
            copy.read_batch([0])
        with pytest.raises(RuntimeError, match="changed since"):
            copy[0]


def test_a_process_that_mapped_the_store_keeps_reading_it_and_its_workers_are_refused_a_new_one(
    tmp_path: Path,
) -> None:
    data, path = _items(), tmp_path / "store"
    opened = ct.cache(data, path, progress=False)
    assert same_item(opened[3], data.items[3])  # mapped here: the old files stay mapped
    ct.cache(_items(seed=1), path, rebuild=True, progress=False)
    assert same_item(opened[3], data.items[3])
    with pytest.raises(RuntimeError, match="changed since"):
        pickle.loads(pickle.dumps(opened))[3]
    assert same_item(ct.cache(_items(seed=1), path, progress=False)[3], _items(seed=1).items[3])


def test_a_store_rebuilt_while_it_is_mapped_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    from composetrain.data.mapped import MappedDataset

    data, path = _items(), tmp_path / "store"
    opened = ct.cache(data, path, progress=False)
    arrays, raced = MappedDataset.arrays, []

    def rebuilt_meanwhile(self: Any) -> Any:  # after this process checked the files, before it mapped them
        if not raced:
            raced.append(1)
            ct.cache(_items(seed=1), path, rebuild=True, progress=False)
        return arrays(self)

    monkeypatch.setattr(MappedDataset, "arrays", rebuilt_meanwhile)
    with pytest.raises(RuntimeError, match="changed since"):
        opened.read_batch([0])
    assert raced and opened._arrays is None  # nothing of the new store kept mapped


def test_a_crafted_fingerprint_is_refused_rather_than_read_whole_or_skipped(tmp_path: Path) -> None:
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    for items in (list(range(40)), [], [0, 39], [39, 0, 20], [0, 20, 39, 40]):
        manifest["origin"]["fingerprint"]["items"] = items
        (path / "manifest.json").write_text(json.dumps(manifest))
        data.read.clear()
        with pytest.raises(ValueError, match=r"fingerprint of the items is missing or malformed.*rebuild=True"):
            ct.cache(data, path, progress=False)
        assert data.read == []


@pytest.mark.parametrize("change", ["item tree", "array bytes"])
def test_a_store_whose_files_were_altered_is_refused_at_open_not_served(tmp_path: Path, change: str) -> None:
    """The recorded fingerprint is of the dataset's items; the store's own items at those indices are compared
    too, so a manifest or array altered after writing (same dtypes and shapes) is refused, not served."""
    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    if change == "item tree":  # (x, y) read back as {"a": y}: every check of names, dtypes and shapes passes
        manifest = json.loads((path / "manifest.json").read_text())
        x, y = manifest["item"]["tuple"]
        manifest["item"] = {"dict": [["a", x], ["a", y]]}
        (path / "manifest.json").write_text(json.dumps(manifest))
    else:  # another array of the same dtype and shape written over the first field's
        header = len((path / "f0.npy").read_bytes()) - 40 * 3 * 4
        with open(path / "f0.npy", "r+b") as f:
            f.seek(header)
            f.write(bytes(40 * 3 * 4))
    with pytest.raises(ValueError, match=r"items \[0.*\] of the store at .* differ from the dataset's.*rebuild=True"):
        ct.cache(data, path, progress=False)
    assert same_item(ct.cache(data, path, rebuild=True, progress=False)[3], data.items[3])


def test_an_unchanged_store_maps_in_another_process(tmp_path: Path) -> None:
    data, path = _items(), tmp_path / "store"
    opened = ct.cache(data, path, progress=False)
    loader = DataLoader(opened, batch_size=8, num_workers=1)
    assert same_item(next(iter(loader)), DataLoader(data, batch_size=8).__iter__().__next__())


def test_an_open_racing_a_rebuild_maps_the_new_store_whole(tmp_path: Path, monkeypatch: Any) -> None:
    from composetrain.data import cache as cache_module

    data, path = _items(), tmp_path / "store"
    ct.cache(Logged(data.items[:30] + data.items[:10]), path, progress=False)  # a store of other items
    regions, raced = cache_module.regions, []

    def rebuilt_meanwhile(*args: Any) -> Any:  # another process rebuilds it between manifest and arrays
        if not raced:
            raced.append(1)
            ct.cache(data, path, rebuild=True, progress=False)
        return regions(*args)

    monkeypatch.setattr(cache_module, "regions", rebuilt_meanwhile)
    got = ct.cache(data, path, progress=False)
    assert raced and all(same_item(got[i], data.items[i]) for i in range(40))


# issue 29 item 6: a path that cannot be renamed into place is refused before any item is read


def test_a_mount_point_is_refused_before_an_item_is_read(tmp_path: Path, monkeypatch: Any) -> None:
    mount, data = tmp_path / "scratch", _items()
    mount.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) == str(mount))
    with pytest.raises(ValueError, match=r"cache: .*scratch is a mount point.*scratch/"):
        ct.cache(data, mount, progress=False)
    assert data.read == [] and mount.is_dir() and not list(mount.iterdir())
    assert _beside(mount) in (["scratch"], [".scratch.lock", "scratch"])


def test_a_folder_that_cannot_be_renamed_is_refused_before_an_item_is_read(tmp_path: Path, monkeypatch: Any) -> None:
    bound, data = tmp_path / "bound", _items()
    bound.mkdir()  # a bind mount, a container's volume: not a mount point to os.path.ismount
    rename = os.rename

    def busy(src: Any, dst: Any) -> None:
        if str(bound) in (os.fspath(src), os.fspath(dst)):
            raise OSError(errno.EBUSY, "Device or resource busy")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", busy)
    with pytest.raises(OSError, match=r"cache: .*bound cannot be replaced by a renamed folder .*Device or resource"):
        ct.cache(data, bound, progress=False)
    assert data.read == [] and bound.is_dir() and _beside(bound) == [".bound.lock", "bound"]


def test_an_empty_folder_at_the_path_becomes_the_store(tmp_path: Path) -> None:
    data, path = _items(), tmp_path / "store"
    path.mkdir()
    assert same_item(ct.cache(data, path, progress=False)[9], data.items[9])
    assert _beside(path) == [".store.lock", "store"]


# unclear answers made clear


def test_rebuild_after_waiting_for_a_writer_of_other_items_writes_its_own(tmp_path: Path) -> None:
    from composetrain.data.cache import _write

    data, path = _items(), tmp_path / "store"
    ct.cache(data, path, progress=False)
    fd = os.open(tmp_path / ".store.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process is rebuilding it, from other items
    mine = _items(seed=2)
    got: list[Any] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            got.append(ct.cache(mine, path, rebuild=True, progress=False))
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)
    other = _items(seed=3)
    _write(other, path, {"type": f"{__name__}.Logged", "length": 40, "key": None, "created": time.time()}, 0, False)
    os.close(fd)
    thread.join(60)
    assert not errors, errors
    assert all(same_item(got[0][i], mine.items[i]) for i in range(40))


def test_stale_temporaries_are_matched_by_name_not_by_glob(tmp_path: Path) -> None:
    data, path = _items(), tmp_path / "s[1]"
    others = tmp_path / ".s1.tmp-0123456789ab"  # store s1's writer, at work
    others.mkdir()
    (others / "f0.npy").write_bytes(b"partial")
    mine = tmp_path / ".s[1].tmp-ba9876543210"  # this store's writer, dead
    mine.mkdir()
    longer = tmp_path / ".s[1].tmp-old.tmp-0123456789ab"  # store "s[1].tmp-old"'s writer
    longer.mkdir()
    ct.cache(data, path, progress=False)
    assert others.is_dir() and (others / "f0.npy").read_bytes() == b"partial" and longer.is_dir()
    assert not mine.exists()


@pytest.mark.parametrize("kind", ["symlink", "folder", "fifo"])
def test_a_lock_file_that_is_not_a_file_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    lock, data = tmp_path / ".store.lock", _items()
    if kind == "symlink":
        (tmp_path / "elsewhere").write_text("keep")
        os.symlink(tmp_path / "elsewhere", lock)
    elif kind == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    with pytest.raises(ValueError, match=rf"cache: the lock file {re.escape(str(lock))} is a .*: remove it"):
        ct.cache(data, tmp_path / "store", progress=False)
    assert data.read == [] and not (tmp_path / "store").exists()
    assert kind != "symlink" or (tmp_path / "elsewhere").read_text() == "keep"


# issue 30: an empty dataset; ints at the edge of int64


def test_an_empty_dataset_makes_an_empty_store_that_opens_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "store"
    for attempt in range(2):  # written, then opened
        empty = Logged([])
        cached = ct.cache(empty, path, progress=False, verify=attempt == 1)
        assert len(cached) == 0 and empty.read == [] and list(DataLoader(cached, batch_size=4)) == []
        with pytest.raises(IndexError):
            cached[0]
    assert json.loads((path / "manifest.json").read_text())["length"] == 0
    with pytest.raises(ValueError, match="made from something else"):
        ct.cache(Logged([torch.ones(1)]), path, progress=False)


def test_ints_at_the_edge_of_int64_are_stored_exactly_and_one_past_is_refused(tmp_path: Path) -> None:
    edge = [(torch.ones(1), 2**63 - 1), (torch.zeros(1), -(2**63)), (torch.ones(1), 0)]
    cached = ct.cache(Logged(edge), tmp_path / "edge", progress=False)
    assert [cached[i][1] for i in range(3)] == [2**63 - 1, -(2**63), 0] and type(cached[0][1]) is int
    assert cached.read_batch([1, 0])[1].tolist() == [-(2**63), 2**63 - 1]
    for n, past in enumerate([2**63, -(2**63) - 1, 2**64]):
        items = Logged([edge[0], edge[1], (torch.ones(1), past)])
        with pytest.raises(ValueError, match=rf"cache: item 2\[1\] is the int {past}, outside int64"):
            ct.cache(items, tmp_path / f"past{n}", progress=False)
        assert sorted(p.name for p in tmp_path.iterdir() if f"past{n}" in p.name) == [f".past{n}.lock"]


# -- a user's files, the working folder, odd names and paths, opening a long store ------------------------------


def test_rebuild_never_removes_a_users_array_named_like_one_the_store_does_not_have(tmp_path: Path) -> None:
    """The bug (a user's files deleted): "the store's own files" are matched by name (``f<n>[os].npy``), not by
    the arrays its manifest names: a store of two fields (f0.npy, f1.npy) with the user's ``f7.npy`` and
    ``f0s.npy`` saved into it is replaced by rebuild=True, and both are deleted."""
    path, items = tmp_path / "store", labelled()
    ct.cache(Listed(items), path, progress=False)
    np.save(path / "f7.npy", np.arange(1000))  # an array of the user's ("f" for features), saved into the folder
    (path / "f0s.npy").write_bytes(b"mine")
    try:
        ct.cache(Listed(labelled(seed=1)), path, rebuild=True, progress=False)
    except ValueError as e:  # refused, naming them: as good
        assert "f7.npy" in str(e) and "f0s.npy" in str(e)
    kept = [p for p in tmp_path.rglob("f7.npy")] + [p for p in tmp_path.rglob("f0s.npy")]
    assert len(kept) == 2 and kept[1].read_bytes() == b"mine"
    assert np.array_equal(np.load(kept[0]), np.arange(1000))


def test_caching_into_the_working_folder_leaves_the_process_a_working_folder(tmp_path: Path, monkeypatch: Any) -> None:
    """The bug (the process's working folder removed): ``ct.cache(data, ".")`` in an empty working folder renames
    that folder away and removes it (the store is renamed into its place): os.getcwd() then raises
    FileNotFoundError, and every relative path after it (a checkpoint_dir="runs") fails."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    try:
        ct.cache(Listed(labelled()), ".", progress=False)
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
    """The bug (memory and time linear in the length at every open): ``_compare`` checks the fingerprint's item
    numbers with ``set(sampled) <= set(range(n))``, a set of every index: about 60 GB and a minute for a store of
    10**9 items, in every process at every open. (The store is the one ``write_store`` makes for items ``()``,
    written here from its parts: writing 10**6 items takes seconds.)"""
    n, path = 10**6, tmp_path / "store"
    path.mkdir()
    kept = sampled(n)
    origin = {
        "type": f"{__name__}._Empties",
        "length": n,
        "key": None,
        "created": 1.0,
        "fingerprint": {"items": kept, "blake2b": fingerprint(() for _ in kept)},
    }
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


@pytest.mark.parametrize("name", ["a\nb", "é😀", "s[1]*?", "bad\udcff", "-rf", " lead", "x" * 230])
def test_odd_store_names_are_written_and_opened_again(tmp_path: Path, name: str) -> None:
    items = labelled()
    assert reads_back(ct.cache(Listed(items), tmp_path / name, progress=False), items)
    assert reads_back(ct.cache(Listed(items), tmp_path / name, progress=False), items)


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
                ct.cache(Listed(labelled()), path, rebuild=rebuild, progress=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "afile").read_text() == "x" and (tmp_path / "d" / "keep.txt").read_text() == "mine"


def test_a_link_to_nowhere_writes_the_store_where_it_points(tmp_path: Path) -> None:
    os.symlink(tmp_path / "target", tmp_path / "dangling")
    items = labelled()
    ct.cache(Listed(items), tmp_path / "dangling", progress=False)
    assert (tmp_path / "dangling").is_symlink() and reads_back(
        ct.cache(Listed(items), tmp_path / "target", progress=False), items
    )


# -- crafted or damaged stores: refused before a byte is mapped, never running code -----------------------------------


class Pairs(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        return torch.full((2,), float(i)), [torch.ones(i % 3)]  # the list's tensor is ragged


class Marker:
    """Unpickling it would create a file: proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    ct.cache(Pairs(), path, progress=False)
    return path


def _manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())


def _crafted(path: Path, change: Any) -> None:
    manifest = _manifest(path)
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _fields(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        ((tag, body),) = node.items()
        if tag == "field":
            found.append(body)
        elif tag == "dict":
            for _, v in body:
                walk(v)
        else:
            for c in body:
                walk(c)

    walk(manifest["item"])
    return found


def _set(key: str, value: Any, n: int = 0) -> Any:
    return lambda m: _fields(m)[n].__setitem__(key, value)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: _crafted(p, _set("data", "../outside")), "not plain names"),
        (lambda p: _crafted(p, _set("data", "/etc/passwd")), "not plain names"),
        (lambda p: _crafted(p, _set("shape", [3])), r"holds float32 \(6, 2\); the manifest needs float32 \(6, 3\)"),
        (lambda p: _crafted(p, _set("dtype", "float64")), r"the manifest needs float64"),
        (lambda p: _crafted(p, _set("kind", "object")), "malformed"),
        (lambda p: _crafted(p, lambda m: m.__setitem__("format", 99)), "format version 99"),
        (lambda p: _crafted(p, lambda m: m.__setitem__("length", 7)), "items: the store holds 7"),
        (lambda p: _crafted(p, lambda m: m.__setitem__("item", {"eval": "x"})), "unknown node"),
        (lambda p: (p / "manifest.json").write_text("{not json"), "is not JSON"),
        (lambda p: (p / "f0.npy").write_bytes((p / "f0.npy").read_bytes()[:-4]), "truncated or altered"),
        (lambda p: (p / "f0.npy").write_bytes((p / "f0.npy").read_bytes() + b"\0" * 8), "truncated or altered"),
        # a valid file of other values: refused too, by the store's items at the fingerprint's indices
        (lambda p: np.save(p / "f0.npy", np.zeros((6, 2), np.float32), allow_pickle=False), "differ from the data"),
        (lambda p: np.save(p / "f0.npy", np.load(p / "f0.npy"), allow_pickle=False), None),  # rewritten, the same
        (lambda p: np.save(p / "f1o.npy", np.array([0, 1, 2, 99, 3, 4, 5], np.int64)), "offsets and shapes"),
        (lambda p: np.save(p / "f1s.npy", np.zeros((6, 1), np.int64)), "offsets and shapes"),
        (lambda p: (p / "f0.npy").unlink(), "cannot be opened"),
    ],
)
def test_a_crafted_or_damaged_store_is_refused(tmp_path: Path, damage: Any, message: str | None) -> None:
    path = _store(tmp_path)
    damage(path)
    if message is None:
        assert len(ct.cache(Pairs(), path, progress=False)) == 6
        return
    with pytest.raises(ValueError, match=message):
        ct.cache(Pairs(), path, progress=False)


def test_an_object_array_never_runs_code(tmp_path: Path) -> None:
    path = _store(tmp_path)
    marker = tmp_path / "ran"
    np.save(path / "f0.npy", np.array([Marker(str(marker))] * 12, dtype=object).reshape(6, 2), allow_pickle=True)
    with pytest.raises(StoreError, match=r"not a \.npy file this store wrote|the manifest needs"):
        ct.cache(Pairs(), path, progress=False)
    (path / "manifest.json").write_bytes(pickle.dumps(Marker(str(marker))))
    with pytest.raises(StoreError):
        ct.cache(Pairs(), path, progress=False)
    assert not marker.exists()


def test_symbolic_links_inside_a_store_are_refused(tmp_path: Path) -> None:
    path = _store(tmp_path)
    elsewhere = tmp_path / "elsewhere.npy"
    os.rename(path / "f0.npy", elsewhere)
    os.symlink(elsewhere, path / "f0.npy")
    with pytest.raises(StoreError, match="cannot be opened"):
        ct.cache(Pairs(), path, progress=False)
    os.unlink(path / "f0.npy")
    os.rename(elsewhere, path / "f0.npy")
    os.rename(path / "manifest.json", tmp_path / "m.json")
    os.symlink(tmp_path / "m.json", path / "manifest.json")
    with pytest.raises(StoreError, match="cannot be read"):
        ct.cache(Pairs(), path, progress=False)


def pad(items: list[Any]) -> Any:
    return torch.stack([x for x, _ in items]), torch.nn.utils.rnn.pad_sequence([r[0] for _, r in items], True)


def test_ragged_items_come_back_and_batches_need_a_collate_fn(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from composetrain.data.equal import same_item

    cached = ct.cache(Pairs(), tmp_path / "store", progress=False)
    assert [cached[i][1][0].shape for i in range(6)] == [(0,), (1,), (2,), (0,), (1,), (2,)]
    with pytest.raises(ValueError, match=r"needs? a collate_fn that pads"):
        cached.read_batch([0, 1])
    for got, want in zip(
        DataLoader(cached, batch_size=4, collate_fn=pad), DataLoader(Pairs(), 4, collate_fn=pad), strict=True
    ):
        assert same_item(got, want)

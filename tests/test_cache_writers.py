"""Who writes a ct.cache store, and what is made beside it: the lock file (never a user's file written into), names
that fit the file system, a disk that refuses them (said as a full disk is), writers killed at any file operation,
failing or racing (one whole store is left, never a mix, and no user's file touched)."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers import Listed, labelled, reads_back

import composetrain as ct
from composetrain.data.store_files import MANIFEST


@pytest.mark.parametrize(
    "how",
    [
        "a file of the user's",
        "a hard link to a file of the user's",
        "a hard link to a file of the user's that reads as a lock's holder",
    ],
)
def test_a_file_at_the_lock_files_path_is_never_overwritten(tmp_path: Path, how: str) -> None:
    """The bug (a user's file overwritten): the lock file ``.NAME.lock`` beside the store is opened without O_EXCL
    and then truncated and written with "process N on HOST"; a file the user has there (or a hard link to one,
    which the regular-file check lets through) loses its contents. (A file whose text is what a holder writes is
    rewritten only under one name: a lock file ct.cache left.)"""
    mine = tmp_path / ("notes.txt" if "link" in how else ".store.lock")
    text = "process 1 on elsewhere" if "holder" in how else "my notes\n"
    mine.write_text(text)
    if "link" in how:
        os.link(mine, tmp_path / ".store.lock")
    try:
        ct.cache(Listed(labelled()), tmp_path / "store", progress=False)
    except ValueError as e:  # refused, naming the file: as good
        assert ".store.lock" in str(e)
    assert mine.read_text() == text


@pytest.mark.parametrize("length", [238, 250, 255])
def test_a_store_name_too_long_for_the_files_beside_it_is_refused_before_anything_is_made(
    tmp_path: Path, length: int
) -> None:
    """The bug (bare exception, a file left): a name of 238 to 255 bytes is a valid folder name, but ``.NAME.lock``
    and ``.NAME.tmp-old-<hex>`` are not: a bare OSError "[Errno 36] File name too long" naming a file the user
    never gave, after the lock file was made (238 to 244 bytes)."""
    with pytest.raises(ValueError, match=r"cache: .*(long|255)"):
        ct.cache(Listed(labelled()), tmp_path / ("x" * length), progress=False)
    assert os.listdir(tmp_path) == []


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


@pytest.mark.parametrize(
    ("what", "err"),
    [("lock", errno.ENOSPC), ("temporary folder", errno.ENOSPC), ("lock", errno.EROFS), ("lock", errno.EACCES)],
)
def test_a_full_or_read_only_disk_before_the_first_item_is_a_cache_error_with_the_fix(
    tmp_path: Path, monkeypatch: Any, what: str, err: int
) -> None:
    """The bug (bare exception): a disk out of space or inodes, read-only, or not writable fails at the lock file
    or the temporary folder with a raw OSError naming ``.store.lock`` / ``.store.tmp-<hex>`` (files the user never
    named), without "cache:" or the fix the same failure gets one item later ("free space, or give a path on a
    larger disk"). Seen for real on a tmpfs mounted read-only and on one with nr_inodes=4."""
    _fail_on(monkeypatch, what, err)
    with pytest.raises(OSError, match=r"^(\[Errno \d+\] )?cache: .*store") as e:
        ct.cache(Listed(labelled()), tmp_path / "store", progress=False)
    assert e.value.errno == err


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
            ct.cache(Listed(items), path, rebuild=rebuild, num_workers=0, progress=False)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


@pytest.mark.parametrize("scenario", ["first write", "rebuild of another dataset's store", "into an empty folder"])
def test_a_writer_killed_at_any_file_operation_leaves_no_wrong_store_and_no_users_file_touched(
    tmp_path: Path, scenario: str
) -> None:
    old, new = labelled(6, seed=0), labelled(6, seed=1)
    for call in range(1, 40):
        folder = tmp_path / str(call)
        folder.mkdir()
        path = folder / "store"
        (folder / "user.txt").write_text("mine")
        if scenario.startswith("rebuild"):
            ct.cache(Listed(old), path, progress=False)
        elif scenario == "into an empty folder":
            path.mkdir()
        killed = _killed_at(call, path, new, rebuild=scenario.startswith("rebuild"))
        assert (folder / "user.txt").read_text() == "mine"
        if path.exists() and os.listdir(path):  # a store, complete: the old one or the new one, never a mix
            opened = [ct.cache(Listed(x), path, verify=True, progress=False) for x in (old, new) if _opens(x, path)]
            assert len(opened) == 1, f"killed at call {call}: the store at the path is neither whole store"
        again = ct.cache(Listed(new), path, rebuild=True, progress=False)
        assert reads_back(again, new)
        left = sorted(n for n in os.listdir(folder) if n not in ("store", ".store.lock", "user.txt"))
        assert left in ([], [".store.tmp-probe"]), left  # an empty folder of the user's, probed, is all
        if not killed:
            assert call > 5
            return
    raise AssertionError("the writer was still being killed at its 40th file operation")


def _opens(items: list[Any], path: Path) -> bool:
    try:
        ct.cache(Listed(items), path, verify=True, progress=False)
    except ValueError:
        return False
    return True


def test_a_dataset_that_raises_while_a_store_is_rebuilt_leaves_the_old_store_whole(tmp_path: Path) -> None:
    class Breaks(Listed):
        def __getitem__(self, i: int) -> Any:
            if i == 9:
                raise KeyError("decoder broke")
            return super().__getitem__(i)

    path, old = tmp_path / "store", labelled()
    ct.cache(Listed(old), path, progress=False)
    with pytest.raises(KeyError, match="decoder broke"):
        ct.cache(Breaks(labelled(seed=1)), path, rebuild=True, progress=False)
    assert reads_back(ct.cache(Listed(old), path, verify=True, progress=False), old)
    assert sorted(os.listdir(tmp_path)) == [".store.lock", "store"]


def test_two_writers_of_other_keys_at_once_leave_one_whole_store_and_refuse_the_other(tmp_path: Path) -> None:
    path, items = tmp_path / "store", labelled(40)
    pid = os.fork()
    if pid == 0:
        try:
            ct.cache(Listed(items), path, key="child", num_workers=0, progress=False)
        finally:
            os._exit(0)
    try:
        mine = ct.cache(Listed(items), path, key="parent", num_workers=0, progress=False)
    except ValueError as e:
        assert "key" in str(e)
        mine = None
    os.waitpid(pid, 0)
    key = json.loads((path / MANIFEST).read_text())["origin"]["key"]
    assert key in ("child", "parent") and (mine is None) == (key == "child")
    assert reads_back(ct.cache(Listed(items), path, key=key, verify=True, progress=False), items)
    assert sorted(os.listdir(tmp_path)) == [".store.lock", "store"]

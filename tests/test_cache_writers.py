"""Who writes a ct.cache store, and what is made beside it: the lock file (never a user's file written into), names
that fit the file system, a disk that refuses them (said as a full disk is), writers killed at any file operation,
failing or racing (one whole store is left, never a mix, and no user's file touched)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import Listed, gone_pid, labelled, reads_back, writers_folder
from torch.utils.data import Dataset

import composetrain as ct
from composetrain.data.equal import same_item
from composetrain.data.store import _host
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


# -- a lock file with more than a holder's line, a user's folder named like a writer's, a second writer where
# flock is not honoured -----------------------------------------------------------------------------------------


def _user_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


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


@pytest.mark.parametrize("named", ["as writers named it before", "as a dead writer's"])
def test_a_users_folder_named_like_a_writers_temporary_keeps_its_files(tmp_path: Path, named: str) -> None:
    """The bug (a user's files deleted, a manifest that is not ct.cache's among them): a folder beside the store
    named ``.NAME.tmp-<12 hex digits>`` is taken for a dead writer's and ``remove_store(..., temporary=True)``
    removes its ``manifest.json`` without reading it and every ``f<n>.npy``: the rule that a folder holding another
    tool's manifest is never touched does not hold here. (Contrived name: the writer's own pattern.) The fix: a
    leftover's ``manifest.json`` only when it is a cache manifest, and only arrays a writer of it made (its
    manifest's, or any ``f<n>[os].npy`` only when there is no manifest)."""
    theirs = tmp_path / ".store.tmp-0123456789ab"
    if named == "as a dead writer's":  # the name this library's writers give their folders now
        theirs = writers_folder(tmp_path / "store", gone_pid())
    theirs.mkdir()
    (theirs / "manifest.json").write_text('{"shards": ["a-000.tar"], "count": 40}')
    (theirs / "f0.npy").write_bytes(b"their array")
    (theirs / "README").write_text("theirs")
    before = _user_files(tmp_path)
    ct.cache(labelled(6), tmp_path / "store", progress=False)
    after = _user_files(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before, sorted(set(before) - set(after))


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


def test_a_writers_temporary_folder_is_removed_only_once_its_writer_is_gone(tmp_path: Path) -> None:
    """Where flock is not honoured two writers may work at once: a folder whose writer runs (this process, another
    process of this host) is kept; one of a writer on another host (which this one cannot ask) is kept and said;
    one whose writer ended is emptied of its arrays and removed."""
    path = tmp_path / "store"
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    other_host = "00000000" if _host() != "00000000" else "11111111"
    try:
        folders = {
            "running": writers_folder(path, running.pid),
            "this process": writers_folder(path, os.getpid(), tag="aaaaaaaaaaaa"),
            "another host": writers_folder(path, running.pid, host=other_host, tag="bbbbbbbbbbbb"),
            "dead": writers_folder(path, gone_pid(), tag="cccccccccccc"),
            "dead, old": writers_folder(path, gone_pid(), old=True),
        }
        for folder in folders.values():
            folder.mkdir()
            (folder / "f0.npy").write_bytes(b"partial")
        with pytest.warns(UserWarning, match=r"cache: .*bbbbbbbbbbbb.* writers on other hosts.*kept"):
            assert reads_back(ct.cache(Listed(labelled(6)), path, progress=False), labelled(6))
    finally:
        running.kill()
        running.wait()
    kept = {what for what, folder in folders.items() if (folder / "f0.npy").exists()}
    assert kept == {"running", "this process", "another host"}
    assert not folders["dead"].exists() and not folders["dead, old"].exists()


class _Meddled(Dataset[Any]):
    """40 items of 64 KiB (the writer appends them a MiB at a time); reading item 20 does ``what`` to the writer's
    temporary ``f0.npy``, as a second writer of the store would where flock is not honoured."""

    def __init__(self, folder: Path, what: str) -> None:
        self.folder, self.what, self.done = folder, what, False

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        if i == 20 and not self.done:
            self.done = True
            (tmp,) = [p for p in self.folder.iterdir() if p.name.startswith(".store.tmp-")]
            if self.what == "removed":
                (tmp / "f0.npy").unlink()
            else:
                os.truncate(tmp / "f0.npy", 1000)
        return torch.full((16384,), float(i))


@pytest.mark.parametrize(
    ("what", "said"),
    [("removed", r"f0\.npy was removed while this process wrote it"), ("truncated", r"is not whole .*f0\.npy")],
)
def test_a_writers_array_changed_by_another_process_is_never_published(tmp_path: Path, what: str, said: str) -> None:
    """An array removed under the writer is not written again from the middle (its header over later rows); one cut
    short is seen by the size check before the rename: the call fails, naming it, and nothing is published."""
    with pytest.raises(RuntimeError, match=rf"^cache: .*{said}"):
        ct.cache(_Meddled(tmp_path, what), tmp_path / "store", progress=False, num_workers=0)
    assert os.listdir(tmp_path) == [".store.lock"]


class _Nested(Dataset[Any]):
    """Six items; reading item 2 caches, in the same thread, the store this dataset is being written into."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        if i == 2:
            ct.cache(Listed(labelled(6)), self.path, progress=False, timeout=5)
        return torch.full((3,), float(i))


def test_a_cache_call_inside_another_of_the_same_store_is_refused_not_waited_for(tmp_path: Path) -> None:
    """An flock is held per open file: the inner call would wait for the outer one (this thread) until its timeout.
    It is refused at once, naming the store; the outer call then fails with it and publishes nothing."""
    with pytest.raises(RuntimeError, match=r"cache: this thread holds the lock of the store at .*store already"):
        ct.cache(_Nested(tmp_path / "store"), tmp_path / "store", progress=False, num_workers=0)
    assert os.listdir(tmp_path) == [".store.lock"]

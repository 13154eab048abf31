"""ct.write_tokens: token ids appended to a raw or .npy token file, durable and atomic: the file holds the old tokens
and the new ones in order, or (a call that fails) exactly what it held, with no temporary file left behind."""

import errno
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given

import composetrain as ct
from composetrain.data import token_writer


def listing(folder):
    return sorted(p.name for p in Path(folder).iterdir())


def read(path, dtype=np.uint16):
    return np.load(path).tolist() if str(path).endswith(".npy") else np.fromfile(path, dtype).tolist()


arrays = st.lists(st.lists(st.integers(0, 65535), max_size=20), max_size=4)


@given(st.lists(arrays, min_size=1, max_size=4), st.sampled_from(["bin", "npy"]), st.sampled_from(["list", "np", "pt"]))
def test_calls_append_their_arrays_in_order(calls, kind, form):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"train.{kind}"
        expected = []
        for documents in calls:
            given = {
                "list": documents,
                "np": [np.array(d, dtype=np.int64) for d in documents],
                "pt": [torch.tensor(d, dtype=torch.int64) for d in documents],
            }[form]
            expected += [t for d in documents for t in d]
            assert ct.write_tokens(given, path, dtype=np.uint16) == len(expected)
        assert read(path) == expected and listing(folder) == [path.name]
        if kind == "npy":
            assert np.load(path, mmap_mode="r").dtype == np.uint16
        if len(expected) > 3:
            data = ct.tokens(path, 3, dtype=np.uint16)
            assert data[0][0].tolist() == expected[:3]


def test_one_array_alone_and_a_generator_of_documents_are_written(tmp_path):
    path = tmp_path / "train.npy"
    assert ct.write_tokens(np.array([1, 2, 3]), path) == 3  # a new .npy file: uint16 unless given
    assert ct.write_tokens((np.full(n, n) for n in range(1, 4)), path) == 9
    assert read(path) == [1, 2, 3, 1, 2, 2, 3, 3, 3] and np.load(path).dtype == np.uint16
    assert ct.write_tokens(torch.tensor([7]), tmp_path / "wide.npy", dtype=np.uint32) == 1
    assert np.load(tmp_path / "wide.npy").dtype == np.uint32


def test_an_id_the_dtype_cannot_hold_changes_nothing(tmp_path):
    path = tmp_path / "train.bin"
    ct.write_tokens([[1, 2, 3]], path, dtype=np.uint16)
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    with pytest.raises(ValueError, match=r"^ct\.write_tokens: array 2 holds the id 65536 at position 1, which uint16 "):
        ct.write_tokens([[4], [5], [6, 65536]], path, dtype=np.uint16)
    with pytest.raises(
        ValueError, match=r"array 0 holds the negative id -1 at position 0, and token ids are 0 or more"
    ):
        ct.write_tokens([[-1, 9]], path, dtype=np.uint16)
    with pytest.raises(ValueError, match=r"array 1 holds the negative id -3 at position 2, .* labels, not in a token"):
        ct.write_tokens([[1], [4, 5, -3]], tmp_path / "signed.bin", dtype=np.int32)  # a signed dtype holds no more
    with pytest.raises(ValueError, match=r"holds the id 256 .* which uint8 cannot hold \(0 to 255\)"):
        ct.write_tokens([[256]], tmp_path / "small.bin", dtype=np.uint8)
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime
    assert listing(tmp_path) == ["train.bin"]  # no temporary file, and no new file for the refused small.bin


def test_an_error_in_the_callers_iterable_changes_nothing(tmp_path):
    path = tmp_path / "train.npy"
    ct.write_tokens([[1, 2]], path)
    before = path.read_bytes()

    def documents():
        yield [3, 4]
        raise KeyError("the tokenizer failed")

    with pytest.raises(KeyError, match="the tokenizer failed"):
        ct.write_tokens(documents(), path)
    assert path.read_bytes() == before and listing(tmp_path) == ["train.npy"]


def test_the_new_file_is_fsynced_before_it_replaces_the_old_and_the_folder_after(tmp_path, monkeypatch):
    path = tmp_path / "train.bin"
    ct.write_tokens([[1]], path, dtype=np.uint16)
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd)
    )
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(b))) or replace(a, b))
    ct.write_tokens([[2]], path, dtype=np.uint16)
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert ".train.bin." in events[0][1] and events[1][1] == str(path) and events[2][1] == str(tmp_path)


def test_a_failure_at_the_rename_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "train.bin"
    ct.write_tokens([[1, 2]], path, dtype=np.uint16)

    def full(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        ct.write_tokens([[3]], path, dtype=np.uint16)
    assert read(path) == [1, 2] and listing(tmp_path) == ["train.bin"]


def test_the_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "train.bin"
    ct.write_tokens([[1]], path, dtype=np.uint16)
    path.chmod(0o640)
    ct.write_tokens([[2]], path, dtype=np.uint16)
    assert path.stat().st_mode & 0o777 == 0o640


def test_writers_in_one_folder_take_turns_and_lose_no_append(tmp_path, monkeypatch):
    path = tmp_path / "train.bin"
    ct.write_tokens([[0]], path, dtype=np.uint16)
    slow = token_writer._ids

    def ids(*args):
        threading.Event().wait(0.01)  # the other writer runs meanwhile, unless it waits for the lock
        return slow(*args)

    monkeypatch.setattr(token_writer, "_ids", ids)
    writers = [
        threading.Thread(target=ct.write_tokens, args=([[n]] * 5, path), kwargs={"dtype": np.uint16})
        for n in range(1, 5)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert sorted(read(path)) == [0] + [n for n in range(1, 5) for _ in range(5)]


def test_dtype_is_required_for_raw_files_and_must_agree_with_an_npy_files(tmp_path):
    with pytest.raises(TypeError, match=r"^ct\.write_tokens: .*train\.bin is a raw token file, which does not record"):
        ct.write_tokens([[1]], tmp_path / "train.bin")
    ct.write_tokens([[1]], tmp_path / "ids.npy", dtype=np.int32)
    with pytest.raises(ValueError, match=r"dtype=uint16 was given, but .*ids\.npy is an \.npy file of int32"):
        ct.write_tokens([[2]], tmp_path / "ids.npy", dtype=np.uint16)
    assert ct.write_tokens([[2]], tmp_path / "ids.npy") == 2  # its own dtype
    with pytest.raises(
        TypeError, match=r"^ct\.write_tokens: dtype must be a NumPy integer dtype .* got 'float32' \(str\)"
    ):
        ct.write_tokens([[1]], tmp_path / "f.bin", dtype="float32")


def test_an_existing_file_of_another_dtype_is_refused(tmp_path):
    path = tmp_path / "train.bin"
    path.write_bytes(bytes(3))
    with pytest.raises(ValueError, match=r"holds 3 bytes of tokens, not a whole number of uint16 tokens"):
        ct.write_tokens([[1]], path, dtype=np.uint16)
    assert path.read_bytes() == bytes(3)


@pytest.mark.parametrize(
    ("arrays", "error", "said"),
    [
        ([1, 2, 3], TypeError, r"element 0 of arrays is the number 1 \(int\), not an array of ids; give one array"),
        ([[1.0, 2.0]], TypeError, r"array 0 must be a flat array of integer token ids, got float64 of shape \(2,\)"),
        ([np.zeros((2, 2), np.int64)], TypeError, r"array 0 must be a flat array .* got int64 of shape \(2, 2\)"),
        ([[True, False]], TypeError, r"array 0 must be a flat array of integer token ids, got bool"),
        ("1 2 3", TypeError, r"arrays must be an array of token ids or an iterable of them"),
        (7, TypeError, r"arrays must be an array of token ids or an iterable of them"),
        ([[2**70]], TypeError, r"array 0 must be a flat array of integer token ids, got object"),
    ],
)
def test_arrays_that_are_not_integer_ids_are_refused(tmp_path, arrays, error, said):
    with pytest.raises(error, match=said):
        ct.write_tokens(arrays, tmp_path / "train.bin", dtype=np.uint16)
    assert listing(tmp_path) == []


def test_a_path_that_is_a_link_a_folder_or_in_no_folder_is_refused(tmp_path):
    ct.write_tokens([[1]], tmp_path / "real.bin", dtype=np.uint16)
    (tmp_path / "link.bin").symlink_to(tmp_path / "real.bin")
    with pytest.raises(ValueError, match=r"link\.bin is a symbolic link, which the new file would replace; give the"):
        ct.write_tokens([[2]], tmp_path / "link.bin", dtype=np.uint16)
    with pytest.raises(FileNotFoundError, match=r"no folder .*missing for train\.bin; create it first"):
        ct.write_tokens([[2]], tmp_path / "missing" / "train.bin", dtype=np.uint16)
    (tmp_path / "dir.bin").mkdir()
    with pytest.raises(ValueError, match=r"dir\.bin is a folder"):
        ct.write_tokens([[2]], tmp_path / "dir.bin", dtype=np.uint16)
    with pytest.raises(TypeError, match=r"^ct\.write_tokens: path must be a file path, got 3 \(int\)"):
        ct.write_tokens([[2]], 3, dtype=np.uint16)
    assert read(tmp_path / "real.bin") == [1]


def test_a_file_nobody_may_write_is_not_appended_to(tmp_path):
    path = tmp_path / "train.bin"
    ct.write_tokens([[1, 2]], path, dtype=np.uint16)
    path.chmod(0o444)
    with pytest.raises(
        PermissionError, match=r"^ct\.write_tokens: .*train\.bin is read-only \(mode -r--r--r--\).*u\+w"
    ):
        ct.write_tokens([[3]], path, dtype=np.uint16)
    assert read(path) == [1, 2] and path.stat().st_mode & 0o777 == 0o444 and listing(tmp_path) == ["train.bin"]
    path.chmod(0o644)
    assert ct.write_tokens([[3]], path, dtype=np.uint16) == 3


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write_and_nothing_else(tmp_path):
    path = tmp_path / "train.bin"
    ct.write_tokens([[1]], path, dtype=np.uint16)
    left = tmp_path / ".train.bin.4242.0badc0de.tmp"  # as a writer killed mid-write leaves it
    left.write_bytes(bytes(64))
    others = [".other.bin.4242.0badc0de.tmp", ".train.bin.tmp", ".train.bin.x.0badc0de.tmp", "train.bin.4242.tmp"]
    for name in others:
        (tmp_path / name).write_bytes(b"mine")
    with pytest.warns(UserWarning, match=r"removed .*\.train\.bin\.4242\.0badc0de\.tmp, the temporary file of a write"):
        assert ct.write_tokens([[2]], path, dtype=np.uint16) == 2
    assert listing(tmp_path) == sorted(["train.bin", *others]) and read(path) == [1, 2]


def test_a_full_disk_is_named_with_the_file_and_changes_nothing(tmp_path):
    """A write past RLIMIT_FSIZE fails as one on a full disk does (EFBIG; Python ignores SIGXFSZ)."""
    path = tmp_path / "train.bin"
    ct.write_tokens([np.arange(100)], path, dtype=np.uint16)
    code = (
        "import resource, numpy as np, composetrain as ct\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))\n"
        "try:\n"
        f"    ct.write_tokens([np.arange(100)], {str(path)!r}, dtype=np.uint16)\n"
        "except OSError as e:\n"
        "    print(e.errno, e)\n"
    )
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert said.stdout.startswith(
        f"{errno.EFBIG} [Errno {errno.EFBIG}] ct.write_tokens: writing {path} failed (File too"
    )
    assert "nothing was written, the file is as it was; free space in" in said.stdout
    assert read(path) == list(range(100)) and listing(tmp_path) == ["train.bin"]


def test_a_folder_it_may_not_write_is_named_and_a_callers_own_os_error_passes_as_it_came(tmp_path, monkeypatch):
    path = tmp_path / "train.bin"
    ct.write_tokens([[1]], path, dtype=np.uint16)

    def documents():
        yield [2]
        raise OSError(errno.ENOSPC, "the tokenizer's cache is full")  # the caller's, not the writer's

    with pytest.raises(OSError, match=r"^\[Errno 28\] the tokenizer's cache is full$"):
        ct.write_tokens(documents(), path, dtype=np.uint16)

    def denied(file, mode="r", *args, **kwargs):  # a folder this process may not write (root may write any)
        if mode == "xb":
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(token_writer, "open", denied, raising=False)
    with pytest.raises(PermissionError, match=rf"ct\.write_tokens: writing {path} failed \(Permission denied\); no"):
        ct.write_tokens([[3]], path, dtype=np.uint16)
    assert read(path) == [1] and listing(tmp_path) == ["train.bin"]

"""A store's files damaged or crafted (a manifest of another tool, an array that is a folder, a date past the
floats, fields, headers and sizes altered): refused by name, and rebuilt on request only where the folder is
ct.cache's own store."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from helpers import Listed, labelled, reads_back

import composetrain as ct
from composetrain.data.store_files import MANIFEST, StoreError


def test_a_manifest_of_another_tool_with_a_huge_integer_is_named_and_never_replaced(tmp_path: Path) -> None:
    """The bug (bare exception; a non-cache manifest taken for a damaged store): json's 4300-digit limit raises a
    plain ValueError, which ``read_manifest`` does not turn into NotAStore; ``check_replaceable`` then takes the
    folder for a damaged store, and only a second bare ValueError in ``_created`` stops rebuild=True replacing it."""
    folder = tmp_path / "export"
    folder.mkdir()
    text = '{"version": ' + "9" * 5000 + "}"
    (folder / MANIFEST).write_text(text)
    for rebuild in (False, True):
        with pytest.raises(ValueError, match=r"cache: .*export.* not a cache store"):
            ct.cache(Listed(labelled()), folder, rebuild=rebuild, progress=False)
        assert (folder / MANIFEST).read_text() == text and os.listdir(folder) == [MANIFEST]


def test_an_array_file_that_is_a_folder_is_refused_as_a_store_error(tmp_path: Path) -> None:
    """The bug (bare exception): ``_region`` opens a folder named ``f0.npy`` (O_RDONLY opens folders) and
    ``os.fdopen`` raises IsADirectoryError "[Errno 21] Is a directory: 3", naming a file descriptor."""
    path = tmp_path / "store"
    ct.cache(Listed(labelled()), path, progress=False)
    (path / "f0.npy").unlink()
    (path / "f0.npy").mkdir()
    with pytest.raises(StoreError, match=r"cache: .*f0\.npy"):
        ct.cache(Listed(labelled()), path, progress=False)


def test_a_store_dated_past_the_floats_is_rebuilt_on_request(tmp_path: Path) -> None:
    """The bug (bare exception): a manifest whose "created" is an int too large for a float opens, but
    rebuild=True dies in ``_created`` with OverflowError "int too large to convert to float"."""
    path = tmp_path / "store"
    ct.cache(Listed(labelled()), path, progress=False)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["origin"]["created"] = 10**400
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert reads_back(ct.cache(Listed(labelled()), path, progress=False), labelled())  # it opens
    rebuilt = ct.cache(Listed(labelled(seed=1)), path, rebuild=True, progress=False)
    assert reads_back(rebuilt, labelled(seed=1))


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
    path, items = tmp_path / "store", labelled()
    ct.cache(Listed(items), path, progress=False)
    damage(path)
    with pytest.raises(ValueError, match="cache: "):
        ct.cache(Listed(items), path, progress=False)
    if replaced:
        assert reads_back(ct.cache(Listed(items), path, rebuild=True, progress=False), items)
    else:
        with pytest.raises(ValueError, match="cache: "):
            ct.cache(Listed(items), path, rebuild=True, progress=False)

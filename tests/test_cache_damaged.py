"""A store's files damaged or crafted (a manifest of another tool, an array that is a folder, a date past the
floats, fields, headers and sizes altered): refused by name, and rebuilt on request only where the folder is
ct.cache's own store."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Listed, labelled, reads_back
from torch.utils.data import Dataset

import composetrain as ct
from composetrain.data.layout import Field
from composetrain.data.store_files import MANIFEST, StoreError, write_manifest
from composetrain.data.writer import fingerprint, sampled


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
        (_field(1, "data", "f0"), False),  # two fields naming one array: f1.npy named by none, not known as its own
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


# -- a damaged manifest names fewer arrays than the folder holds: the others are not the store's -----------------


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


def test_a_manifest_listing_fewer_fields_than_arrays_disowns_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "store"
    ct.cache(labelled(6), path, progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["item"] = manifest["item"]["tuple"][0]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"f1\.npy"):
        ct.cache(labelled(6), path, rebuild=True, progress=False)
    assert (path / "f1.npy").exists()


class _Ragged(Dataset[Any]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.zeros(1 + i % 2, dtype=torch.int8)


def test_a_ragged_store_whose_shapes_are_wrong_past_the_first_block_is_refused(tmp_path: Path) -> None:
    """A ragged field's offsets and shapes are checked a block of rows at a time (opening takes bounded memory):
    every block, the last one too, where two shapes are swapped against their offsets. (The store is the one
    ``write_store`` makes, written here from its parts.)"""
    n, path = 100_000, tmp_path / "store"
    path.mkdir()
    sizes = 1 + np.arange(n, dtype=np.int64) % 2
    shapes = sizes.reshape(n, 1).copy()
    shapes[[n - 3, n - 2]] = shapes[[n - 2, n - 3]]  # the same bytes in all, split otherwise
    np.save(path / "f0.npy", np.zeros(int(sizes.sum()), np.int8))
    np.save(path / "f0o.npy", np.concatenate([[0], np.cumsum(sizes)]).astype("<i8"))
    np.save(path / "f0s.npy", shapes.astype("<i8"))
    kept = sampled(n)
    origin = {
        "type": f"{__name__}._Ragged",
        "length": n,
        "key": None,
        "created": 1.0,
        "fingerprint": {"items": kept, "blake2b": fingerprint(_Ragged(n)[i] for i in kept)},
    }
    write_manifest(path, Field("tensor", "int8", None, "f0", "f0o", "f0s"), n, origin)
    with pytest.raises(StoreError, match=r"offsets and shapes of ragged array 'f0' do not match"):
        ct.cache(_Ragged(n), path, progress=False)

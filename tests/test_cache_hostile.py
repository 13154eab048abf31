"""A crafted or damaged store is refused before a byte is mapped, and reading one never runs code."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import composetrain as ct
from composetrain.data.store_files import StoreError


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

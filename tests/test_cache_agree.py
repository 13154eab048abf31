"""The store's writer and its reader accept the same items: what is written is read back equal, and what the reader
would refuse is refused at the first item, nothing published (nested too deep, a manifest larger than it reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import composetrain as ct
from composetrain.data.equal import same_item
from composetrain.data.layout import DEPTH


def nested(depth: int, i: int, kinds: list[int]) -> Any:
    """A tensor inside ``depth`` containers (lists, tuples and dicts, as ``kinds`` cycles)."""
    item: Any = torch.full((2,), float(i))
    for n in range(depth):
        kind = kinds[n % len(kinds)]
        item = [item] if kind == 0 else (item, i) if kind == 1 else {"k": item}
    return item


class Counted(list[Any]):
    """A list of items that counts the items read."""

    reads = 0

    def __getitem__(self, i: Any) -> Any:
        type(self).reads += 1
        return super().__getitem__(i)


@settings(max_examples=12, deadline=None)
@given(depth=st.integers(DEPTH - 3, DEPTH + 3), kinds=st.lists(st.integers(0, 2), min_size=1, max_size=3))
def test_an_item_is_written_exactly_when_its_store_can_be_read_back(
    tmp_path_factory: Any, depth: int, kinds: list[int]
) -> None:
    path = tmp_path_factory.mktemp("agree") / "store"
    Counted.reads = 0
    data = Counted(nested(depth, i, kinds) for i in range(3))
    if depth > DEPTH:
        with pytest.raises(ValueError, match=rf"cache: item 0.* lies inside {DEPTH + 1} containers: a store holds"):
            ct.cache(data, path, progress=False)
        assert Counted.reads == 1 and not path.exists() and not list(path.parent.glob(".store.tmp-*"))
        return
    cached = ct.cache(data, path, progress=False)
    again = ct.cache(data, path, progress=False)  # the store the writer published opens
    assert all(same_item(again[i], data[i]) and same_item(cached[i], data[i]) for i in range(3))


def test_a_manifest_larger_than_the_reader_reads_is_refused_at_the_first_item(tmp_path: Path) -> None:
    Counted.reads = 0
    data = Counted([torch.ones(2)] * 20)
    with pytest.raises(ValueError, match=r"cache: the store's manifest would take \d+ bytes, more than its reader"):
        ct.cache(data, tmp_path / "store", key="k" * (1 << 24), progress=False)
    assert Counted.reads == 1 and not (tmp_path / "store").exists()
    ct.cache(data, tmp_path / "store", key="k" * 1000, progress=False)  # a key it reads is fine

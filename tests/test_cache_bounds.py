"""Reading a ct.cache store or a ct.hdf5 file by index: every index reads as a Python list of the items would, the
negative ones counting from the end, and one past either end (alone or in a batch) is an IndexError, never another
item (a wrap to item 0 would train on it twice, silently)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Listed
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import default_collate

import composetrain as ct
from composetrain.data.equal import same_item

N = 5


def fixed(i: int) -> Any:
    return torch.arange(3, dtype=torch.float64) + 10 * i, i


def ragged(i: int) -> Any:
    return torch.arange(i + 1, dtype=torch.int64) + 10 * i, float(i)


def noise(batch: Any, generator: torch.Generator) -> Any:
    x, y = batch
    return [x + torch.randn(x.shape, generator=generator, dtype=x.dtype), y]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: Any) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("bounds")
    out: dict[str, Any] = {
        "fixed": ([fixed(i) for i in range(N)], ct.cache([fixed(i) for i in range(N)], folder / "f", progress=False)),
        "ragged": (
            [ragged(i) for i in range(N)],
            ct.cache([ragged(i) for i in range(N)], folder / "r", progress=False),
        ),
    }
    h5py = pytest.importorskip("h5py")
    rows = np.arange(N * 3, dtype="<f4").reshape(N, 3)
    with h5py.File(folder / "d.h5", "w") as f:
        f["flat"], f["big"] = rows, rows.astype(">f4")
        f.create_dataset("chunked", data=rows, chunks=(2, 3))
    for name in ("flat", "big", "chunked"):
        out[name] = ([torch.from_numpy(rows[i]) for i in range(N)], ct.hdf5(folder / "d.h5", name))
    return out


def expect_index_error(read: Any) -> None:
    with pytest.raises(IndexError, match=f"out of range for {N} items"):
        read()


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["fixed", "ragged", "flat", "big", "chunked"]), i=st.integers(-N - 3, N + 3))
def test_an_index_reads_the_item_a_list_would_and_none_past_either_end(
    stores: dict[str, Any], name: str, i: int
) -> None:
    items, data = stores[name]
    batched = name != "ragged"  # a ragged store's batches need a collate_fn: read item by item
    if not -N <= i < N:
        expect_index_error(lambda: data[i])
        expect_index_error(lambda: data.__getitems__([0, i]))
        if batched:
            expect_index_error(lambda: data.read_batch([0, i, 1]))
        return
    assert same_item(data[i], items[i]) if name in ("fixed", "ragged") else torch.equal(data[i], items[i])
    got = data.__getitems__([i, 0])
    assert all(
        same_item(g, w) if name in ("fixed", "ragged") else torch.equal(g, w)
        for g, w in zip(got, [items[i], items[0]], strict=True)
    )
    if batched:
        want = default_collate([items[i], items[0]])
        batch = data.read_batch([i, 0])
        assert (
            all(torch.equal(g, w) for g, w in zip(batch, want, strict=True))
            if name == "fixed"
            else torch.equal(batch, want)
        )


def test_one_past_the_end_of_an_augmented_store_is_an_index_error_and_a_negative_index_draws_as_its_item(
    tmp_path: Path,
) -> None:
    cached = ct.cache([fixed(i) for i in range(N)], tmp_path / "s", augment=noise, progress=False)
    for bad in (N, -N - 1):
        expect_index_error(lambda: cached[bad])  # noqa: B023
        expect_index_error(lambda: cached.read_batch([1, bad]))  # noqa: B023
    # the same rows, the same draw: the generator is seeded by the item's index, however it was written
    assert torch.equal(cached.read_batch([-1, 1], epoch=3)[0], cached.read_batch([N - 1, 1], epoch=3)[0])
    assert torch.equal(cached[-N][0], cached[0][0])


# -- indices past int64 and unsigned ones -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "indices",
    [
        np.array([2**64 - 1], dtype=np.uint64),
        np.array([0, 2**64 - 3], dtype=np.uint64),
        torch.tensor([2**64 - 1], dtype=torch.uint64),
        torch.tensor(2**64 - 2, dtype=torch.uint64),
    ],
    ids=["numpy uint64", "numpy uint64 with a valid one", "torch uint64", "0-dim torch uint64"],
)
@pytest.mark.parametrize("augmented", [False, True])
def test_an_unsigned_index_past_the_end_is_an_index_error_not_an_item_from_the_end(
    tmp_path: Path, indices: Any, augmented: bool
) -> None:
    """The bug (wrong rows served): ``read_batch`` casts unsigned 64-bit indices to int64, so 2**64 - 1 reads as -1:
    the last item, where ``__getitems__`` of the same indices (and a list) says out of range."""
    augment = (lambda batch, generator: batch) if augmented else None
    cached = ct.cache(
        Listed([torch.tensor([float(i)]) for i in range(5)]), tmp_path / "s", augment=augment, progress=False
    )
    with pytest.raises(IndexError, match="out of range"):
        cached.read_batch(indices)


@pytest.mark.parametrize(
    "read",
    [
        lambda c: c.read_batch([np.uint64(2**64 - 1)]),
        lambda c: c.read_batch([2**64 - 1]),
        lambda c: c[torch.tensor(2**64 - 1, dtype=torch.uint64)],
        lambda c: c.__getitems__(torch.tensor([2**64 - 1], dtype=torch.uint64)),
    ],
    ids=["list of numpy uint64", "a Python int past int64", "0-dim uint64 tensor", "uint64 tensor to getitems"],
)
def test_an_index_past_int64_is_an_index_error_naming_it(tmp_path: Path, read: Any) -> None:
    """The bug (bare exception): TypeError "an integer is required", ValueError "Overflow when unpacking long long",
    RuntimeError "value cannot be converted to type int64_t without overflow", none naming the dataset or index."""
    cached = ct.cache(Listed([torch.tensor([float(i)]) for i in range(5)]), tmp_path / "s", progress=False)
    with pytest.raises(IndexError, match="CachedDataset"):
        read(cached)

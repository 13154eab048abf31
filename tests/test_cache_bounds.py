"""Reading a ct.cache store or a ct.hdf5 file by index: every index reads as a Python list of the items would, the
negative ones counting from the end, and one past either end (alone or in a batch) is an IndexError, never another
item (a wrap to item 0 would train on it twice, silently)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Listed, labelled
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


# -- index lists of every kind, a slice -------------------------------------------------------------------------


def test_read_batch_given_a_slice_names_itself(tmp_path: Path) -> None:
    """The bug (a bare TypeError): ``read_batch(slice(0, 3))`` raises Python's "'slice' object is not iterable"
    (from ``_indices``' fallback loop), naming neither ``read_batch`` nor what to give. The fix: refuse what is not a
    sequence of ints in ``_indices``' words (``read_batch(range(0, 3))``)."""
    data = ct.cache(labelled(6), tmp_path / "store", progress=False)
    with pytest.raises(TypeError) as e:
        data.read_batch(slice(0, 3))  # type: ignore[arg-type]
    assert "read_batch" in str(e.value), str(e.value)


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

"""Answers made clear: an augment that drops rows is refused however a store is read; a ragged store with augment=
is refused by ct.cache naming augment (not at the first batch, asking for a collate_fn that was given); ct.run's
advice for an IterableDataset is one that works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import IN, classify, make_state
from torch.utils.data import DataLoader, IterableDataset, default_collate

import composetrain as ct


def items(n: int = 6) -> list[Any]:
    return [(torch.full((IN,), float(i), dtype=torch.float64), i % 3) for i in range(n)]


def run(data: Any, **options: Any) -> None:
    if not isinstance(data, DataLoader):
        options = {"batch_size": 3, "num_workers": 0, **options}
    ct.run(ct.train_step(classify), make_state(), data, epochs=1, progress=False, **options)


def drop(batch: Any, generator: torch.Generator) -> Any:
    x, y = batch
    return [x[:1], y[:1]]  # one row kept of each batch: the others would be lost silently


@pytest.mark.parametrize("workers", [0, 1])
def test_an_augment_that_drops_rows_is_refused_by_ct_runs_loader_as_through_a_dataloader(
    tmp_path: Path, workers: int
) -> None:
    cached = ct.cache(items(), tmp_path / "store", augment=drop, progress=False)
    match = r"augment returned a batch of 1 rows for 3 indices \(a tensor of shape \(1, 5\)\)"
    with pytest.raises(ValueError, match=match):
        run(DataLoader(cached, batch_size=3))
    with pytest.raises(ValueError, match=match):
        run(cached, num_workers=workers)
    with pytest.raises(ValueError, match=match):
        cached.read_batch([0, 1, 2])
    odd = ct.cache(items(), tmp_path / "store", augment=lambda b, g: {"x": b[0], "note": "seen"}, progress=False)
    with pytest.raises(TypeError, match="augment returned a str in its batch"):
        odd.read_batch([0, 1])


def test_a_ragged_store_with_augment_is_refused_by_ct_cache_naming_augment(tmp_path: Path) -> None:
    ragged = [(torch.ones(i + 1), i) for i in range(4)]
    noise = lambda b, g: b  # noqa: E731
    with pytest.raises(ValueError, match=r"cache: augment= is given, but the items of the store at .* differ in shape"):
        ct.cache(ragged, tmp_path / "store", augment=noise, progress=False)
    plain = ct.cache(ragged, tmp_path / "store", progress=False)  # the store was kept: it opens without augment=
    pad = lambda rows: torch.nn.utils.rnn.pad_sequence([r[0] for r in rows], batch_first=True)  # noqa: E731
    assert pad(plain.__getitems__([0, 3])).shape == (2, 4)
    # padded in the dataset instead, augment= works
    padded = [(torch.nn.functional.pad(torch.ones(i + 1), (0, 3 - i)), i) for i in range(4)]
    assert ct.cache(padded, tmp_path / "padded", augment=noise, progress=False).read_batch([1, 2])[0].shape == (2, 4)


class Stream(IterableDataset[Any]):
    def __iter__(self) -> Any:
        return iter(items())


def test_an_iterable_dataset_is_refused_by_cache_with_advice_that_works(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"cache: dataset is an IterableDataset \(Stream\).*map-style"):
        ct.cache(Stream(), tmp_path / "refused", progress=False)
    run(Stream())  # ct.run reads it as a stream
    run(DataLoader(Stream(), batch_size=3))
    run(ct.cache(list(Stream()), tmp_path / "store", progress=False))  # the advice given: its items in a list
    run(list(Stream()), collate_fn=default_collate)

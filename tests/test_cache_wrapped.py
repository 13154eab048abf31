"""An augmented store inside torch's Subset, random_split and ConcatDataset: the epoch and rank reach it (ct.run's
loader, in this process and in workers, and a DataLoader given), its batches are those of the store itself at the
indices they lead to, a resumed run is bit-exact; a wrapper that cannot pass them on is refused, as is ct.cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import IN, assert_states_equal, classify, make_state
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, default_collate, random_split

import composetrain as ct


def noise(batch: Any, generator: torch.Generator) -> Any:
    x, y = batch
    return [x + torch.randn(x.shape, generator=generator, dtype=x.dtype), y]


def items(n: int, seed: int) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(IN, dtype=torch.float64, generator=g), i % 3) for i in range(n)]


def store(tmp_path: Path, name: str = "store", n: int = 12, augment: Any = noise) -> Any:
    return ct.cache(items(n, len(name)), tmp_path / name, augment=augment, seed=5, progress=False)


def seen_batches(data: Any, epochs: int = 2, **options: Any) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []

    def record(model: Any, batch: Any) -> Any:
        seen.append(batch[0].clone())
        return classify(model, batch)

    if not isinstance(data, DataLoader):
        options = {"batch_size": 4, "shuffle": False, "num_workers": 0, **options}
    ct.run(ct.train_step(record), make_state(), data, epochs=epochs, progress=False, **options)
    return seen


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("workers", [0, 1])
def test_a_subset_of_an_augmented_store_draws_anew_each_epoch_as_the_store_at_those_indices(
    tmp_path: Path, workers: int
) -> None:
    cached = store(tmp_path)
    picked = [11, 3, 0, 7, 5, 9, 2, 8]
    seen = seen_batches(Subset(cached, picked), num_workers=workers)
    want = [cached.read_batch(picked[s : s + 4], epoch=e, rank=0)[0] for e in range(2) for s in (0, 4)]
    assert same(seen, want)
    assert not torch.equal(seen[0], seen[2])  # epoch 1 is not epoch 0's draw again


def test_a_concat_of_augmented_stores_reads_each_with_its_epoch_also_with_a_collate_fn(tmp_path: Path) -> None:
    a, b = store(tmp_path, "a", 8), store(tmp_path, "bb", 4)
    seen = seen_batches(ConcatDataset([a, b]))
    want = [
        s.read_batch(r, epoch=e)[0]
        for e in range(2)
        for s, r in ((a, [0, 1, 2, 3]), (a, [4, 5, 6, 7]), (b, [0, 1, 2, 3]))
    ]
    assert same(seen, want)
    # a batch across both stores: each store's rows as it gives them, with the same epoch
    across = seen_batches(
        ConcatDataset([a, b]), epochs=1, batch_size=6, collate_fn=lambda rows: tuple(default_collate(rows))
    )
    assert torch.equal(across[0], a.read_batch(range(6), epoch=0)[0])
    assert torch.equal(across[1][:2], a.read_batch([6, 7], epoch=0)[0])
    assert torch.equal(across[1][2:], b.read_batch(range(4), epoch=0)[0])


def test_a_run_over_a_random_split_of_an_augmented_store_resumes_bit_exactly(tmp_path: Path) -> None:
    cached, plain = store(tmp_path), store(tmp_path, augment=None)
    train, _ = random_split(cached, [9, 3], generator=torch.Generator().manual_seed(1))
    train_plain = Subset(plain, train.indices)

    def run(data: Any, folder: Path | None = None, **options: Any) -> ct.TrainState:
        state = make_state()
        ct.run(
            ct.train_step(classify),
            state,
            data,
            batch_size=2,
            epochs=3,
            num_workers=0,
            progress=False,
            checkpoint_dir=folder,
            **options,
        )
        return state

    straight = run(train, tmp_path / "a")
    assert not torch.equal(straight.model[0].weight, run(train_plain).model[0].weight)  # it is augmented
    run(train, tmp_path / "b", max_steps=7)  # stops inside the second epoch
    assert_states_equal(run(train, tmp_path / "b"), straight)


def test_a_given_dataloader_over_a_subset_of_an_augmented_store_draws_anew_each_epoch(tmp_path: Path) -> None:
    cached = store(tmp_path)
    picked = [4, 1, 10, 6, 2, 0, 9, 3]
    seen = seen_batches(DataLoader(Subset(cached, picked), batch_size=4))
    want = [cached.read_batch(picked[s : s + 4], epoch=e)[0] for e in range(2) for s in (0, 4)]
    assert same(seen, want)
    persistent = DataLoader(Subset(cached, picked), batch_size=4, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="persistent workers over a dataset that augments its batches"):
        seen_batches(persistent)


class Wrapper(Dataset[Any]):
    """Another library's wrapper: it keeps the dataset as .dataset, and passes no epoch on."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


def test_wrappers_that_cannot_pass_the_epoch_on_and_stores_joined_with_other_data_are_refused(
    tmp_path: Path,
) -> None:
    cached = store(tmp_path)
    with pytest.raises(ValueError, match=r"run: the Wrapper given wraps a dataset that augments its batches"):
        seen_batches(Wrapper(cached))
    with pytest.raises(ValueError, match=r"run: the ConcatDataset given joins .* with list items"):
        seen_batches(ConcatDataset([cached, items(4, 0)]))
    with pytest.raises(ValueError, match=r"cache: the dataset \(Subset\) wraps one that augments its batches"):
        ct.cache(Subset(cached, [0, 1]), tmp_path / "again", progress=False)
    with pytest.raises(ValueError, match=r"cache: the dataset \(ConcatDataset\) wraps one that augments"):
        ct.cache(ConcatDataset([Wrapper(cached)]), tmp_path / "again", progress=False)
    assert not (tmp_path / "again").exists()


def test_an_index_past_a_wrapped_store_is_an_index_error_and_negative_ones_count_from_the_end(tmp_path: Path) -> None:
    from composetrain.data.wrapped import locate

    a, b = store(tmp_path, "a", 8), store(tmp_path, "bb", 4)
    joined = ConcatDataset([Subset(a, [5, 6, 7]), b])
    assert locate(joined, 0) == (a, 5) and locate(joined, 3) == (b, 0) and locate(joined, -1) == (b, 3)
    assert locate(joined, -7) == (a, 5)
    for bad in (7, -8):
        with pytest.raises(IndexError, match=f"ConcatDataset: index {bad} out of range for 7 items"):
            locate(joined, bad)
    with pytest.raises(IndexError, match="Subset: index 3 out of range for 3 items"):
        locate(Subset(a, [5, 6, 7]), 3)


def test_the_bottleneck_report_does_not_advise_ct_cache_for_a_subset_of_an_augmented_store(tmp_path: Path) -> None:
    from composetrain.driver.monitor import _cheaper
    from composetrain.driver.reader import Reader

    subset = Subset(store(tmp_path), [0, 1, 2, 3])
    reader = Reader(subset, range(4), 2, False, None, 0, lambda n: None, 1)  # type: ignore[arg-type]
    assert "wraps an augmented memory-mapped store already: make its augment cheaper" in _cheaper(reader)
    assert "ct.cache(dataset, path)" not in _cheaper(reader)

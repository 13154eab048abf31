"""ct.run over a ct.cache store: the batches of the original dataset, read whole; resumed bit-exactly, augmented too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import IN, Listed, assert_states_equal, batches_seen, classify, labelled, make_state
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, default_collate, random_split

import composetrain as ct
from composetrain.data.equal import same_item
from composetrain.data.mapped import MappedDataset


class Samples(Dataset[Any]):
    """Per-sample items (x float64, y int): ct.run reads it sample by sample and collates."""

    def __init__(self, n: int = 40) -> None:
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(n, IN, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return self.x[i], int(self.y[i])


def noise(batch: Any, generator: torch.Generator) -> Any:
    x, y = batch
    return [x + 0.1 * torch.randn(x.shape, generator=generator, dtype=x.dtype), y]


def _run(data: Any, folder: Path | None = None, **options: Any) -> tuple[ct.TrainState, Any]:
    state = make_state()
    options = {"epochs": 3, **options}
    result = ct.run(
        ct.train_step(classify),
        state,
        data,
        batch_size=6,
        num_workers=0,
        progress=False,
        checkpoint_dir=folder,
        **options,
    )
    return state, result


def test_a_run_over_the_cache_is_bit_identical_to_one_over_the_original_and_reads_whole_batches(
    tmp_path: Path, monkeypatch: Any
) -> None:
    data = Samples()
    cached = ct.cache(data, tmp_path / "store", progress=False)
    reads: list[int] = []
    read_batch = MappedDataset.read_batch
    monkeypatch.setattr(
        MappedDataset, "read_batch", lambda self, i, e=None, r=None: reads.append(len(i)) or read_batch(self, i, e, r)
    )
    monkeypatch.setattr(MappedDataset, "__getitem__", lambda *a: (_ for _ in ()).throw(AssertionError("per item")))
    straight, _ = _run(data)
    over_cache, _ = _run(cached)
    assert_states_equal(over_cache, straight)
    assert reads == [6] * 6 + [4] + [6] * 6 + [4] + [6] * 6 + [4]


def test_a_resumed_run_over_the_cache_is_bit_exact(tmp_path: Path) -> None:
    cached = ct.cache(Samples(), tmp_path / "store", progress=False)
    straight, _ = _run(cached, tmp_path / "a")
    _run(cached, tmp_path / "b", max_steps=10)  # stops mid-epoch
    resumed, _ = _run(cached, tmp_path / "b")
    assert_states_equal(resumed, straight)


def test_augmentation_differs_per_epoch_and_batch_and_resumes_bit_exactly(tmp_path: Path) -> None:
    data = Samples()
    plain = ct.cache(data, tmp_path / "store", progress=False)
    augmented = ct.cache(data, tmp_path / "store", augment=noise, seed=7, progress=False)
    a, b = augmented.read_batch([1, 2], epoch=0), augmented.read_batch([1, 2], epoch=0)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], plain.read_batch([1, 2])[0])
    assert not torch.equal(a[0], augmented.read_batch([1, 2], epoch=1)[0])
    assert torch.equal(a[0], augmented.read_batch([1, 2], epoch=0, rank=0)[0])  # this process: rank 0
    assert not torch.equal(a[0], augmented.read_batch([1, 2], epoch=0, rank=1)[0])
    assert torch.equal(augmented.read_batch([1, 2])[1], plain.read_batch([1, 2])[1])
    straight, _ = _run(augmented, tmp_path / "a")
    unaugmented, _ = _run(plain)
    assert not torch.equal(straight.model[0].weight, unaugmented.model[0].weight)
    _run(augmented, tmp_path / "b", max_steps=10)
    resumed, _ = _run(augmented, tmp_path / "b")
    assert_states_equal(resumed, straight)


def test_augmentation_in_loader_workers_draws_as_in_this_process(tmp_path: Path) -> None:
    augmented = ct.cache(Samples(), tmp_path / "store", augment=noise, progress=False)
    here, _ = _run(augmented, epochs=2)
    state = make_state()
    ct.run(ct.train_step(classify), state, augmented, batch_size=6, num_workers=1, epochs=2, progress=False)
    assert_states_equal(state, here)


def test_the_bottleneck_report_recommends_ct_cache_unless_the_data_is_a_cache(tmp_path: Path) -> None:
    from composetrain.driver.monitor import _cheaper
    from composetrain.driver.reader import Reader

    data = Samples()
    cached = ct.cache(data, tmp_path / "store", progress=False)

    def reader(d: Any) -> Reader:
        return Reader(d, range(len(d)), 4, False, None, 0, lambda n: None, 1)  # type: ignore[arg-type,return-value]

    assert "preprocess once with ct.cache(dataset, path)" in _cheaper(reader(data))
    assert "is a ct.cache store already" in _cheaper(reader(cached))


# -- wrappers, loader workers, a padding collate_fn -------------------------------------------------------------


def _same_batches(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(same_item(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("workers", [0, 2, "auto"])
def test_runs_over_wrappers_of_a_store_see_the_batches_of_the_same_wrappers_of_the_dataset(
    tmp_path: Path, workers: Any
) -> None:
    items = labelled(22)
    cached = ct.cache(Listed(items), tmp_path / "store", progress=False)
    picks = [5, 3, 21, 0, 7, 7, 2, 9, -1]
    wraps = [
        lambda d: d,
        lambda d: Subset(d, picks),
        lambda d: ConcatDataset([d, Listed(items)]),
        lambda d: ConcatDataset([d, d]),
        lambda d: random_split(d, [0.5, 0.5], torch.Generator().manual_seed(1))[1],
    ]
    for wrap in wraps:
        assert _same_batches(
            batches_seen(wrap(cached), num_workers=workers, shuffle=True),
            batches_seen(wrap(Listed(items)), num_workers=workers, shuffle=True),
        )


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_a_dataloader_with_workers_over_a_store_gives_the_datasets_batches(tmp_path: Path, context: str) -> None:
    items = labelled(14)
    cached = ct.cache(Listed(items), tmp_path / "store", progress=False)
    got = list(DataLoader(cached, batch_size=4, num_workers=1, multiprocessing_context=context))
    assert _same_batches(got, [default_collate(items[s : s + 4]) for s in range(0, 14, 4)])
    augmented = ct.cache(Listed(items), tmp_path / "store", augment=lambda b, g: b, progress=False)
    if context == "fork":  # a lambda does not pickle to a spawned worker
        got = list(DataLoader(augmented, batch_size=4, num_workers=1, multiprocessing_context=context))
        assert _same_batches(got, [default_collate(items[s : s + 4]) for s in range(0, 14, 4)])


def test_a_ragged_store_padded_by_a_collate_fn_gives_the_datasets_batches(tmp_path: Path) -> None:
    items = [(torch.arange(float(i % 4 + IN)), i % 3) for i in range(10)]

    def pad(batch: list[Any]) -> Any:
        n = max(len(x) for x, _ in batch)
        x = torch.stack([torch.nn.functional.pad(x, (0, n - len(x))) for x, _ in batch])
        return [x[:, :IN].to(torch.float64), torch.tensor([y for _, y in batch])]

    cached = ct.cache(Listed(items), tmp_path / "store", progress=False)
    for workers in (0, 1):
        assert _same_batches(
            batches_seen(cached, collate_fn=pad, num_workers=workers),
            batches_seen(Listed(items), collate_fn=pad, num_workers=workers),
        )

"""ct.cache against odd items, indices and stores: what a skeptical user (or a hostile file) would try."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import IN, classify, make_state
from torch.utils.data import DataLoader, IterableDataset, default_collate

import composetrain as ct
from composetrain.data.equal import same_item
from composetrain.data.store_files import StoreError


def test_an_iterable_dataset_is_refused_even_with_a_len(tmp_path: Path) -> None:
    class Stream(IterableDataset[Any]):
        def __iter__(self) -> Any:
            yield torch.ones(2)

        def __len__(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"cache: dataset is an IterableDataset \(Stream\).*map-style"):
        ct.cache(Stream(), tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()


def test_conjugate_and_negative_views_are_stored_as_their_values(tmp_path: Path) -> None:
    x = torch.randn(2, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    items = [(x.conj(), x.conj().imag), (x[1].conj().expand(2, 3), x.conj().imag * 2)]
    assert items[0][0].is_conj() and items[0][1].is_neg()
    cached = ct.cache(items, tmp_path / "store", progress=False, num_workers=0)
    for i in range(2):
        assert same_item(cached[i], tuple(t.resolve_conj().resolve_neg() for t in items[i]))
        assert torch.equal(cached[i][0], items[i][0].resolve_conj())
    assert same_item(cached.read_batch([1, 0]), default_collate([items[1], items[0]]))


def test_quantized_tensors_are_refused_rather_than_read_back_without_their_scale(tmp_path: Path) -> None:
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.1, 3, torch.quint8)
    with pytest.raises(ValueError, match=r"item 0\[1\] is a quantized tensor \(quint8\).*int_repr\(\)"):
        ct.cache([(torch.ones(1), q)], tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()


def test_numpy_memmap_rows_are_stored_and_verify_accepts_them_other_subclasses_are_refused(tmp_path: Path) -> None:
    rows = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype="<f4", shape=(3, 2))
    rows[:] = np.arange(6, dtype="<f4").reshape(3, 2)
    items = [rows[i] for i in range(3)]
    cached = ct.cache(items, tmp_path / "store", progress=False)
    again = ct.cache(items, tmp_path / "store", progress=False, verify=True)  # values equal: not "differs"
    assert all(np.array_equal(again[i], rows[i]) and cached[i].dtype == rows.dtype for i in range(3))
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    with pytest.raises(ValueError, match=r"item 0 is a NumPy MaskedArray.*filled"):
        ct.cache([masked], tmp_path / "masked", progress=False)
    with pytest.raises(ValueError, match=r"item 0 is a NumPy matrix"):
        ct.cache([np.asmatrix(np.ones((1, 2)))], tmp_path / "matrix", progress=False)


def test_indices_that_are_not_ints_are_refused_and_integer_tensors_index_as_in_the_dataset(tmp_path: Path) -> None:
    items = [torch.full((2,), float(i)) for i in range(5)]
    cached = ct.cache(items, tmp_path / "store", progress=False)
    for bad in ([1.7, 2.2], [True, False], np.array([1.9]), torch.tensor([0.5])):
        with pytest.raises(TypeError, match=r"indices must be a flat list of ints, got"):
            cached.read_batch(bad)
    assert torch.equal(cached.read_batch([]), torch.empty(0, 2))
    # what indexes the original (a list, a TensorDataset) indexes the cache: 0-dim integer tensors too
    assert torch.equal(cached[torch.tensor(3)], items[3]) and torch.equal(cached[np.int16(-1)], items[-1])
    assert same_item(cached.__getitems__(torch.tensor([4, 1])), [items[4], items[1]])
    for bad_index in (2.0, True, torch.tensor(1.0), torch.tensor([1, 2])):
        with pytest.raises(TypeError, match="an index must be an int"):
            cached[bad_index]  # type: ignore[index]


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", ["f0.npy", "manifest.json"])
def test_a_fifo_in_a_store_is_refused_without_blocking(tmp_path: Path, name: str) -> None:
    path = tmp_path / "store"
    ct.cache([torch.ones(2)] * 3, path, progress=False)
    _fifo(path / name)
    result: list[Any] = []
    opener = threading.Thread(target=lambda: result.append(_refusal(path)), daemon=True)
    opener.start()
    opener.join(timeout=20)
    if opener.is_alive():  # unblock the open, so the thread (and the test run) can end
        os.close(os.open(path / name, os.O_WRONLY | os.O_NONBLOCK))
        opener.join(timeout=5)
        pytest.fail(f"opening a store whose {name} is a FIFO blocked")
    assert "is not a regular file" in result[0]


def _refusal(path: Path) -> str:
    try:
        ct.cache([torch.ones(2)] * 3, path, progress=False)
    except StoreError as e:
        return str(e)
    return "opened"


def test_a_deeply_nested_or_overflowing_manifest_is_refused_as_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "store"
    items = [(torch.ones(1 + i % 2),) for i in range(4)]  # a ragged field
    ct.cache(items, path, progress=False)
    good = (path / "manifest.json").read_text()
    (path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreError, match="is not JSON"):
        ct.cache(items, path, progress=False)
    (path / "manifest.json").write_text(good)
    shapes = np.array([[1], [2], [1], [2]], np.int64)
    shapes2 = np.array([[1, 1], [2**32, 2**32], [1, 1], [4, 1]], np.int64)  # 2**64 elements: 0 once it wraps
    manifest = json.loads(good)
    assert np.array_equal(np.load(path / "f0s.npy"), shapes)
    np.save(path / "f0s.npy", shapes2)
    np.save(path / "f0o.npy", np.array([0, 1, 1, 2, 6], np.int64))  # all else consistent with the 6 values
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="offsets and shapes of ragged array"):
        ct.cache(items, path, progress=False)


def noisy_store(tmp_path: Path) -> Any:
    """Eight items in a store whose augment adds noise drawn from its generator (seeded per epoch and batch)."""
    g = torch.Generator().manual_seed(0)
    items = [(torch.randn(IN, dtype=torch.float64, generator=g), i % 3) for i in range(8)]

    def noise(batch: Any, generator: torch.Generator) -> Any:
        x, y = batch
        return [x + torch.randn(x.shape, generator=generator, dtype=x.dtype), y]

    return ct.cache(items, tmp_path / "store", augment=noise, progress=False)


def test_a_given_dataloader_run_by_ct_run_augments_each_epoch_anew(tmp_path: Path) -> None:
    cached = noisy_store(tmp_path)
    seen: list[torch.Tensor] = []

    def record(model: Any, batch: Any) -> Any:
        seen.append(batch[0].clone())
        return classify(model, batch)

    ct.run(ct.train_step(record), make_state(), DataLoader(cached, batch_size=4), epochs=2, progress=False)
    want = [cached.read_batch(range(s, s + 4), epoch=e)[0] for e in range(2) for s in (0, 4)]
    assert len(seen) == 4 and all(torch.equal(a, b) for a, b in zip(seen, want, strict=True))


def test_items_with_more_leaves_than_open_files_allowed_are_written(tmp_path: Path) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    items = [{f"k{j}": float(i * j) for j in range(300)} for i in range(3)]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # fewer than the item's leaves
    try:
        cached = ct.cache(items, tmp_path / "store", progress=False, num_workers=0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert all(same_item(cached[i], items[i]) for i in range(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".store.lock", "store"]


def test_a_link_to_a_store_is_followed_and_a_rebuild_writes_where_it_points(tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    os.symlink(tmp_path / "big" / "store", tmp_path / "link")  # dangling until the store is written
    ct.cache([torch.ones(2)] * 3, tmp_path / "link", progress=False)
    again = ct.cache([torch.zeros(2)] * 3, tmp_path / "link", rebuild=True, progress=False)
    assert torch.equal(again[0], torch.zeros(2)) and again.path == tmp_path / "big" / "store"
    assert os.path.islink(tmp_path / "link") and sorted(p.name for p in (tmp_path / "big").iterdir()) == [
        ".store.lock",
        "store",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "link"]


def test_an_augment_that_changes_the_batch_size_is_named(tmp_path: Path) -> None:
    cached = ct.cache(
        [(torch.ones(3) * i, i) for i in range(6)],
        tmp_path / "store",
        progress=False,
        augment=lambda b, g: [b[0][:1], b[1]],
    )
    with pytest.raises(
        ValueError, match=r"augment returned a batch of 1 rows for 3 indices \(a tensor of shape \(1, 3\)\)"
    ):
        next(iter(DataLoader(cached, batch_size=3)))


def test_empty_complex_tensors_come_back_viewable_and_verify_compares_them(tmp_path: Path) -> None:
    items = [(torch.empty(0, dtype=torch.complex128), torch.empty(2, 0, dtype=torch.complex64))] * 2
    ct.cache(items, tmp_path / "store", progress=False)
    cached = ct.cache(items, tmp_path / "store", progress=False, verify=True)  # same_item of empty tensors
    for got in (cached[1], cached.__getitems__([0])[0]):
        assert same_item(got, items[0])
        assert got[0].view(torch.float64).shape == (0,) and got[1].view(torch.float32).shape == (2, 0)
    zero_strides = torch.from_numpy(np.array(np.empty((2, 0), np.complex128)[np.asarray([1])][0]))
    assert zero_strides.stride() == (0,)  # what a dataset built on NumPy may return
    assert same_item(zero_strides, items[0][0]) and not same_item(zero_strides, items[0][1])


def test_a_map_refused_for_lack_of_address_space_says_so(tmp_path: Path, monkeypatch: Any) -> None:
    import errno

    cached = ct.cache([torch.ones(4)] * 3, tmp_path / "store", progress=False)

    def no_room(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(np, "memmap", no_room)  # what mmap does past RLIMIT_AS (ulimit -v)
    with pytest.raises(OSError, match=r"mapping .*f0\.npy .* address space limit \(ulimit -v, RLIMIT_AS\)"):
        cached.read_batch([0])


def test_the_store_records_a_fingerprint_of_some_items_and_verify_finds_a_change_in_the_middle(
    tmp_path: Path,
) -> None:
    from composetrain.data.writer import fingerprint, sampled

    items = [(torch.full((3,), float(i)), i, {"m": np.int16(i)}) for i in range(9)]
    path = tmp_path / "store"
    ct.cache(items, path, progress=False, num_workers=0)
    recorded = json.loads((path / "manifest.json").read_text())["origin"]["fingerprint"]
    assert recorded == {"items": sampled(9), "blake2b": fingerprint([items[i] for i in sampled(9)])}
    assert {0, 4, 8} <= set(sampled(9))
    ct.cache(items, path, progress=False, verify=True)  # the same items: accepted
    changed = list(items)
    changed[4] = (torch.full((3,), 4.5), 4, {"m": np.int16(4)})  # same type and length, first and last alike
    shown = str(sampled(9)).replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ValueError, match=rf"items {shown} of the dataset differ from those the store .* made"):
        ct.cache(changed, path, progress=False)  # compared at every open
    retyped = list(items)
    retyped[4] = (torch.full((3,), 4.0).view(torch.int32), 4, {"m": np.int16(4)})  # the same bytes, another dtype
    with pytest.raises(ValueError, match="differ from those the store"):
        ct.cache(retyped, path, progress=False)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_augmented_cache_with_a_collate_fn_is_augmented_per_epoch_by_ct_run(tmp_path: Path, workers: int) -> None:
    cached = noisy_store(tmp_path)
    seen: list[torch.Tensor] = []

    def record(model: Any, batch: Any) -> Any:
        assert isinstance(batch, tuple)  # what the collate_fn made of the augmented rows
        seen.append(batch[0].clone())
        return classify(model, batch)

    ct.run(
        ct.train_step(record),
        make_state(),
        cached,
        batch_size=4,
        epochs=2,
        progress=False,
        shuffle=False,
        num_workers=workers,
        collate_fn=lambda rows: tuple(default_collate(rows)),
    )
    want = [cached.read_batch(range(s, s + 4), epoch=e)[0] for e in range(2) for s in (0, 4)]
    assert len(seen) == 4 and all(torch.equal(a, b) for a, b in zip(seen, want, strict=True))


def test_a_disk_too_full_for_the_lock_files_note_fails_as_a_full_disk_with_the_cache_message(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import errno

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)  # the lock's "who holds it" note: the first byte written
    monkeypatch.setattr("composetrain.data.store_files.NpyWriter.flush", full)
    with pytest.raises(OSError, match=r"cache: writing .*store failed: No space left on device; nothing was kept"):
        ct.cache([torch.ones(2)] * 3, tmp_path / "store", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".store.lock"]


def test_rebuild_is_not_skipped_for_a_store_dated_in_the_future(tmp_path: Path) -> None:
    from composetrain.data.writer import sampled

    path, items = tmp_path / "store", [torch.zeros(2)] * 40
    ct.cache(items, path, progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["origin"]["created"] += 3600.0  # written on a node whose clock is an hour ahead
    (path / "manifest.json").write_text(json.dumps(manifest))
    j = min(set(range(40)) - set(sampled(40)))  # changed where the fingerprint does not look: only a rebuild sees it
    changed = [*items[:j], torch.ones(2), *items[j + 1 :]]
    rebuilt = ct.cache(changed, path, rebuild=True, progress=False)
    assert torch.equal(rebuilt[j], torch.ones(2))


def test_numpy_scalars_of_an_alias_type_pass_verify(tmp_path: Path) -> None:
    items = [(np.array([i], "q")[0], np.array([i], "Q")[0], np.float32(i)) for i in range(3)]
    assert type(items[0][0]) is np.longlong  # the same dtype as np.int64, another type
    ct.cache(items, tmp_path / "store", progress=False)
    cached = ct.cache(items, tmp_path / "store", progress=False, verify=True)
    assert all(same_item(cached[i], items[i]) for i in range(3)) and cached[2][0].dtype == np.int64
    assert not same_item(np.int64(1), np.int32(1)) and not same_item(np.float32(1), np.int32(1))


def test_a_bool_timeout_is_refused_rather_than_taken_for_one_second(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"cache: timeout must be a positive number, got True \(bool\); e\.g\."):
        ct.cache([torch.ones(1)], tmp_path / "store", timeout=True, progress=False)  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()


class Growing(torch.utils.data.Dataset[Any]):
    """A dataset whose len grows after its first call (another process appending to its index)."""

    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        self.calls += 1
        return 10 if self.calls < 2 else 11

    def __getitem__(self, i: int) -> Any:
        return torch.ones(1) * i


def test_a_dataset_whose_len_changes_while_written_is_written_at_its_first_len_then_refused(tmp_path: Path) -> None:
    data, path = Growing(), tmp_path / "store"
    cached = ct.cache(data, path, progress=False)  # no bare AssertionError from the writer
    assert len(cached) == 10 and all(same_item(cached[i], torch.ones(1) * i) for i in range(10))
    with pytest.raises(ValueError, match=r"length: the store has 10, the dataset 11"):
        ct.cache(data, path, progress=False)

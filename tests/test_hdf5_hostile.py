"""ct.hdf5 against hostile files and arguments: links to other files, files changed after opening, odd index
lists and seeds, an augment that changes the batch, and the advice the bottleneck report gives for HDF5."""

import gc
import os
import pickle

import numpy as np
import pytest
import torch

import composetrain as ct

h5py = pytest.importorskip("h5py")

N = 12
ROWS = np.arange(N * 3, dtype="<f4").reshape(N, 3)


def h5(path, **datasets):
    with h5py.File(path, "w") as f:
        f["pad"] = np.full(500, 9.0)  # the datasets below do not start where a smaller file's would
        for name, (data, options) in datasets.items():
            f.create_dataset(name, data=data, **options)
    return path


def test_a_dataset_behind_an_external_link_is_read_from_the_linked_file(tmp_path, monkeypatch):
    """An external link's dataset lies in another file: its rows come from there (mapped there), not from the
    same offset in the file that holds the link."""
    (tmp_path / "sub").mkdir()
    h5(tmp_path / "sub" / "other.h5", z=(-ROWS, {}), zc=(-ROWS, {"chunks": (5, 3), "compression": "gzip"}))
    path = h5(tmp_path / "sub" / "main.h5", x=(ROWS, {}))
    with h5py.File(path, "a") as f:
        f["ext"] = h5py.ExternalLink("other.h5", "z")  # relative to the linking file's folder
        f["extc"] = h5py.ExternalLink("other.h5", "zc")
    monkeypatch.chdir(tmp_path)  # not the files' folder
    data = ct.hdf5(path, ["x", "ext", "extc"])
    assert data.mapped == ["x", "ext"]
    index = [5, 0, 11, 5]
    copy = pickle.dumps(data)
    for got in (data.read_batch(index), pickle.loads(copy).read_batch(index)):
        assert [t.tolist() for t in got] == [ROWS[index].tolist(), (-ROWS[index]).tolist(), (-ROWS[index]).tolist()]
    h5(tmp_path / "sub" / "other.h5", z=(ROWS, {}), zc=(ROWS, {}))  # the linked file rewritten: checked too
    with pytest.raises(RuntimeError, match=r"ct\.hdf5: .*other\.h5 changed since ct\.hdf5 opened it"):
        pickle.loads(copy).read_batch(index)


@pytest.mark.parametrize("layout", [{}, {"chunks": (4, 3), "compression": "gzip"}])
@pytest.mark.parametrize("change", ["rewritten", "moved", "truncated", "deleted"])
def test_a_file_changed_after_ct_hdf5_is_refused_not_misread(tmp_path, layout, change):
    """Rewritten with other values of the same size, rewritten with the dataset elsewhere, cut short or
    removed between ct.hdf5 and the first read (or a loader worker's): named, never rows of the new file."""
    path = h5(tmp_path / "data.h5", x=(ROWS, layout))
    data = ct.hdf5(path, "x")
    copy = pickle.dumps(data)  # what a loader worker gets
    if change == "rewritten":
        h5(path, x=(ROWS + 100, layout))
    elif change == "moved":
        with h5py.File(path, "w") as f:
            f["x"] = ROWS + 100
    elif change == "truncated":
        os.truncate(path, 100)
    else:
        os.remove(path)
    for reader in (data, pickle.loads(copy)):
        with pytest.raises(
            RuntimeError, match=r"ct\.hdf5: .*data\.h5 .*changed since ct\.hdf5 opened it.*ct\.hdf5 again"
        ):
            reader.read_batch([1])


def test_a_file_read_before_it_changed_is_not_checked_again(tmp_path):
    """The check costs one stat per file and process, when it maps or opens: reads after it cost nothing more."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    data = ct.hdf5(path, "x")
    assert data.read_batch([2]).tolist() == [ROWS[2].tolist()]
    os.utime(path, ns=(1, 1))  # a new mtime: too late to matter for the map already open
    assert data.read_batch([3]).tolist() == [ROWS[3].tolist()]


def test_a_dropped_dataset_closes_its_file_at_once(tmp_path):
    """The h5py handle of a dataset no longer used is closed when it is dropped (no reference cycle keeps it
    open until a garbage collection), so the same process can write the file again."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {"chunks": (4, 3)}))
    data = ct.hdf5(path, "x")
    assert data.read_batch([2]).tolist() == [ROWS[2].tolist()]
    gc.disable()
    try:
        del data
        with h5py.File(path, "a") as f:  # "file is already open for read-only" while the handle lives
            f["y"] = ROWS
    finally:
        gc.enable()


@pytest.mark.parametrize("bad", [[1.5], [True, False], [[1, 2], [3, 4]], np.array([1.0]), torch.tensor([0.5])])
@pytest.mark.parametrize("augmented", [False, True])
def test_index_lists_that_are_not_integers_are_refused(tmp_path, bad, augmented):
    """read_batch (and __getitems__ with an augment, which goes through it) never rounds, casts or flattens."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    data = ct.hdf5(path, "x", augment=(lambda b, g: b) if augmented else None)
    with pytest.raises(TypeError, match=r"HDF5Dataset\.read_batch: indices must be a flat list of ints"):
        data.read_batch(bad)
    with pytest.raises(TypeError, match=r"HDF5Dataset.*must be .*int"):
        data.__getitems__(bad)
    assert data.read_batch(np.array([3, 1], dtype=np.int32)).tolist() == ROWS[[3, 1]].tolist()
    assert data.read_batch(torch.tensor([3, -1])).tolist() == ROWS[[3, -1]].tolist()


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**70])
def test_a_seed_beyond_64_bits_is_refused_when_made(tmp_path, seed):
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    with pytest.raises(ValueError, match=r"ct\.hdf5: seed must be a 64-bit int \(-2\*\*63 <= seed < 2\*\*63\), got"):
        ct.hdf5(path, "x", seed=seed, augment=lambda b, g: b)
    for edge in (2**63 - 1, -(2**63)):
        assert ct.hdf5(path, "x", seed=edge, augment=lambda b, g: b).read_batch([1]).shape == (1, 3)


def test_a_path_that_is_not_a_path_or_a_directory_is_named(tmp_path):
    with pytest.raises(TypeError, match=r"ct\.hdf5: file must be a path \(str or os\.PathLike\), got 123"):
        ct.hdf5(123, "x")
    with pytest.raises(IsADirectoryError, match=r"ct\.hdf5: .* is a directory, not an HDF5 file"):
        ct.hdf5(tmp_path, "x")


def test_a_dataset_of_object_references_is_named_as_such(tmp_path):
    path = tmp_path / "refs.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("refs", (N,), dtype=h5py.ref_dtype)
    with pytest.raises(TypeError, match=r"'refs' .*object references.*torch has no tensor for") as refused:
        ct.hdf5(path, "refs")
    assert "variable-length" not in str(refused.value)


@pytest.mark.parametrize("rows", [1, 3])
def test_an_augment_that_changes_the_number_of_rows_is_named(tmp_path, rows):
    """Items are split from the augmented batch: one row per index asked, or a clear error."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    data = ct.hdf5(path, ["x"], augment=lambda b, g: [torch.cat([b[0], b[0]])[:rows]])
    with pytest.raises(ValueError, match=rf"augment returned a batch of {rows} rows for 2 indices"):
        data.__getitems__([4, 5])


def test_the_bottleneck_report_advises_what_fits_an_hdf5_file(tmp_path):
    """Not "a ct.cache store already: make its augment cheaper" for a file h5py reads without any augment."""
    from composetrain.driver.monitor import _cheaper
    from composetrain.driver.reader import Reader

    path = h5(tmp_path / "data.h5", x=(ROWS, {}), packed=(ROWS, {"chunks": (4, 3), "compression": "gzip"}))

    def advice(data):
        return _cheaper(Reader(data, range(len(data)), 4, False, None, 0, lambda n: None, 1))

    slow = advice(ct.hdf5(path, ["x", "packed"]))
    assert "['packed'] through h5py" in slow and "contiguous" in slow and "augment" not in slow
    assert "ct.cache store" not in slow
    flat = advice(ct.hdf5(path, "x", augment=lambda b, g: b))
    assert "make its augment cheaper" in flat and "ct.cache store" not in flat and "memory map" in flat
    assert "augment" not in advice(ct.hdf5(path, "x"))


def _noise(batch, generator):
    x, y = batch
    return [x + torch.rand(x.shape, generator=generator, dtype=x.dtype), y]


def _as_dict(items):
    return {"x": torch.stack([x for x, _ in items]), "y": torch.stack([y for _, y in items])}


@pytest.mark.parametrize("workers", [0, 1])
def test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn(tmp_path, workers):
    """With a collate_fn ct.run read items (__getitems__) with the dataset's own epoch, never set: every epoch
    drew the same "random" augmentation. Now as without one: the batch read whole, then the collate_fn."""
    path = h5(tmp_path / "data.h5", x=(np.zeros((8, 2)), {}), y=(np.arange(8), {"chunks": (4,)}))
    data = ct.hdf5(path, ["x", "y"], augment=_noise, seed=4)
    runs = {}
    for name, collate in (("none", None), ("default", torch.utils.data.default_collate), ("dict", _as_dict)):
        seen = []

        def step(model, batch, seen=seen, collate=collate):
            assert isinstance(batch, dict) == (collate is _as_dict)  # the collate_fn given made it
            x = batch["x"] if isinstance(batch, dict) else batch[0]
            seen.append(x.clone())
            return model(x).sum()

        model = torch.nn.Linear(2, 1).double()
        ct.run(
            step,
            ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.0)),
            data,
            batch_size=8,
            epochs=3,
            shuffle=False,
            collate_fn=collate,
            num_workers=workers,
            progress=False,
        )
        runs[name] = seen
    assert len(runs["none"]) == 3 and not torch.equal(runs["none"][0], runs["none"][1])
    for name in ("default", "dict"):
        assert all(torch.equal(a, b) for a, b in zip(runs[name], runs["none"], strict=True)), name


def test_a_file_another_process_writes_is_named_with_the_fix(tmp_path):
    """HDF5 locks a file open for writing: h5py's "unable to lock file, errno = 11" becomes what to do."""
    import subprocess
    import sys

    path = h5(tmp_path / "data.h5", x=(ROWS, {}))
    holder = "import h5py, sys, time; f = h5py.File(sys.argv[1], 'a'); print('open', flush=True); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", holder, str(path)], stdout=subprocess.PIPE, text=True) as writer:
        try:
            assert writer.stdout.readline().strip() == "open"
            with pytest.raises(BlockingIOError, match=r"ct\.hdf5: .*data\.h5 is open for writing in another process"):
                ct.hdf5(path, "x")
        finally:
            writer.kill()


def test_a_file_cut_short_before_ct_hdf5_is_named(tmp_path):
    """HDF5 refuses a file shorter than its superblock says: named by ct.hdf5, with the file, not h5py alone."""
    path = h5(tmp_path / "data.h5", x=(np.zeros((1000, 10)), {}))
    os.truncate(path, os.path.getsize(path) - 1000)
    with pytest.raises(OSError, match=r"ct\.hdf5: h5py cannot open .*data\.h5: .*truncated file"):
        ct.hdf5(path, "x")


def test_caching_an_augmented_dataset_is_refused_not_one_draw_frozen(tmp_path):
    """ct.cache of a ct.hdf5 (or ct.cache) dataset made with augment= would store one draw of the augmentation
    for every epoch; refused with the fix, before anything is written. Without augment= it caches the rows."""
    path = h5(tmp_path / "data.h5", x=(ROWS, {"chunks": (4, 3)}))
    with pytest.raises(ValueError, match=r"cache: the dataset augments its batches.*give augment= to ct\.cache"):
        ct.cache(ct.hdf5(path, ["x", "x"], augment=_noise), tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()
    cached = ct.cache(ct.hdf5(path, ["x", "x"]), tmp_path / "store", augment=_noise, progress=False)
    assert cached.__getitems__([2])[0][0].tolist() != ROWS[2].tolist()  # augmented as read, never stored
    assert ct.cache(ct.hdf5(path, ["x", "x"]), tmp_path / "store", progress=False)[2][0].tolist() == ROWS[2].tolist()


def _augmented_run(data, loader, epochs=3, folder=None, max_steps=None):
    seen = []

    def step(model, batch):
        seen.append(batch[0].clone())
        return model(batch[0]).sum()

    model = torch.nn.Linear(2, 1).double()
    ct.run(
        step,
        ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.0)),
        loader,
        epochs=epochs,
        progress=False,
        checkpoint_dir=folder,
        max_steps=max_steps,
    )
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_given_to_ct_run_augments_per_epoch(tmp_path, workers):
    """ct.run sets the epoch of an augmented dataset under a DataLoader it was given (it never did: every epoch
    drew the same augmentation), as a loop calling data.set_epoch(epoch) would; a resumed run draws alike."""
    from torch.utils.data import DataLoader

    path = h5(tmp_path / "data.h5", x=(np.zeros((8, 2)), {}), y=(np.arange(8), {"chunks": (4,)}))
    data = ct.hdf5(path, ["x", "y"], augment=_noise, seed=1)
    seen = _augmented_run(data, DataLoader(data, batch_size=4, num_workers=workers))
    want = [data.read_batch(i, epoch)[0] for epoch in range(3) for i in ([0, 1, 2, 3], [4, 5, 6, 7])]
    assert len(seen) == 6 and all(torch.equal(a, b) for a, b in zip(seen, want, strict=True))
    _augmented_run(data, DataLoader(data, batch_size=4, num_workers=workers), folder=tmp_path / "ck", max_steps=3)
    resumed = _augmented_run(data, DataLoader(data, batch_size=4, num_workers=workers), folder=tmp_path / "ck")
    assert all(torch.equal(a, b) for a, b in zip(resumed, want[3:], strict=True)) and len(resumed) == 3


def test_a_dataloader_whose_persistent_workers_never_see_the_epoch_is_refused(tmp_path):
    from torch.utils.data import DataLoader

    path = h5(tmp_path / "data.h5", x=(np.zeros((8, 2)), {}), y=(np.arange(8), {}))
    data = ct.hdf5(path, ["x", "y"], augment=_noise)
    loader = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match=r"persistent workers .*never see the epoch.*persistent_workers=False"):
        _augmented_run(data, loader)
    assert loader._iterator is None  # refused before any worker started

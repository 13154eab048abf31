"""ct.tokens: windows of token files (raw .bin, .npy) read as slicing the files would give them, a whole batch per
gather, mapped in each process and never copied whole; ct.run over them reads every window once per epoch, and a
resumed run reads what the uninterrupted one did."""

import mmap
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from torch import nn
from torch.utils.data import DataLoader

import composetrain as ct

VOCAB = 50

DTYPES = ["<u2", "<u4", "<i4", "u1", ">u2", "<i8"]


@st.composite
def shards(draw):
    """(files as (name, dtype, values), seq_len): 1 to 3 files, each long enough for a window."""
    seq_len = draw(st.integers(1, 9))
    files = []
    for n in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(DTYPES))
        count = draw(st.integers(seq_len + 1, 6 * seq_len + 5))
        values = draw(st.lists(st.integers(0, 200), min_size=count, max_size=count))
        kind = "npy" if dtype[0] == ">" else draw(st.sampled_from(["bin", "npy"]))  # a raw file is little-endian
        files.append((f"shard_{n}.{kind}", dtype, values))
    return files, seq_len


def write(folder, files):
    """The files on disk; raw ones of their dtype (given to ct.tokens: all raw files of one draw share it)."""
    paths = []
    for name, dtype, values in files:
        array = np.array(values, dtype=dtype)
        path = Path(folder) / name
        np.save(path, array) if name.endswith(".npy") else array.tofile(path)
        paths.append(path)
    return paths


def expected_windows(files, seq_len):
    """Every window, file after file, by slicing the token lists: (inputs, targets)."""
    out = []
    for _, _, values in files:
        for k in range((len(values) - 1) // seq_len):
            window = values[k * seq_len : k * seq_len + seq_len + 1]
            out.append((window[:-1], window[1:]))
    return out


@given(shards(), st.data())
def test_every_window_is_the_files_slice_read_alone_or_in_a_batch(drawn, data):
    files, seq_len = drawn
    raw = {dtype for name, dtype, _ in files if name.endswith(".bin")}
    if raw:  # the dtype given is the raw files', and .npy files must agree with it
        files = [(n, min(raw), v) for n, _, v in files]
        raw = {min(raw)}
    with tempfile.TemporaryDirectory() as folder:
        dataset = ct.tokens(write(folder, files), seq_len, dtype=raw.pop() if raw else None)
        expected = expected_windows(files, seq_len)
        assert len(dataset) == len(expected)
        assert dataset.dropped == [(len(v) - 1) % seq_len for _, _, v in files]
        for k, (inputs, targets) in enumerate(expected):
            x, y = dataset[k]
            assert x.dtype == y.dtype == torch.int64 and x.tolist() == inputs and y.tolist() == targets
        indices = data.draw(st.lists(st.integers(-len(expected), len(expected) - 1), max_size=12), label="indices")
        x, y = dataset.read_batch(indices)
        assert x.shape == y.shape == (len(indices), seq_len) and x.is_contiguous() and y.is_contiguous()
        assert x.tolist() == [expected[i][0] for i in indices] and y.tolist() == [expected[i][1] for i in indices]
        items = dataset.__getitems__(indices)
        assert [(a.tolist(), b.tolist()) for a, b in items] == [expected[i] for i in indices]


def test_the_windows_of_a_file_cover_it_once_sharing_one_token_and_drop_a_short_tail(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(23, dtype=np.uint16).tofile(path)
    data = ct.tokens(path, 5, dtype=np.uint16)
    assert len(data) == 4 and data.dropped == [2]  # tokens 0..20 read, 21 and 22 never
    inputs = torch.cat([data[k][0] for k in range(4)]).tolist()
    targets = torch.cat([data[k][1] for k in range(4)]).tolist()
    assert inputs == list(range(20)) and targets == list(range(1, 21))
    assert "4 windows" in repr(data)


def test_a_batch_across_files_of_different_dtypes_reads_each_file_once(tmp_path, monkeypatch):
    np.save(tmp_path / "a.npy", np.arange(0, 9, dtype=np.uint8))
    np.save(tmp_path / "b.npy", np.arange(1000, 1009, dtype=np.int32))
    data = ct.tokens([tmp_path / "a.npy", tmp_path / "b.npy"], 4)
    assert len(data) == 4
    inputs, targets = data.read_batch([3, 0, 2])
    assert inputs.tolist() == [[1004, 1005, 1006, 1007], [0, 1, 2, 3], [1000, 1001, 1002, 1003]]
    assert targets[:, -1].tolist() == [1008, 4, 1004]


def test_reading_maps_the_files_and_pickles_without_them(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    data = ct.tokens(str(path), 10, dtype="uint16")
    data[0]
    chain, base = [], data._rows[0]
    while base is not None:  # the windows are a view of the map: nothing copied
        chain.append(base)
        base = getattr(base, "base", None)
    assert any(isinstance(b, mmap.mmap) for b in chain) and not any(
        getattr(b, "flags", None) and b.flags.owndata for b in chain
    )
    assert len(pickle.dumps(data)) < 2000  # the files are not in it
    copy = pickle.loads(pickle.dumps(data))
    assert copy._arrays is None and copy._rows is None
    assert torch.equal(copy.read_batch([5, 7])[0], data.read_batch([5, 7])[0])


def test_loader_workers_read_what_this_process_reads(tmp_path):
    path = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 60000, 5000).astype(np.uint16).tofile(path)
    data = ct.tokens(path, 16, dtype=np.uint16)
    loader = DataLoader(data, batch_size=7, num_workers=2, shuffle=False)
    batches = list(loader)
    assert len(batches) == -(-len(data) // 7)
    for n, (x, y) in enumerate(batches):
        ex, ey = data.read_batch(range(n * 7, min(len(data), n * 7 + 7)))
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_a_file_changed_after_ct_tokens_checked_it_is_refused_when_a_process_maps_it(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    data = ct.tokens(path, 10, dtype=np.uint16)
    sent = pickle.dumps(data)  # as to a loader worker, before it maps the file
    ct.write_tokens([np.arange(5)], path, dtype=np.uint16)  # a new file at the path
    with pytest.raises(RuntimeError, match=r"^ct\.tokens: .*train\.bin changed since ct\.tokens checked it \(another"):
        pickle.loads(sent)[0]
    with pytest.raises(RuntimeError, match=r"changed since ct\.tokens checked it \(another"):
        data[0]  # this process never mapped it either
    again = pickle.dumps(ct.tokens(path, 10, dtype=np.uint16))
    with open(path, "ab") as f:  # written in place
        f.write(b"\0\0")
    with pytest.raises(RuntimeError, match=r"changed since ct\.tokens checked it \(its size went from 210 to 212"):
        pickle.loads(again)[0]


@pytest.mark.parametrize("change", ["cut", "written"])
def test_a_file_changed_after_this_process_mapped_it_is_refused_at_the_next_read(tmp_path, change):
    """Mapped already: a file cut short killed the process with SIGBUS at the read (no error, no traceback), and one
    written in place was read as the tokens it holds now. Run in a child process, which the SIGBUS would kill."""
    path = tmp_path / "train.bin"
    np.arange(1 << 16, dtype=np.uint16).tofile(path)
    code = (
        "import os, numpy as np, composetrain as ct\n"
        f"path = {str(path)!r}\n"
        "data = ct.tokens(path, 1024, dtype=np.uint16)\n"
        "assert data.read_batch([60])[0][0, 0] == 60 * 1024  # mapped\n"
        f"if {change!r} == 'cut':\n"
        "    os.truncate(path, 4096)\n"
        "else:\n"
        "    with open(path, 'r+b') as f:\n"
        "        f.seek(2 * 60 * 1024)\n"
        "        f.write(bytes(8))\n"
        "try:\n"
        "    data.read_batch([60])\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert said.returncode == 0, said.stderr[-500:]
    what = "its size went from 131072 to 4096 bytes" if change == "cut" else "it was written to"
    assert said.stdout.startswith(f"ct.tokens: {path} changed since ct.tokens checked it ({what})")


def test_an_index_out_of_range_or_not_an_int_is_refused_naming_the_dataset(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(21, dtype=np.uint16).tofile(path)
    data = ct.tokens(path, 5, dtype=np.uint16)
    with pytest.raises(IndexError, match=r"^TokenDataset: index 4 out of range for 4 items"):
        data[4]
    with pytest.raises(IndexError, match=r"out of range for 4 items"):
        data.read_batch([0, -5])
    with pytest.raises(TypeError, match=r"^TokenDataset: an index must be an int, got float"):
        data[1.0]
    assert data[-1][1].tolist() == [16, 17, 18, 19, 20]


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_checking_a_large_file_against_the_vocabulary_reads_it_in_chunks_without_copying_it(tmp_path):
    path = tmp_path / "big.bin"
    chunk = np.arange(1 << 20, dtype=np.uint16) % 50000
    with open(path, "wb") as f:
        for _ in range(48):  # 96 MB
            chunk.tofile(f)
    before = rss()
    data = ct.tokens(path, 1024, dtype=np.uint16, vocab_size=50000)
    grew = rss() - before
    data.read_batch(list(range(0, len(data), 97)))
    assert len(data) == (48 * (1 << 20) - 1) // 1024
    assert grew < 32 * 2**20, grew  # chunks of 4M tokens (8 MB), never the file's 96 MB


# -- ct.run over ct.tokens ----------------------------------------------------------------------------------
class Bigram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(VOCAB, VOCAB, dtype=torch.float64)

    def forward(self, ids):
        return self.table(ids)


def lm_step(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


@pytest.fixture
def shard_files(tmp_path):
    g = np.random.default_rng(1)
    paths = []
    for n, count in enumerate([97, 64]):
        path = tmp_path / f"shard_{n}.bin"
        ct.write_tokens([g.integers(0, VOCAB, count)], path, dtype=np.uint16)
        paths.append(path)
    return paths


def run_recording(data, checkpoint_dir=None, **options):
    seen = []

    def step(model, batch):
        seen.append([t.clone() for t in batch])
        return lm_step(model, batch)

    model = Bigram()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.5))
    ct.run(ct.train_step(step), state, data, progress=False, checkpoint_dir=checkpoint_dir, **options)
    return seen, state


def test_a_run_reads_every_window_once_per_epoch_a_whole_batch_per_update(shard_files):
    data = ct.tokens(shard_files, 8, dtype=np.uint16, vocab_size=VOCAB)
    seen, _ = run_recording(data, epochs=2, global_batch_size=5, drop_last=False, seed=3)
    per_epoch = -(-len(data) // 5)
    assert len(seen) == 2 * per_epoch
    every = sorted(data[k][0].tolist() for k in range(len(data)))
    for epoch in range(2):
        windows = [row.tolist() for x, _ in seen[epoch * per_epoch : (epoch + 1) * per_epoch] for row in x]
        assert sorted(windows) == every  # each window once: without replacement
    orders = [[row.tolist() for x, _ in seen[e * per_epoch : (e + 1) * per_epoch] for row in x] for e in range(2)]
    assert orders[0] != orders[1]  # reshuffled per epoch


def test_a_run_resumed_reads_and_trains_what_the_uninterrupted_run_did(shard_files, tmp_path):
    data = ct.tokens(shard_files, 8, dtype=np.uint16)
    straight, end = run_recording(data, epochs=2, global_batch_size=4)
    first, _ = run_recording(data, tmp_path / "run", epochs=2, global_batch_size=4, max_steps=7)
    rest, resumed = run_recording(data, tmp_path / "run", epochs=2, global_batch_size=4)
    both = first + rest
    assert len(both) == len(straight)
    for a, b in zip(both, straight, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert torch.equal(resumed.model.table.weight, end.model.table.weight)


def test_ct_run_reads_token_windows_whole_in_this_process(shard_files, monkeypatch):
    data = ct.tokens(shard_files, 8, dtype=np.uint16)
    reads = []
    monkeypatch.setattr(type(data), "__getitems__", lambda self, i: reads.append(i))  # never item by item
    seen, _ = run_recording(data, batch_size=4, max_steps=3, num_workers="auto")
    assert len(seen) == 3 and reads == [] and all(x.shape == (4, 8) for x, _ in seen)


def test_the_bottleneck_advice_names_token_files_as_what_they_are(shard_files):
    from composetrain.driver.monitor import _cheaper
    from composetrain.driver.reader import Reader

    data = ct.tokens(shard_files, 8, dtype=np.uint16)
    reader = Reader(data, range(len(data)), 4, False, None, 0, lambda n: None, 1)
    assert _cheaper(reader) == (
        "the data is ct.tokens' memory-mapped token files already, read a whole batch at a time: give the job more CPUs"
    )


def test_two_ranks_read_their_share_of_each_update_and_train_as_one_process(pool, shard_files):
    data = ct.tokens(shard_files, 8, dtype=np.uint16)
    alone, state = run_recording(data, epochs=1, global_batch_size=4, seed=2)
    ranks = pool.run(__name__, "train_on_tokens", [str(p) for p in shard_files])
    assert [len(r["batches"]) for r in ranks] == [len(alone)] * 2
    for k, whole in enumerate(alone):  # update k: rank 0's rows, then rank 1's
        for field in range(2):
            joined = torch.cat([r["batches"][k][field] for r in ranks])
            assert torch.equal(joined, whole[field])
    for r in ranks:
        torch.testing.assert_close(r["weight"], state.model.table.weight, rtol=1e-12, atol=1e-12)


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
def train_on_tokens(rank: int, world: int, paths: list[str]) -> dict:
    data = ct.tokens(paths, 8, dtype=np.uint16)  # each rank maps the files itself
    seen = []

    def step(model, batch):
        seen.append([t.clone() for t in batch])
        return lm_step(model, batch)

    model = Bigram()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.5))
    ct.run(ct.distributed(step), state, data, epochs=1, global_batch_size=4, seed=2, progress=False)
    return {"batches": seen, "weight": state.model.table.weight.detach().clone()}

"""ct.run's loaders: batched reads identical to a DataLoader's, num_workers="auto" by measurement,
reading ahead onto the device, exact resume whatever was chosen."""

import tempfile
import time
from pathlib import Path

import hypothesis.strategies as st
import pytest
import run_script
import torch
from helpers import StopsAt, assert_states_equal, batches_seen
from hypothesis import example, given, settings
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

import composetrain as ct
from composetrain.core.batching import leaves, to_device
from composetrain.core.rng import seed_everything
from composetrain.driver import loader as ct_data
from composetrain.driver import reader as ct_reader
from composetrain.driver.loader import build_loader, epoch_batches
from composetrain.driver.options import LoaderOptions
from composetrain.driver.prefetch import device_batches
from composetrain.driver.reader import ResumableSampler, choose_workers

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def build(data, *, batch_size, shuffle=True, drop_last=False, workers=0, collate_fn=None, rank=0, world=1, seed=0):
    options = LoaderOptions(data, batch_size, shuffle, drop_last, workers, collate_fn, seed)
    return build_loader(options, pin_memory=False, rank=rank, world_size=world, local_world_size=1)


def reference(data, sampler, batch_size, drop_last, collate_fn=None):
    """What a DataLoader over the same sampler gives: the path ct.run's reader must equal."""
    return DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=drop_last, collate_fn=collate_fn)


def assert_same_batch(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous() == b.is_contiguous()
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_batch(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_batch(x, y)
    else:
        assert a == b


class Batched(Dataset):
    """Offers ``__getitems__``: read once per batch, then collated, as torch's fetcher does."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 3, generator=g), torch.randint(0, 5, (n,), generator=g)
        self.calls = []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        raise AssertionError("read sample by sample")

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [{"x": self.x[i], "y": int(self.y[i]), "name": f"s{i}"} for i in indices]


class PerSample(Dataset):
    """Neither a TensorDataset nor batched: read sample by sample."""

    def __init__(self, n):
        self.inner = run_script.dataset(n)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        x, y = self.inner[i]
        return (x, y)


def datasets(n):
    g = torch.Generator().manual_seed(0)
    return {
        "tensors": TensorDataset(
            torch.randn(n, 2, 3, generator=g, dtype=torch.float64),
            torch.randint(0, 9, (n,), generator=g),
            torch.rand(n, generator=g) > 0.5,
        ),
        "one tensor": TensorDataset(torch.arange(n * 2, dtype=torch.int16).view(n, 2)),
        "not contiguous": TensorDataset(torch.randn(4, n, generator=g).t()),
        "getitems": Batched(n),
        "subset": Subset(TensorDataset(torch.arange(3 * n).view(n, 3)), list(range(n - 1, -1, -1))),
        "per sample": PerSample(n),
    }


# -- batched reads ---------------------------------------------------------------------------------
@given(
    n=st.integers(1, 30),
    batch_size=st.integers(1, 8),
    world=st.integers(1, 3),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 3),
    kind=st.sampled_from(list(datasets(2))),
    data=st.data(),
)
@settings(max_examples=60)
def test_batches_read_in_this_process_are_those_a_dataloader_gives(
    n, batch_size, world, shuffle, drop_last, seed, epoch, kind, data
):
    """The same values, dtypes, shapes and structure (default_collate's list for a TensorDataset's tuples),
    in the same order, for any rank's share, epoch and starting batch."""
    dataset = datasets(n)[kind]
    if drop_last and batch_size * world > n:
        return  # refused: tested in test_run
    rank = data.draw(st.integers(0, world - 1), label="rank")
    options = {"batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last, "world": world}
    reader, sampler = build(dataset, rank=rank, seed=seed, **options)
    assert isinstance(reader, ct_reader.Reader) and reader.num_workers == 0
    assert reader.batched == (kind != "per sample")
    own = ResumableSampler(DistributedSampler(dataset, world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last))
    expected_loader = reference(dataset, own, batch_size, drop_last)
    assert len(reader) == len(expected_loader)
    total = len(reader)
    start = data.draw(st.integers(0, total - 1), label="start")
    sampler.set_epoch(epoch, start=start * batch_size)
    own.set_epoch(epoch, start=start * batch_size)
    got, expected = list(reader), list(expected_loader)
    assert len(got) == len(expected) == total - start
    for a, b in zip(got, expected, strict=True):
        assert_same_batch(a, b)


def test_a_tensor_dataset_is_indexed_once_per_batch_not_per_sample(monkeypatch):
    dataset = datasets(20)["tensors"]
    reads = []
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: reads.append(i))
    reader, _ = build(dataset, batch_size=6)
    assert [b[0].shape[0] for b in reader] == [6, 6, 6, 2] and reads == []  # never sample by sample


def test_getitems_is_called_once_per_batch_with_the_samplers_indices():
    dataset = Batched(10)
    reader, _ = build(dataset, batch_size=4, shuffle=False)
    batches = list(reader)
    assert dataset.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[0]["name"] == ["s0", "s1", "s2", "s3"] and batches[2]["y"].dtype == torch.int64


def test_a_tensor_dataset_on_another_device_is_indexed_there():
    reader, _ = build(TensorDataset(torch.empty(10, 2, device="meta")), batch_size=4, shuffle=False)
    (x,) = next(iter(reader))
    assert x.device.type == "meta" and x.shape == (4, 2)


def test_a_collate_fn_is_used_and_a_tensor_dataset_then_reads_like_a_dataloader():
    dataset = datasets(9)["tensors"]

    def collate(samples):
        return {"x": torch.stack([s[0] for s in samples]), "n": len(samples)}

    reader, _ = build(dataset, batch_size=4, shuffle=False, collate_fn=collate)
    assert [b["n"] for b in reader] == [4, 4, 1]
    assert torch.equal(next(iter(reader))["x"], dataset.tensors[0][:4])


def test_explicit_workers_read_through_a_dataloader_and_give_the_same_batches():
    dataset = datasets(13)["tensors"]
    mine, _ = build(dataset, batch_size=4, workers=2, seed=3)
    theirs, _ = build(dataset, batch_size=4, workers=0, seed=3)
    assert mine.num_workers == 2 and mine.choice is None
    for a, b in zip(list(mine), list(theirs), strict=True):
        assert_same_batch(a, b)


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"batch_size": 2.5}, TypeError, r"run: batch_size must be a positive int, got 2.5 \(float\)"),
        ({"batch_size": 0}, ValueError, r"run: batch_size must be a positive int, got 0 \(int\)"),
        ({"workers": 1.0}, TypeError, r"run: num_workers must be a non-negative int, got 1.0 \(float\); e.g."),
        ({"workers": "al"}, TypeError, r"run: num_workers must be a non-negative int, got 'al' \(str\)"),
        ({"workers": True}, TypeError, r"run: num_workers must be a non-negative int, got True \(bool\)"),
        ({"workers": -2}, ValueError, r"run: num_workers must be a non-negative int, got -2 \(int\)"),
    ],
)
def test_bad_loader_options_are_a_clear_error(options, error, pattern):
    with pytest.raises(error, match=pattern):
        build(datasets(4)["tensors"], **{"batch_size": 2, **options})


# -- num_workers="auto" ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fetch", "step", "spare", "workers", "says"),
    [
        (0.001, 0.010, 8, 0, "9% of an update: no workers"),  # cheap reads: workers only add copies
        (0.030, 0.010, 0, 0, "no core is spare"),
        (0.030, 0.010, 7, 3, "3 worker(s) of the 7 spare cores, for 4.0x"),  # enough to hide the reading
        (0.030, 0.010, 2, 2, "2 worker(s) of the 2 spare cores, for 2.7x"),  # as many as there are cores
        (0.0128, 0.0015, 1, 0, "would give at most 1.12x the speed: no workers"),  # one worker hides only the step
        (0.010, 0.010, 1, 1, "1 worker(s) of the 1 spare cores, for 2.0x"),
        (0.5, 0.0, 4, 4, "4 worker(s) of the 4 spare cores"),  # an empty step: every spare core
        (0.0, 0.0, 4, 0, "0% of an update"),
    ],
)
def test_choose_workers_from_given_timings(fetch, step, spare, workers, says):
    chosen, why = choose_workers(fetch, step, spare)
    assert chosen == workers and says in why
    assert choose_workers(fetch, step, spare) == (chosen, why)  # deterministic


@given(fetch=st.floats(0, 1), step=st.floats(0, 1), spare=st.integers(0, 16))
def test_choose_workers_never_picks_more_than_the_spare_cores_nor_workers_that_do_not_pay(fetch, step, spare):
    chosen, _ = choose_workers(fetch, step, spare)
    assert 0 <= chosen <= spare
    if chosen:
        assert fetch >= 0.2 * (fetch + step) and (fetch + step) / max(step, fetch / chosen) >= 1.5


@pytest.fixture
def readers(monkeypatch):
    """Every Reader ct.run builds, in the order it builds them."""
    built, original = [], ct_reader.Reader.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(ct_reader.Reader, "__init__", spy)
    return built


def auto_run(dataset, **options):
    state = run_script.state()
    options = {"batch_size": 12, "progress": False, "seed": 5, "log_every": 4, **options}
    return state, ct.run(ct.accumulate(2)(run_script.step), state, dataset, **options)


def test_auto_on_a_cheap_dataset_reads_in_this_process_and_says_why():
    _, result = auto_run(PerSample(96), epochs=2)
    assert 'num_workers="auto" chose 0 (reading sample by sample: ' in result.bottleneck
    assert "no workers" in result.bottleneck


def test_when_auto_chose_no_workers_for_a_slow_dataset_the_report_does_not_say_raise_them(monkeypatch):
    class Slow(PerSample):
        def __getitem__(self, i):
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:  # busy, like decoding
                pass
            return super().__getitem__(i)

    monkeypatch.setattr(ct_reader, "choose_workers", lambda fetch, step, spare: (0, "stub"))
    _, result = auto_run(Slow(96), epochs=1)
    assert result.bottleneck.startswith("data loading is ") and "raise num_workers" not in result.bottleneck
    assert '"auto" chose 0 (reading sample by sample: ' in result.bottleneck
    assert result.bottleneck.endswith(
        "stub; make the dataset's __getitem__ cheaper: preprocess once with "
        "ct.cache(dataset, path) (items decoded once, then read a whole batch at a "
        "time from a memory map), smaller inputs, or give the job more CPUs"
    )


def test_auto_on_a_tensor_dataset_reads_whole_batches(monkeypatch, readers):
    # never timed, never handed to workers, whatever the timings would say: one indexing per batch
    # beats any worker (which would read it sample by sample and pickle it)
    monkeypatch.setattr(ct_reader, "choose_workers", lambda fetch, step, spare: (2, "forced"))
    _, result = auto_run(run_script.dataset(), epochs=2)
    assert readers[0].indexed and readers[0].num_workers == 0 and not readers[0].deciding
    assert 'num_workers="auto" chose 0: a TensorDataset is read a whole batch at a time' in result.bottleneck


def test_the_workers_ct_run_started_end_with_the_run():
    """Training's and evaluation's workers are stopped when ct.run returns, not when the garbage
    collector gets to them (a cycle through the evaluator once kept them alive)."""
    import gc
    import multiprocessing

    gc.disable()
    try:
        auto_run(PerSample(96), epochs=1, num_workers=1, eval_step=evaluate_acc, eval_data=PerSample(30))
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()


def test_auto_decides_after_timing_the_first_updates(monkeypatch):
    seen = []

    def chooser(fetch, step, spare):
        seen.append((fetch, step, spare))
        return 0, "stub"

    monkeypatch.setattr(ct_reader, "choose_workers", chooser)
    _, result = auto_run(PerSample(96), max_steps=12, log_every=100)
    assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] > 0  # once, from measured times
    # the choice's reason, wherever the report puts it: after the cause when compute-bound, before the
    # advice when reading takes over a fifth of the step (which the machine's load decides)
    assert 'num_workers="auto" chose 0 (reading sample by sample: ' in result.bottleneck
    assert "): stub" in result.bottleneck


def test_auto_choosing_workers_switches_at_the_batch_it_stopped_at_and_trains_the_same(monkeypatch):
    """Workers take over part-way through the first epoch: every sample once per epoch, in the order of
    the run read in this process alone, and the same parameters bit for bit."""
    straight, plain = auto_run(PerSample(96), epochs=2, num_workers=0)
    monkeypatch.setattr(ct_reader, "choose_workers", lambda fetch, step, spare: (2, "forced"))
    switched, result = auto_run(PerSample(96), epochs=2)
    assert 'num_workers="auto" chose 2' in result.bottleneck
    assert_states_equal(switched, straight)
    assert [r["loss"] for r in result.history] == [r["loss"] for r in plain.history]


def evaluate_acc(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).double().mean()}


def test_evaluation_indexes_a_tensor_dataset_a_batch_at_a_time_and_others_with_trainings_workers(monkeypatch, readers):
    """The eval loader is built at the first evaluation: a TensorDataset is indexed once per batch in
    this process; another dataset gets as many workers as "auto" chose for training (not 0 from
    before the choice)."""
    built = readers
    monkeypatch.setattr(ct_reader, "choose_workers", lambda fetch, step, spare: (2, "forced"))
    _, result = auto_run(PerSample(96), epochs=1, eval_step=evaluate_acc, eval_data=run_script.dataset(30))
    assert len(result.evals) == 1
    evaluation = built[-1]
    assert evaluation.indexed and evaluation.num_workers == 0 and len(evaluation.dataset) == 30
    built.clear()
    _, result = auto_run(PerSample(96), epochs=1, eval_step=evaluate_acc, eval_data=PerSample(30))
    assert built[-1].dataset is not built[0].dataset and built[-1].num_workers == 2  # training's choice


def test_evaluation_is_the_same_however_the_eval_data_is_read():
    """Indexed a batch at a time, read by workers, or given as a DataLoader: the same exact mean."""
    direct, _ = auto_run(run_script.dataset(), epochs=1, num_workers=0)
    x, y = run_script.dataset(30).tensors
    direct.model.eval()
    with torch.no_grad():
        expected = (direct.model(x).argmax(-1) == y).double().mean().item()
    for data, workers in (
        (run_script.dataset(30), 0),
        (PerSample(30), 2),
        (DataLoader(PerSample(30), batch_size=7), 0),
    ):
        _, result = auto_run(
            run_script.dataset(), epochs=1, num_workers=workers, eval_step=evaluate_acc, eval_data=data
        )
        assert result.evals[-1]["acc"] == pytest.approx(expected, abs=1e-12)


# -- exact resume, whatever was chosen -------------------------------------------------------------
def resumes_exactly(tmp, dataset, stop, **options):
    straight, _ = auto_run(dataset(), epochs=2, checkpoint_dir=tmp / "a", **options)
    auto_run(dataset(), max_steps=stop, checkpoint_dir=tmp / "b", **options)
    resumed, _ = auto_run(dataset(), epochs=2, checkpoint_dir=tmp / "b", **options)
    assert_states_equal(resumed, straight)


@settings(max_examples=8)
@given(stop=st.integers(1, 15), path=st.sampled_from(["batched", "auto", "auto chose workers"]))
# the hard cases, every run: 8 updates an epoch and "auto" hands over after 6 reads, so a run resumed one
# update into an epoch (1, 9) hands over part-way through that resumed epoch, where the workers must start
# after the resumed position plus what this process read (a hand-over that forgot the resumed position
# is caught by these two stops only); 7: stopped just after its own hand-over
@example(stop=1, path="auto chose workers")
@example(stop=9, path="auto chose workers")
@example(stop=7, path="auto chose workers")
def test_a_run_stopped_after_any_update_resumes_bit_identically(stop, path):
    """Batched reads (a TensorDataset, the default "auto"), "auto" reading sample by sample, and "auto"
    switching to workers part-way (the stopped run, the resumed one and the straight one each switch
    at their own update): the same parameters as the uninterrupted run."""
    dataset = run_script.dataset if path == "batched" else lambda: PerSample(96)
    original = ct_reader.choose_workers
    if path == "auto chose workers":
        ct_reader.choose_workers = lambda fetch, step, spare: (1, "forced")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            resumes_exactly(Path(tmp), dataset, stop)
    finally:
        ct_reader.choose_workers = original


@settings(max_examples=3)
@given(stop=st.integers(1, 15))
def test_a_run_with_explicit_workers_stopped_after_any_update_resumes_bit_identically(stop):
    with tempfile.TemporaryDirectory() as tmp:
        resumes_exactly(Path(tmp), lambda: PerSample(96), stop, num_workers=2)


# -- onto the device -------------------------------------------------------------------------------
class Counted:
    def __init__(self, batches):
        self.batches, self.reads = iter(batches), 0

    def __iter__(self):
        return self

    def __next__(self):
        self.reads += 1
        return next(self.batches)


@given(size=st.integers(0, 7), count=st.integers(0, 9), ahead=st.booleans())
def test_device_batches_gives_the_batches_in_order_and_reads_no_further_than_asked(size, count, ahead):
    batches = [(torch.full((2,), float(i)), {"i": i}) for i in range(size)]
    source = Counted(batches)
    got = list(device_batches(source, torch.device("cpu"), count, ahead=ahead))
    assert [b for b, _ in got] == batches[:count] and all(waited >= 0 for _, waited in got)
    assert source.reads == min(count, size + 1)  # the read that finds the end only when asked for more


def test_reading_ahead_on_the_cpu_reads_one_batch_ahead_of_the_step():
    source = Counted([torch.tensor([i]) for i in range(5)])
    batches = device_batches(source, torch.device("cpu"), 5, ahead=True)
    next(batches)
    assert source.reads == 2  # the next one was read before this one is used
    source = Counted([torch.tensor([i]) for i in range(5)])
    batches = device_batches(source, torch.device("cpu"), 5)
    next(batches)
    assert source.reads == 1  # on the CPU, not by default: a stopped run must have read no further


def test_epoch_batches_counts_positions_from_the_start():
    reader, sampler = build(datasets(20)["tensors"], batch_size=3, shuffle=False)
    got = list(epoch_batches(reader, sampler, 0, 2, None, torch.device("cpu"), 5))
    assert [p for p, _, _ in got] == [3, 4, 5]
    assert torch.equal(got[0][1][1], datasets(20)["tensors"].tensors[1][6:9])


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", ["tensors", "getitems", "per sample"])
def test_batches_copied_ahead_on_a_side_stream_equal_the_cpu_ones(kind):
    dataset = datasets(50)[kind]
    reader, sampler = build(dataset, batch_size=8, seed=2)
    cpu = list(epoch_batches(reader, sampler, 1, 1, None, torch.device("cpu"), 6))
    gpu = list(epoch_batches(reader, sampler, 1, 1, None, torch.device("cuda"), 6))
    assert [p for p, _, _ in gpu] == [p for p, _, _ in cpu] == [2, 3, 4, 5, 6]
    for (_, a, _), (_, b, _) in zip(cpu, gpu, strict=True):
        assert all(t.device.type == "cuda" for t in leaves(b))
        assert_same_batch(a, to_device(b, torch.device("cpu")))


@pytest.mark.gpu
@cuda
def test_a_tensor_dataset_kept_on_the_gpu_is_indexed_there():
    x = torch.arange(20.0, device="cuda").view(10, 2)
    reader, _ = build(TensorDataset(x, torch.arange(10, device="cuda")), batch_size=4, shuffle=False)
    assert_same_batch(next(iter(reader)), [x[:4], torch.arange(4, device="cuda")])


@pytest.mark.gpu
@cuda
def test_a_run_on_cuda_reads_ahead_and_trains():
    state, result = auto_run(run_script.dataset(), epochs=2)
    assert result.steps == 16 and state.model[0].weight.device.type == "cuda"
    assert result.history[-1]["loss"] < result.history[0]["loss"]


# -- small moves -----------------------------------------------------------------------------------
def test_worker_seeding_goes_through_seed_everything():
    import random

    import numpy as np

    seed_everything((3 * 7919 + 1 * 104729 + 1009 * 2) % 2**32)  # (seed, rank, worker) as runs have derived it
    first = (random.random(), float(np.random.rand()), float(torch.rand(())))
    seed_everything(7)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) != first
    worker = ct_data._seed_worker(3, 1, 0)  # worker 2 of rank 1 of seed 3, a run started at update 0
    worker(2)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == first


def test_loader_workers_start_under_the_spawn_start_method():
    """Workers started by "spawn" (macOS's default, or set by the user) get the init function pickled: a closure
    would fail every run with workers there."""
    import multiprocessing
    import pickle

    pickle.dumps(ct_data._seed_worker(7, 0, 0))
    data = TensorDataset(torch.arange(10.0), torch.arange(10))
    loader, sampler = build(data, batch_size=4, workers=1, seed=3)
    method = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        got = [b for _, b, _ in epoch_batches(loader, sampler, 0, 0, None, torch.device("cpu"), len(loader))]
    finally:
        loader.close()
        multiprocessing.set_start_method(method, force=True)
    want = list(reference(data, sampler, 4, False))
    assert len(got) == len(want) == 3 and all(torch.equal(g[0], w[0]) for g, w in zip(got, want, strict=True))


def test_to_device_lives_in_batching_and_keeps_the_structure():
    batch = {"x": torch.ones(2), "tag": "a", "pair": (torch.zeros(1), 3)}
    moved = to_device(batch, torch.device("cpu"))
    assert moved["x"] is batch["x"] and moved["tag"] == "a" and moved["pair"][1] == 3


# -- a StopIteration in a loader worker -------------------------------------------------------------------------


def test_a_stopiteration_in_a_loader_worker_is_an_error_not_the_end_of_the_epoch() -> None:
    """The bug (batches silently dropped): ct.run's loader reads by a DataLoader with workers, which re-raises a
    worker's StopIteration in this process, where ``next(batches, _END)`` takes it for the end of the epoch: the
    run trains on 3 of its 5 batches and reports success. In this process the same dataset is a RuntimeError
    ("generator raised StopIteration"); under num_workers="auto" which one happens depends on timing."""
    for workers in (0, 1):
        try:
            seen = batches_seen(StopsAt(), num_workers=workers)
        except Exception as e:  # the fix chooses the type; it must say why
            assert "StopIteration" in f"{type(e).__name__}: {e}", e
        else:
            raise AssertionError(f"num_workers={workers}: the epoch ended after {len(seen)} of 5 batches, no error")

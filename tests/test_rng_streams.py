"""The random streams ct.run hands its steps: Python's cached Gaussian survives a checkpoint, and on a fresh
start each rank draws its own stream (dropout masks and augmentations differ between ranks); the in-memory
snapshot of every generator (``Generators``) and the seeds derived from the run's (``derive_seed``)."""

import random
import types

import numpy as np
import pytest
import run_script
import torch
from hypothesis import given
from hypothesis import strategies as st

import composetrain as ct
from composetrain.core.rng import EVERY, HOST, Generators, capture_rng, derive_seed, restore_rng, seed_everything
from composetrain.driver import run as ct_run


def test_the_cached_gaussian_is_in_the_saved_state(tmp_path):
    random.seed(3)
    random.gauss(0, 1)  # draws a pair: the second waits in the generator's cache
    assert random.getstate()[2] is not None
    torch.save(capture_rng(), tmp_path / "rng.pt")
    expected = [random.gauss(0, 1) for _ in range(3)]
    random.seed(99)
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert [random.gauss(0, 1) for _ in range(3)] == expected


def gauss_run(draws, checkpoint_dir, **options):
    def step(model, batch):
        draws.append(random.gauss(0, 1))  # an augmentation's draw: one per update, so a pair spans two
        return run_script.step(model, batch)

    ct.run(
        step,
        run_script.state(),
        run_script.dataset(),
        batch_size=12,
        progress=False,
        seed=5,
        checkpoint_dir=checkpoint_dir,
        **options,
    )


def test_a_resumed_run_draws_the_gaussians_the_uninterrupted_one_drew(tmp_path):
    straight, first, resumed = [], [], []
    gauss_run(straight, tmp_path / "a", max_steps=6)
    gauss_run(first, tmp_path / "b", max_steps=3)  # stops with the second of a pair cached
    gauss_run(resumed, tmp_path / "b", max_steps=6)
    assert first == straight[:3] and resumed == straight[3:]


RESUME = ct_run._Driver.resume


def first_draws(monkeypatch, rank, seed=0):
    """What a fresh ct.run's step first draws from torch, Python and NumPy when this process is ``rank``
    (only the rank the driver seeds from is changed: the run itself stays a single process)."""

    def resume(self, schedule, seed):
        real, self.proc = self.proc, types.SimpleNamespace(rank=rank)
        try:
            return RESUME(self, schedule, seed)
        finally:
            self.proc = real

    monkeypatch.setattr(ct_run._Driver, "resume", resume)
    seen = []

    def step(model, batch):
        if not seen:
            seen.append((torch.rand(4).tolist(), random.random(), float(np.random.rand())))
        return run_script.step(model, batch)

    ct.run(step, run_script.state(), run_script.dataset(24), batch_size=12, progress=False, max_steps=1, seed=seed)
    return seen[0]


def test_each_rank_draws_its_own_streams_on_a_fresh_start(monkeypatch):
    rank0, again, rank1, rank2 = (first_draws(monkeypatch, r) for r in (0, 0, 1, 2))
    assert rank0 == again  # a fresh start is seeded, not left to chance
    for other in (rank1, rank2):
        assert all(a != b for a, b in zip(rank0, other, strict=True)), (rank0, other)
    assert all(a != b for a, b in zip(rank1, rank2, strict=True))
    assert first_draws(monkeypatch, 0, seed=1) != rank0  # and the seed still matters


def test_two_real_ranks_draw_differently_and_keep_the_same_weights():
    from processes import Pool

    pool = Pool(2)
    try:
        rank0, rank1 = pool.run(__name__, "first_draws_of_this_rank", timeout=300)
    finally:
        pool.close()
    assert all(a != b for a, b in zip(rank0[:3], rank1[:3], strict=True)), (rank0, rank1)
    assert rank0[3] == rank1[3]  # identical replicas: only the streams differ


# -- the in-memory snapshot -------------------------------------------------------------------------------
def draws(counts):
    """``counts`` draws from each global generator (torch CPU, Python, NumPy), Gaussians included (each of
    Python and NumPy caches the second of a pair), and from CUDA's when initialised."""
    n_torch, n_python, n_numpy = counts
    cuda = torch.rand(n_torch, device="cuda").tolist() if torch.cuda.is_initialized() else []
    return (
        torch.rand(n_torch).tolist() + torch.randn(n_torch).tolist(),
        [random.random() for _ in range(n_python)] + [random.gauss(0, 1) for _ in range(n_python)],
        np.random.rand(n_numpy).tolist() + np.random.standard_normal(n_numpy).tolist(),
        cuda,
    )


counts = st.tuples(*[st.integers(0, 5)] * 3)


@given(seed=st.integers(0, 2**32 - 1), before=counts, during=counts, after=counts)
def test_a_snapshot_puts_back_every_generator(seed, before, during, after):
    seed_everything(seed)
    draws(before)  # a cached Gaussian may be waiting when the snapshot is taken
    taken = Generators()
    first = draws(during) + draws(after)
    taken.restore()
    assert draws(during) + draws(after) == first
    taken.restore()  # as often as asked
    assert draws(during) + draws(after) == first


@given(seed=st.integers(0, 2**32 - 1), during=counts)
def test_a_snapshot_of_some_generators_leaves_the_others_running(seed, during):
    seed_everything(seed)
    taken = Generators(HOST)  # what activation checkpointing replays itself: torch's are checkpoint's own
    first = draws(during)
    taken.restore()
    second = draws(during)
    assert second[1:3] == first[1:3]  # Python's and NumPy's repeat
    seed_everything(seed)
    straight = draws(during) + draws(during)
    assert second[0] == straight[4]  # torch's went on: the second draws, not the first again


def test_a_snapshot_names_the_generators_it_knows():
    assert set(EVERY) == {"torch", "cuda", "python", "numpy"} and set(HOST) <= set(EVERY)
    with pytest.raises(ValueError, match=r"Generators: kinds must be among .*got \['nump'\]"):
        Generators(("python", "nump"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_snapshot_puts_back_the_gpus_generators():
    torch.cuda.init()
    taken = Generators()
    first = torch.rand(5, device="cuda").tolist()
    taken.restore()
    assert torch.rand(5, device="cuda").tolist() == first
    taken = Generators(HOST)
    torch.rand(5, device="cuda")
    again = torch.rand(5, device="cuda").tolist()
    taken.restore()
    assert torch.rand(5, device="cuda").tolist() != again  # not taken, not put back


# -- derived seeds: the values of every earlier run, pinned ------------------------------------------------
@given(seed=st.integers(0, 2**32 - 1), rank=st.integers(0, 4095), worker=st.integers(0, 63))
def test_derived_seeds_are_those_runs_were_resumed_with(seed, rank, worker):
    # the formulas ct.run and its loader wrote inline before derive_seed: a checkpoint continues their streams
    assert derive_seed(seed, "fresh start", rank=rank) == seed * 1000003 + rank
    assert derive_seed(seed, "loader", rank=rank) == seed * 7919 + rank
    worker_seed = (seed * 7919 + rank * 104729 + 1009 * worker) % 2**32
    assert derive_seed(seed, "worker", rank=rank, worker=worker) == worker_seed


@pytest.mark.parametrize(
    ("args", "value"),
    [
        ((0, "fresh start"), 0),
        ((5, "fresh start", 1), 5000016),
        ((2**32 - 1, "fresh start", 7), 4294967295 * 1000003 + 7),
        ((0, "loader", 3), 3),
        ((5, "loader", 1), 39596),
        ((0, "worker", 0, 0), 0),
        ((5, "worker", 1, 2), 146342),
        ((2**32 - 1, "worker", 3, 5), (4294967295 * 7919 + 3 * 104729 + 5045) % 2**32),
    ],
)
def test_derived_seeds_for_a_few_runs(args, value):
    seed, purpose, *rest = args
    assert derive_seed(seed, purpose, **dict(zip(("rank", "worker"), rest, strict=False))) == value


def test_an_unknown_purpose_is_refused():
    with pytest.raises(ValueError, match=r"derive_seed: purpose must be one of .*'fresh start'.*got 'fresh'"):
        derive_seed(1, "fresh")


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# What a fresh ct.run's step first draws on each rank of a real pool.


def first_draws_of_this_rank(rank: int, world: int) -> tuple[list[float], float, float, list[float]]:
    seen = []

    def step(model, batch):
        if not seen:
            seen.append((torch.rand(4).tolist(), random.random(), float(np.random.rand())))
        return run_script.step(model, batch)

    state = run_script.state()
    ct.run(ct.distributed(step), state, run_script.dataset(48), batch_size=12, progress=False, max_steps=1, seed=0)
    state.release_runtime()
    first = next(state.model.parameters()).detach().flatten()[:4].tolist()  # the same weights on every rank
    return (*seen[0], first)

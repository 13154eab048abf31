"""The random streams ct.run hands its steps: Python's cached Gaussian survives a checkpoint, and on a fresh
start each rank draws its own stream (dropout masks and augmentations differ between ranks)."""

import random
import types

import numpy as np
import run_script
import torch

import composetrain as ct
from composetrain.core.rng import capture_rng, restore_rng
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

    ct.run(step, run_script.state(), run_script.dataset(), batch_size=12, progress=False, seed=5,
           checkpoint_dir=checkpoint_dir, **options)  # fmt: skip


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
        rank0, rank1 = pool.run("rng_workers", "first_draws", timeout=300)
    finally:
        pool.close()
    assert all(a != b for a, b in zip(rank0[:3], rank1[:3], strict=True)), (rank0, rank1)
    assert rank0[3] == rank1[3]  # identical replicas: only the streams differ

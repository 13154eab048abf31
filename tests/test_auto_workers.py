"""num_workers="auto" shares the node's cores among the processes on it: each gets its share less one core
for itself, at most 8 workers (16 cores: 1 process 8 workers, 4 processes 3 each, 16 processes none)."""

import os

import pytest
import run_script

from composetrain.driver import loader
from composetrain.driver.loader import build_loader
from composetrain.driver.options import LoaderOptions
from composetrain.driver.reader import auto_workers


@pytest.fixture
def cores(monkeypatch):
    def set_cores(n, affinity=True):
        if affinity:
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
        else:
            monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: n)

    return set_cores


@pytest.mark.parametrize(
    ("n", "local", "workers"),
    [
        (16, 1, 8),
        (16, 2, 7),
        (16, 3, 4),
        (16, 4, 3),
        (16, 5, 2),
        (16, 8, 1),
        (16, 9, 0),
        (16, 16, 0),
        (16, 32, 0),
        (8, 3, 1),
        (8, 1, 7),
        (10, 1, 8),
        (9, 1, 8),
        (1, 1, 0),
        (2, 1, 1),
        (64, 4, 8),
        (64, 16, 3),
        (16, 0, 8),  # an unknown count of processes reads as one
    ],
)
def test_the_cores_are_shared_among_the_processes_of_the_node(cores, n, local, workers):
    cores(n)
    assert auto_workers(local) == workers
    cores(n, affinity=False)  # macOS, Windows: the machine's count
    assert auto_workers(local) == workers


def test_the_affinity_mask_wins_over_the_machines_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # a container or a SLURM allocation limits this process
    assert auto_workers(1) == 3


@pytest.mark.parametrize(("local", "spare"), [(1, 8), (4, 3), (16, 0)])
def test_the_loader_offers_auto_its_share_of_the_cores(cores, local, spare):
    cores(16)
    options = LoaderOptions(
        run_script.dataset(), batch_size=12, shuffle=True, drop_last=False, num_workers="auto", collate_fn=None, seed=0
    )
    reader, _ = build_loader(options, pin_memory=False, rank=0, world_size=1, local_world_size=local)
    assert reader._spare == spare
    assert loader.auto_workers is auto_workers  # the one rule, not a copy

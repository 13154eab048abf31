"""Stragglers: at log points each rank's data wait, time in the step and waits for the others are gathered in one
small collective, and a rank slower than the others' median by more than the threshold is named, with its host and
whether it waited on data or computed. On 3 gloo ranks (``straggling``, run by each rank of a pool): rank 1 slowed
in reading its batches, then rank 2 slowed in its step, in one launch; and the rule itself on numbers.
"""

import copy
import re
import socket
import time

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import Dataset
from torch.utils.flop_counter import FlopCounterMode

import composetrain as ct
from composetrain.core.metric_names import MEASURED
from composetrain.driver.stragglers import RankTimes, Stragglers, find_stragglers

OWN_CLOCK = MEASURED - {"stragglers", "peak_memory_mib", "flops_per_update"}  # those three are gathered or summed

# Every rank's update lasts BASE seconds at least (a sleep in its step), a slowed one BASE + SLOW: on a loaded
# machine a rank descheduled for a few milliseconds must not look slower than the others by THRESHOLD, a slowed one
# always does (some 10x)
BASE, SLOW, THRESHOLD = 0.02, 0.2, 2.0


class Slowed(Dataset):
    """Regression samples; on rank ``slow_rank`` reading batch k (1-based) sleeps when k is in ``slow``."""

    def __init__(self, n, rank, slow_rank, slow):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x.sum(-1)
        self.rank, self.slow_rank, self.slow = rank, slow_rank, slow
        self.reads = 0

    def __len__(self):
        return len(self.x)

    def __getitems__(self, indices):
        self.reads += 1
        if self.rank == self.slow_rank and self.reads in self.slow:
            time.sleep(SLOW)
        return [(self.x[i], self.y[i]) for i in indices]

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def straggling(rank, world):
    """A rank of the pool: 24 updates in windows of 4, rank 1 slow to read updates 5-12, rank 2 slow in its step
    in updates 13-20."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1))
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01))
    done = [0]

    def step(m, batch):
        done[0] += 1
        time.sleep(BASE + (SLOW if rank == 2 and 13 <= done[0] <= 20 else 0.0))
        x, y = batch
        return F.mse_loss(m(x).squeeze(-1), y)

    data = Slowed(24 * 4 * world, rank, 1, set(range(5, 13)))
    with FlopCounterMode(display=False) as counter:  # what this rank's update counts, on a copy
        step(copy.deepcopy(model), (data.x[:4], data.y[:4])).backward()
    done[0] = 0
    result = ct.run(
        ct.distributed(step),
        state,
        data,
        batch_size=4,
        epochs=1,
        log_every=4,
        num_workers=0,
        progress=False,
        shuffle=False,
        peak_flops=1e9,
        straggler_threshold=THRESHOLD,
    )
    return {
        "history": result.history,
        "bottleneck": result.bottleneck,
        "waited": ct.distributed(step).waited(state),
        "flops": counter.get_total_flops(),
    }


@pytest.fixture(scope="module")
def pool3():
    from processes import Pool

    p = Pool(3)
    yield p
    p.close()


def test_the_slowed_rank_is_named_with_its_host_and_what_it_waited_on(pool3):
    ranks = pool3.run(__name__, "straggling", timeout=300)
    history = ranks[0]["history"]
    # every rank's record says the same, but for each rank's own clock (its elapsed time: updates_per_s, ...)
    alike = [[{k: v for k, v in rec.items() if k not in OWN_CLOCK} for rec in r["history"]] for r in ranks]
    assert alike[0] == alike[1] == alike[2]
    assert [r["step"] for r in history] == [4, 8, 12, 16, 20, 24]
    host = socket.gethostname()
    named = {r["step"]: [(s["rank"], s["cause"], s["host"]) for s in r.get("stragglers", [])] for r in history}
    # updates 5-12: rank 1 read slowly; 13-20: rank 2 computed slowly (the first window holds the FLOP count)
    assert named[8] == named[12] == [(1, "data", host)], named
    assert named[16] == named[20] == [(2, "compute", host)], named
    # no longer slowed, neither is named (nor rank 0, but for a rank descheduled for 80 ms on a loaded machine)
    assert not {rank for rank, _, _ in named[24]} & {1, 2}, named
    for r in history[1:5]:
        assert r["stragglers"][0]["slower"] > 5  # 220 ms an update against 20 and a few
    bottleneck = ranks[0]["bottleneck"]  # (the first window, with each rank's first-update work, may add one)
    ahead = r"was slower than the others by more than 2x in [23] of 6 log windows \(last [\d.]+x\), waiting on"
    assert re.search(rf"rank 1 on {host} {ahead} data: check its loader", bottleneck), bottleneck
    assert re.search(rf"rank 2 on {host} {ahead} compute: check its device", bottleneck), bottleneck
    # the others' time waiting for the slowed rank, measured by ct.distributed: 16 sleeps of 200 ms, 8 each
    assert ranks[0]["waited"] > 2.0 and ranks[1]["waited"] > 1.0 and ranks[2]["waited"] > 1.0
    for rank in ranks:  # the throughput fields are the three ranks' together
        for r in rank["history"]:
            assert r["flops_per_update"] == 3 * rank["flops"]  # each rank's update counted by FlopCounterMode
            assert r["samples_per_s"] / r["updates_per_s"] == pytest.approx(12, rel=1e-9)  # 4 samples on each
            assert r["mfu"] == pytest.approx(r["flops_per_update"] * r["updates_per_s"] / (3 * 1e9), rel=1e-9)


def differing_watch(rank, world, which, folder):
    """Rank 2 gives another straggler_threshold (or peak_flops): every rank refuses, naming each rank's, before the
    first update; a profiler window on one rank only is that rank's own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 1))
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01))
    given = {
        "threshold": {"straggler_threshold": 3.0 if rank == 2 else 1.5},
        "peak": {"peak_flops": 2e9 if rank == 2 else 1e9},
        "profile": {"profile": {"wait": 0, "warmup": 0, "active": 1} if rank == 0 else False},
    }[which]
    try:
        ct.run(
            ct.distributed(lambda m, b: F.mse_loss(m(b[0]).squeeze(-1), b[1])),
            state,
            Slowed(12 * world, rank, -1, set()),
            batch_size=4,
            max_steps=2,
            num_workers=0,
            progress=False,
            log_file=f"{folder}/{which}/metrics.jsonl",
            **given,
        )
    except ValueError as e:
        return str(e), state.step
    return None, state.step


def test_ranks_given_other_thresholds_or_peaks_refuse_together_before_the_first_update(pool3, tmp_path):
    threshold = pool3.run(__name__, "differing_watch", "threshold", str(tmp_path))
    message = (
        "run: the ranks' straggler_threshold or peak_flops differ: rank 0 straggler_threshold=1.5, peak_flops=None, "
        "rank 1 straggler_threshold=1.5, peak_flops=None, rank 2 straggler_threshold=3.0, peak_flops=None; each "
        "would name other stragglers and log another mfu: give every rank the same"
    )
    assert threshold == [(message, 0)] * 3
    peak = pool3.run(__name__, "differing_watch", "peak", str(tmp_path))
    assert all(m is not None and "rank 2 straggler_threshold=1.2, peak_flops=2000000000.0;" in m for m, _ in peak)
    assert all(step == 0 for _, step in peak)
    assert not (tmp_path / "threshold").exists() and not (tmp_path / "peak").exists()  # refused before any file
    assert pool3.run(__name__, "differing_watch", "profile", str(tmp_path)) == [(None, 2)] * 3


def times(*rows):
    return [RankTimes(*row) for row in rows]


HOSTS = ["a", "b", "c", "d"]


def test_a_rank_waiting_on_data_is_named_so():
    # rank 3 waits 0.5 s for data; the others wait for it inside the step (their step time includes it)
    found = find_stragglers(times((0.7, 0.5, 0.0), (0.7, 0.5, 0.0), (0.7, 0.5, 0.01), (0.2, 0.0, 0.5)), HOSTS, 1.2, 1.0)
    assert found == [{"rank": 3, "host": "d", "cause": "data", "slower": pytest.approx(0.7 / 0.2, rel=1e-3)}]


def test_a_rank_computing_slowly_is_named_so_though_every_step_lasts_as_long():
    # every rank's step takes 0.7 s: three of them waited 0.5 s of it for rank 1
    found = find_stragglers(
        times((0.7, 0.5, 0.01), (0.7, 0.0, 0.01), (0.7, 0.5, 0.01), (0.7, 0.5, 0.01)), HOSTS, 1.2, 1.0
    )
    assert [(s["rank"], s["cause"]) for s in found] == [(1, "compute")]


def test_no_rank_is_named_below_the_threshold_or_for_a_negligible_difference():
    alike = times((0.7, 0.1, 0.0), (0.7, 0.0, 0.0), (0.7, 0.1, 0.0))  # 0.7 against 0.6: 1.17x
    assert find_stragglers(alike, HOSTS, 1.2, 1.0) == []
    assert [s["rank"] for s in find_stragglers(alike, HOSTS, 1.1, 1.0)] == [1]
    tiny = times((0.0003, 0.0, 0.0), (0.0001, 0.0, 0.0), (0.0001, 0.0, 0.0))  # 3x, but 0.02% of the window
    assert find_stragglers(tiny, HOSTS, 1.2, 1.0) == []
    assert find_stragglers(times((1.0, 0.0, 0.0)), HOSTS, 1.2, 1.0) == []  # one rank: no others to compare with


@given(
    own=st.lists(st.floats(1.0, 1.15), min_size=3, max_size=8),
    slow=st.floats(2.0, 10.0),
    at=st.integers(0, 7),
    data=st.booleans(),
    scale=st.floats(1e-3, 1e3),
)
def test_the_one_slowed_rank_and_only_it_is_named_whatever_the_others(own, slow, at, data, scale):
    """Ranks whose own times lie within 1.2x of each other, one of them slowed ``slow`` times (in its data or in its
    step), in lockstep: each rank's step lasts until the slowest has joined the gradient all-reduce, the rest of it
    waiting. Exactly the slowed rank is named, with its cause, at any time scale."""
    at %= len(own)
    compute = [c * scale for c in own]
    waits = [0.0] * len(own)
    if data:
        waits[at] = compute[at] * (slow - 1)
    else:
        compute[at] *= slow
    cycle = max(c + w for c, w in zip(compute, waits, strict=True))
    rows = [(cycle - w, cycle - w - c, w) for c, w in zip(compute, waits, strict=True)]  # step, waited, data
    found = find_stragglers(times(*rows), [str(r) for r in range(len(own))], 1.2, cycle)
    assert [(s["rank"], s["cause"]) for s in found] == [(at, "data" if data else "compute")]


def test_the_sentence_counts_the_windows_each_rank_was_named_in():
    seen = Stragglers(1.5)
    slow = times((0.7, 0.0, 0.0), (0.7, 0.6, 0.0), (0.7, 0.6, 0.0))
    fine = times((0.7, 0.6, 0.0), (0.7, 0.6, 0.0), (0.7, 0.6, 0.0))
    assert seen.see(slow, HOSTS, 1.0)[0]["rank"] == 0
    assert seen.see(fine, HOSTS, 1.0) == []
    assert seen.sentence().startswith("rank 0 on a was slower than the others by more than 1.5x in 1 of 2 log windows")
    assert Stragglers(1.2).sentence() == ""


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (1.0, ValueError, r"run: straggler_threshold must be above 1 .*got 1.0"),
        ("2", TypeError, r"run: straggler_threshold must be a positive, finite number, got '2' \(str\)"),
        (float("inf"), ValueError, r"run: straggler_threshold must be a positive, finite number, got inf"),
    ],
)
def test_the_threshold_is_checked_before_anything_runs(value, error, message):
    import run_script

    with pytest.raises(error, match=message):
        ct.run(run_script.step, run_script.state(), run_script.dataset(), batch_size=4, straggler_threshold=value)


def test_one_process_gathers_nothing_and_names_no_one():
    import run_script

    _, result = run_script.train(max_steps=4)
    assert "stragglers" not in result.history[0] and "slower than the others" not in result.bottleneck
    assert torch.isfinite(torch.tensor(result.history[0]["peak_memory_mib"]))

"""Repeated resumes (PITFALLS 42, 47): a ``global_batch_size`` run interrupted k times at random updates, each part on
1, 2 or 3 processes (hypothesis: k, the points, the world sizes, with and without accumulate, ct.sharded, dropout
where every part runs on one number of processes), ends bit for bit as the uninterrupted run on that number (1 or 2:
see docs/limits for 3), or to float64 rounding on another, each update on the same samples and each
record in the metrics file once.

A few examples by default (each runs up to four jobs on gloo pools): ``CT_RESUME_EXAMPLES=50`` explores more.
"""

import json
import os
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from helpers import global_batch_job
from hypothesis import given, settings
from processes import Pool
from run_script import untimed

JOB = "helpers"  # the module the pools' ranks import for the job
EXAMPLES = int(os.environ.get("CT_RESUME_EXAMPLES", "6"))


@pytest.fixture(scope="module")
def pool3():
    p = Pool(3)
    yield p
    p.close()


@pytest.fixture(scope="module")
def launch(pool, pool3):
    """``launch(world, directory, spec)``: the job on ``world`` processes (1: this one), rank 0's result."""
    pools = {2: pool, 3: pool3}

    def on(world, directory, spec):
        if world == 1:
            return global_batch_job(0, 1, directory, spec)
        results = pools[world].run(JOB, "global_batch_job", directory, spec)
        seen = [entry for r in results for entry in r["seen"]]  # every rank's samples, in rank order
        return {**results[0], "seen": seen}

    return on


@st.composite
def chains(draw):
    sharded = draw(st.booleans())
    sizes = st.sampled_from([1, 2] if sharded else [1, 2, 3])  # 40 samples in updates of 6: the short 4 on 3 ranks
    stops = sorted(draw(st.lists(st.integers(1, 13), min_size=1, max_size=3, unique=True)))
    worlds = [draw(sizes) for _ in range(len(stops) + 1)]
    same = len(set(worlds)) == 1
    spec = {"sharded": sharded, "accumulate": draw(st.sampled_from([1, 2])), "dropout": 0.3 if same else 0.0}
    return stops, worlds, spec


def updates(seen):
    found = {}
    for update, indices in seen:
        found.setdefault(update, []).extend(indices)
    return found


references = {}  # (world, spec) -> the uninterrupted run, made once


@settings(max_examples=EXAMPLES, deadline=None)
@given(chains())
def test_a_run_interrupted_k_times_on_any_number_of_processes_ends_as_the_uninterrupted_run(launch, chain):
    stops, worlds, spec = chain
    same = len(set(worlds)) == 1
    reference_world = worlds[0] if same else 1
    key = (reference_world, tuple(sorted(spec.items())))
    with tempfile.TemporaryDirectory() as tmp:
        if key not in references:
            references[key] = launch(reference_world, f"{tmp}/straight", spec)
        straight = references[key]
        segments = zip(worlds, [*stops, None], strict=True)
        parts = [launch(w, f"{tmp}/run", {**spec, "stop_at": stop}) for w, stop in segments]
        lines = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
    assert [p["steps"] for p in parts] == [*stops, 14]
    assert [p["preempted"] for p in parts] == [True] * len(stops) + [False]
    last = parts[-1]
    seen = {}
    for p in parts:
        seen.update(updates(p["seen"]))
    assert seen == updates(straight["seen"])  # every update on the same samples
    if same and worlds[0] <= 2:  # bit for bit, dropout included
        assert all(torch.equal(v, last["params"][k]) for k, v in straight["params"].items())
        assert untimed(last["history"]) == untimed(straight["history"])
    else:  # on 3 processes too: a resumed process's first update all-reduces in another order (docs/limits)
        for k, v in straight["params"].items():
            assert torch.allclose(v, last["params"][k], rtol=1e-12, atol=0), k
        assert [r["step"] for r in last["history"]] == [r["step"] for r in straight["history"]]
        for a, b in zip(last["history"], straight["history"], strict=True):
            assert (a["loss"], a["acc"], a["lr"]) == pytest.approx((b["loss"], b["acc"], b["lr"]), rel=1e-12, abs=0)
    assert [r["step"] for r in lines] == [r["step"] for r in straight["history"]]  # each record once

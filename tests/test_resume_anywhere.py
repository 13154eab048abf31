"""A run defined by its global batch (``ct.run(global_batch_size=G)``) on real gloo processes: the same job on 1, 2
and 3 processes trains the same model and logs the same records; interrupted and resumed on 2, then 1, then 3,
then 2 processes it ends as the uninterrupted run, each update on the same samples, each record once; ct.sharded
saved on 2 resumes on 1 (DCP reshards); on the same number it resumes bit for bit; what cannot be made exact is
refused before anything changes. The job is tests/global_batch_workers.py (float64, no dropout unless asked).

One pool of 2 ranks, one of 3 and this process serve every check: the runs are made once, in ``runs``.
"""

import json

import pytest
import torch
from global_batch_workers import G, N, job, refused
from processes import Pool
from run_script import untimed

from composetrain.core.rng import derive_seed

WORKERS = "global_batch_workers"
SEED = 5  # the job's


@pytest.fixture(scope="module")
def pool3():
    p = Pool(3)
    yield p
    p.close()


def rank0(results):
    return results[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, pool, pool3):
    """Every run the tests below compare, made once (starting processes is what costs)."""
    tmp = tmp_path_factory.mktemp("anywhere")
    found = {"tmp": tmp}
    found["straight"] = {
        1: [job(0, 1, str(tmp / "s1"))],
        2: pool.run(WORKERS, "job", str(tmp / "s2")),
        3: pool3.run(WORKERS, "job", str(tmp / "s3")),
    }
    chain = str(tmp / "chain")  # 2 -> 1 -> 3 -> 2, each stopped by a signal inside a logging window
    found["chain"] = [
        pool.run(WORKERS, "job", chain, {"stop_at": 4}),
        [job(0, 1, chain, {"stop_at": 6})],
        pool3.run(WORKERS, "job", chain, {"stop_at": 10}),
        pool.run(WORKERS, "job", chain),
    ]
    sharded = str(tmp / "sharded")
    found["sharded"] = [
        pool.run(WORKERS, "job", sharded, {"sharded": True, "stop_at": 5, "keep_checkpoints": 5}),
        [job(0, 1, sharded, {"sharded": True, "keep_checkpoints": 5})],
    ]
    grow = str(tmp / "sharded-grow")  # saved on 1 process (where ct.sharded is the plain step), resumed on 2
    found["sharded_grow"] = [
        [job(0, 1, grow, {"sharded": True, "stop_at": 5})],
        pool.run(WORKERS, "job", grow, {"sharded": True}),
    ]
    found["sharded_straight"] = [job(0, 1, None, {"sharded": True})]
    found["dropout"] = [
        pool.run(WORKERS, "job", str(tmp / "d-straight"), {"dropout": 0.3}),
        pool.run(WORKERS, "job", str(tmp / "d"), {"dropout": 0.3, "stop_at": 5}),
        pool.run(WORKERS, "job", str(tmp / "d"), {"dropout": 0.3}),
    ]
    found["refused3"] = {
        "not_dividing": pool3.run(WORKERS, "refused", str(tmp / "r1"), {"global_batch_size": 4}),
        "empty_rank": pool3.run(WORKERS, "refused", str(tmp / "r2"), {"samples": 38}),
        "sharded_uneven": pool3.run(WORKERS, "refused", str(tmp / "r3"), {"sharded": True}),
    }
    assert pool.run(WORKERS, "per_process", str(tmp / "per-process")) == [2, 2]
    return found


def relative(a, b):
    """The largest relative difference between two dicts of tensors (by the larger magnitude of each entry)."""
    worst = 0.0
    for k, v in a.items():
        scale = torch.maximum(v.abs(), b[k].abs()).clamp_min(1e-300)
        worst = max(worst, ((v - b[k]).abs() / scale).max().item())
    return worst


def assert_same_records(a, b, rel=1e-12):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert (
            (x["epoch"], x["skipped"], x["global_batch"])
            == (y["epoch"], y["skipped"], y["global_batch"])
            == (
                x["epoch"],
                0,
                G,
            )
        )
        for key in ("loss", "acc", "lr"):
            assert x[key] == pytest.approx(y[key], rel=rel, abs=0), (key, x, y)


def updates(per_rank):
    """Which samples each update read, all ranks together (in rank order): {update: indices}."""
    found = {}
    for result in per_rank:
        for update, indices in result["seen"]:
            found.setdefault(update, {}).setdefault(id(result), []).extend(indices)
    return {u: [i for rank in by_rank.values() for i in rank] for u, by_rank in found.items()}


def test_the_same_job_on_1_2_and_3_processes_trains_the_same_model_and_logs_the_same_records(runs):
    straight = runs["straight"]
    one = rank0(straight[1])
    assert one["steps"] == 14  # 2 epochs of 7 updates
    for world in (2, 3):
        other = rank0(straight[world])
        difference = relative(one["params"], other["params"])
        print(f"W=1 against W={world}: largest relative parameter difference {difference:.3g}")
        assert difference <= 1e-12
        assert_same_records(one["history"], other["history"])
        assert updates(straight[world]) == updates(straight[1])  # the same samples in every update
    per_update = updates(straight[1])
    for epoch in range(2):  # every sample once per epoch; the last update the short one
        chosen = [per_update[u] for u in range(7 * epoch + 1, 7 * epoch + 8)]
        assert sorted(i for u in chosen for i in u) == list(range(N))
        assert [len(u) for u in chosen] == [6] * 6 + [4]
    assert per_update[1] != per_update[8]  # reshuffled every epoch
    shares = [sorted({len(i) for u, i in r["seen"] if u == 7}) for r in runs["straight"][3]]
    assert shares == [[1], [1], [1]]  # the short update's 4 samples: 2 (in 2 micro-batches of 1), 1, 1


def test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run(runs):
    one = rank0(runs["straight"][1])
    chain = runs["chain"]
    assert [rank0(c)["steps"] for c in chain] == [4, 6, 10, 14]
    assert [rank0(c)["preempted"] for c in chain] == [True, True, True, False]
    last = rank0(chain[-1])
    difference = relative(one["params"], last["params"])
    print(f"the chain 2 -> 1 -> 3 -> 2 against the uninterrupted run: largest relative difference {difference:.3g}")
    assert difference <= 1e-12
    assert_same_records(last["history"], one["history"])
    straight = updates(runs["straight"][1])
    seen = {}
    for segment in chain:
        seen.update(updates(segment))  # a stopped segment never reads past its last update
    assert seen == straight
    # each record reached on_record once over the four runs (and the last, shorter one of each run stopped inside
    # a logging window: 4 and 10), and the metrics file, rewritten from each checkpoint, holds the run's records once
    sent = [r for c in chain for r in rank0(c)["records"] if "eval" not in r]
    assert [r["step"] for r in sent] == sorted({3, 4, 6, 7, 9, 10, 12, 14})
    assert_same_records([r for r in sent if r["step"] not in (4, 10)], one["history"])
    lines = [json.loads(line) for line in (runs["tmp"] / "chain" / "metrics.jsonl").read_text().splitlines()]
    assert_same_records(lines, one["history"])
    # on another number of processes each rank's generators start from the seed, its rank and the update
    assert rank0(chain[1])["seed"] == derive_seed(SEED, "resume", rank=0, step=4)
    assert [r["seed"] for r in chain[2]] == [derive_seed(SEED, "resume", rank=r, step=6) for r in range(3)]
    assert [r["seed"] for r in chain[3]] == [derive_seed(SEED, "resume", rank=r, step=10) for r in range(2)]
    assert rank0(runs["straight"][1])["seed"] == derive_seed(SEED, "fresh start", rank=0)


def test_sharded_saved_on_2_processes_resumes_on_1_as_the_uninterrupted_run(runs):
    stopped, resumed = (rank0(r) for r in runs["sharded"])
    assert stopped["steps"] == 5 and stopped["preempted"] and resumed["steps"] == 14
    saved = runs["tmp"] / "sharded" / "step-000000005" / "shards"
    assert sorted(p.name for p in saved.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    straight = rank0(runs["sharded_straight"])
    difference = relative(straight["params"], resumed["params"])
    print(f"ct.sharded 2 -> 1 against the uninterrupted run: largest relative difference {difference:.3g}")
    assert difference <= 1e-12
    assert_same_records(resumed["history"], straight["history"])


def test_sharded_saved_on_1_process_resumes_sharded_on_2_as_the_uninterrupted_run(runs):
    stopped, resumed = (rank0(r) for r in runs["sharded_grow"])
    assert stopped["steps"] == 5 and stopped["preempted"] and resumed["steps"] == 14
    straight = rank0(runs["sharded_straight"])
    difference = relative(straight["params"], resumed["params"])
    print(f"ct.sharded 1 -> 2 against the uninterrupted run: largest relative difference {difference:.3g}")
    assert difference <= 1e-12
    assert_same_records(resumed["history"], straight["history"])


def test_on_the_same_number_of_processes_a_global_batch_run_resumes_bit_for_bit(runs):
    """With dropout: each rank restores its own generators, and the window its own unlogged outputs."""
    straight, stopped, resumed = runs["dropout"]
    assert rank0(stopped)["steps"] == 5 and rank0(resumed)["steps"] == 14
    for name, p in rank0(straight)["params"].items():
        assert torch.equal(p, rank0(resumed)["params"][name]), name
    assert untimed(rank0(resumed)["history"]) == untimed(rank0(straight)["history"])


def test_what_cannot_be_exact_is_refused_before_anything_changes(runs, tmp_path):
    cases = runs["refused3"]
    for results in cases.values():  # every rank refuses alike, and nothing was trained or written
        assert len({r["error"] for r in results}) == 1
        assert all(r["params_unchanged"] and r["files_before"] is None and r["files_after"] is None for r in results)
    assert cases["not_dividing"][0]["error"] == (
        "ValueError: run: global_batch_size=4 cannot be shared evenly among 3 processes (4 / 3 is not whole); run "
        "it on a number of processes that divides 4 (1, 2, 4), or choose a global_batch_size that 3 divides (e.g. 3 "
        "or 6)"
    )
    assert cases["empty_rank"][0]["error"] == (
        "ValueError: run: the dataset's 38 samples make 6 update(s) of global_batch_size=6 and a last, short one "
        "of 2 sample(s), too few for 3 processes (each needs one at least); set drop_last=True (that update is "
        "dropped), or run on fewer processes: 1, 2"
    )
    assert (
        "last, short update of 4 samples (40 samples, global_batch_size=6) cannot be shared evenly among 3"
        in (cases["sharded_uneven"][0]["error"])
        and "divides both 6 and 4 (1, 2)" in cases["sharded_uneven"][0]["error"]
    )
    # a checkpoint of batch_size (per process) on 2 processes, resumed on 1
    folder = str(runs["tmp"] / "per-process")
    found = refused(0, 1, folder, {"global_batch_size": None, "batch_size": 3})
    assert found["params_unchanged"] and found["files_after"] == [f for f in found["files_before"] if ".lock" not in f]
    assert "step-000000002 was saved by 2 process(es), this run has 1; resume with the same number" in found["error"]
    assert "global_batch_size=" in found["error"]
    # nor does a run of global_batch_size resume it (its sample sequence is per process)
    again = refused(0, 1, folder)
    assert again["params_unchanged"] and "was saved by 2 process(es)" in again["error"]

"""ct.run on two ranks of a gloo pool (their cases in tests/run_workers.py): the global batch's mean logged like
one process, a signal to one rank stopping all after the same update, uneven loaders, and a failure or a
mismatch on one rank (metric names, evaluation, an unwritable folder) failing every rank without a hang.
"""

import pytest
import torch
from run_script import untimed


def test_two_ranks_in_the_pool(pool):
    results = pool.run("run_workers", "two_ranks")
    a, b = results
    assert a["steps"] == b["steps"] == 3 * 4  # 96 samples, 12 per rank per update: 4 updates per epoch
    assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))
    assert a["epoch_firsts"][0] != b["epoch_firsts"][0]  # each rank its own share
    assert a["epoch_firsts"][0] != a["epoch_firsts"][1] != a["epoch_firsts"][2]  # reshuffled every epoch
    assert a["evals"] == b["evals"] and a["evals"][-1]["acc"] == pytest.approx(a["single_process_eval"], abs=1e-12)
    assert untimed(a["history"]) == untimed(b["history"])
    assert {r["global_batch"] for r in a["history"]} == {24}  # 12 per rank: the input of ct.scaled_lr
    with pytest.raises(RuntimeError, match=r"does not synchronise them; wrap it: ct.distributed"):
        pool.run("run_workers", "not_distributed")


def test_two_ranks_log_the_mean_over_the_global_batch_like_one_process(pool):
    """Every logged loss and metric is the mean over all ranks' samples of the window's updates,
    recomputed here in one process from the parameters and micro-batches each rank trained on
    (to float32 rounding: the log reads the values as float32)."""
    import torch.nn.functional as F

    a, b = pool.run("run_workers", "logged_means")
    model = a["model"]
    per_update = []
    for u in range(len(a["seen"]) // 2):  # accumulate(2): two forwards per update on each rank
        calls = [a["seen"][2 * u], a["seen"][2 * u + 1], b["seen"][2 * u], b["seen"][2 * u + 1]]
        params = calls[0][0]
        assert all(torch.equal(p, q) for ps, _ in calls for p, q in zip(ps, params, strict=True))
        x = torch.cat([batch[0] for _, batch in calls])
        y = torch.cat([batch[1] for _, batch in calls])
        assert len(y) == 24  # the global batch: 12 samples on each rank
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(params), model.parameters())
            logits = model(x)
        per_update.append((F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).double().mean().item()))
    assert len(per_update) == 8 == a["history"][-1]["step"]
    start = 0
    for record in a["history"]:
        window = per_update[start : record["step"]]
        start = record["step"]
        assert record["loss"] == pytest.approx(sum(w[0] for w in window) / len(window), rel=1e-6), record
        assert record["acc"] == pytest.approx(sum(w[1] for w in window) / len(window), rel=1e-6), record
    assert untimed(a["history"]) == untimed(b["history"])


def test_a_signal_to_one_rank_stops_every_rank_after_the_same_update(pool):
    a, b = pool.run("run_workers", "signal_one_rank")
    assert a == b and a["preempted"] and a["steps"] == 6 and a["saved"] == "step-000000006"


def test_ranks_with_loaders_of_different_lengths_run_the_same_updates(pool):
    assert pool.run("run_workers", "uneven_loaders") == [8, 8]  # 4 batches per epoch on the shorter rank


def test_an_unwritable_checkpoint_dir_fails_on_every_rank_without_hanging(pool):
    messages = pool.run("run_workers", "unwritable", timeout=60)
    assert all("checkpoint_dir" in m and "is not writable" in m for m in messages)


def test_every_rank_refuses_eval_metric_names_that_differ_between_ranks(pool):
    messages = pool.run("run_workers", "eval_names_differ", timeout=50)
    expected = (
        "ValueError: run: eval_step returned different metric names on different ranks (rank 0: ['acc']; "
        "rank 1: ['acc', 'extra']); return the same names on every rank"
    )
    assert messages == [expected, expected]


def test_an_evaluation_failing_on_one_rank_fails_every_rank(pool):
    messages = pool.run("run_workers", "eval_fails_on_one_rank", timeout=50)
    assert messages == [
        "RuntimeError: run: evaluation failed on rank 1: RuntimeError: the eval step broke",
        "RuntimeError: the eval step broke",
    ]


def test_every_rank_refuses_training_metric_names_that_differ_between_ranks(pool):
    messages = pool.run("run_workers", "train_names_differ", timeout=50)
    expected = (
        "ValueError: run: the step returned different metric names on different ranks (rank 0: ['acc']; "
        "rank 1: ['acc', 'extra']); return the same names on every rank"
    )
    assert messages == [expected, expected]


def test_every_rank_logs_the_window_a_stop_cut_short(pool):
    a, b = pool.run("run_workers", "stop_inside_a_window", timeout=50)
    assert [r["step"] for r in a] == [3] and untimed(a) == untimed(b)

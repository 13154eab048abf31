"""ct.run on two ranks of a gloo pool: the global batch's mean logged like
one process, a signal to one rank stopping all after the same update, uneven loaders, and a failure or a
mismatch on one rank (metric names, evaluation, an unwritable folder) failing every rank without a hang.
"""

import pytest
import run_script
import torch
from helpers import outcome
from run_script import accuracy, untimed

import composetrain as ct


def test_two_ranks_in_the_pool(pool):
    results = pool.run(__name__, "two_ranks")
    a, b = results
    assert a["steps"] == b["steps"] == 3 * 4  # 96 samples, 12 per rank per update: 4 updates per epoch
    assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))
    assert a["epoch_firsts"][0] != b["epoch_firsts"][0]  # each rank its own share
    assert a["epoch_firsts"][0] != a["epoch_firsts"][1] != a["epoch_firsts"][2]  # reshuffled every epoch
    assert a["evals"] == b["evals"] and a["evals"][-1]["acc"] == pytest.approx(a["single_process_eval"], abs=1e-12)
    assert untimed(a["history"]) == untimed(b["history"])
    assert {r["global_batch"] for r in a["history"]} == {24}  # 12 per rank: the input of ct.scaled_lr
    with pytest.raises(RuntimeError, match=r"does not synchronise them; wrap it: ct.distributed"):
        pool.run(__name__, "not_distributed")


def test_two_ranks_log_the_mean_over_the_global_batch_like_one_process(pool):
    """Every logged loss and metric is the mean over all ranks' samples of the window's updates,
    recomputed here in one process from the parameters and micro-batches each rank trained on
    (to float32 rounding: the log reads the values as float32)."""
    import torch.nn.functional as F

    a, b = pool.run(__name__, "logged_means")
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
    a, b = pool.run(__name__, "signal_one_rank")
    assert a == b and a["preempted"] and a["steps"] == 6 and a["saved"] == "step-000000006"


def test_ranks_with_loaders_of_different_lengths_run_the_same_updates(pool):
    assert pool.run(__name__, "uneven_loaders") == [8, 8]  # 4 batches per epoch on the shorter rank


def test_an_unwritable_checkpoint_dir_fails_on_every_rank_without_hanging(pool):
    messages = pool.run(__name__, "unwritable", timeout=60)
    assert all("checkpoint_dir" in m and "is not writable" in m for m in messages)


def test_every_rank_refuses_eval_metric_names_that_differ_between_ranks(pool):
    assert_names_refused_on_every_rank(pool, "eval_names_differ", "eval_step")


def assert_names_refused_on_every_rank(pool, case, returner):
    """Every rank raises that ``returner`` returned rank 1's extra metric name on rank 1 only."""
    messages = pool.run(__name__, case, timeout=50)
    expected = (
        f"ValueError: run: {returner} returned different metric names on different ranks (rank 0: ['acc']; "
        "rank 1: ['acc', 'extra']); return the same names on every rank"
    )
    assert messages == [expected, expected]


def test_an_evaluation_failing_on_one_rank_fails_every_rank(pool):
    messages = pool.run(__name__, "eval_fails_on_one_rank", timeout=50)
    assert messages == [
        "RuntimeError: run: evaluation failed on rank 1: RuntimeError: the eval step broke",
        "RuntimeError: the eval step broke",
    ]


def test_every_rank_refuses_training_metric_names_that_differ_between_ranks(pool):
    assert_names_refused_on_every_rank(pool, "train_names_differ", "the step")


def test_every_rank_logs_the_window_a_stop_cut_short(pool):
    a, b = pool.run(__name__, "stop_inside_a_window", timeout=50)
    assert [r["step"] for r in a] == [3] and untimed(a) == untimed(b)


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------


def two_ranks(rank, world):
    micro_batches = []

    def spy(model, batch):  # accumulate(2): two micro-batches per update, 4 updates per epoch
        micro_batches.append(batch[0][:, 0].tolist())
        return run_script.step(model, batch)

    state = run_script.state()
    evaluation = {"eval_step": accuracy, "eval_data": run_script.dataset(50)}
    train = ct.distributed(ct.accumulate(2)(spy))
    options = {**run_script.QUICK, "epochs": 3, **evaluation, "log_every": 4, "seed": 5}
    result = ct.run(train, state, run_script.dataset(), **options)
    x, y = run_script.dataset(50).tensors
    state.model.eval()
    with torch.no_grad():
        single = (state.model(x).argmax(-1) == y).double().mean().item()
    return {
        "steps": state.step,
        "params": [p.detach().clone() for p in state.model.parameters()],
        "epoch_firsts": [micro_batches[8 * e] for e in range(3)],
        "evals": result.evals,
        "history": result.history,
        "single_process_eval": single,
    }


def logged_means(rank, world):
    """ct.run's history on every rank, with what each forward saw: the parameters and its micro-batch
    (a model without dropout, so that one process can recompute every loss from them)."""
    from torch import nn

    seen = []

    def spy(model, batch):
        seen.append(([p.detach().clone() for p in model.parameters()], batch))
        return run_script.step(model, batch)

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    options = {**run_script.QUICK, "epochs": 2, "log_every": 3, "seed": 5}
    result = ct.run(ct.distributed(ct.accumulate(2)(spy)), state, run_script.dataset(), **options)
    return {"history": result.history, "seen": seen, "model": model}


def not_distributed(rank, world):
    ct.run(run_script.step, run_script.state(), run_script.dataset(), batch_size=12, num_workers=0, progress=False)


def signal_one_rank(rank, world):
    """Rank 1 alone gets SIGTERM during its 6th update: both ranks must stop after the same one."""
    import os
    import signal
    import tempfile

    calls = []

    def step(model, batch):
        calls.append(1)
        if rank == 1 and len(calls) == 6:
            os.kill(os.getpid(), signal.SIGTERM)
        return run_script.step(model, batch)

    state = run_script.state()
    with tempfile.TemporaryDirectory() as shared:
        directory = f"{tempfile.gettempdir()}/ct-signal-{os.getppid()}"
        result = ct.run(
            ct.distributed(step),
            state,
            run_script.dataset(),
            batch_size=12,
            epochs=3,
            num_workers=0,
            progress=False,
            checkpoint_dir=directory,
        )
    del shared
    return {"steps": state.step, "preempted": result.preempted, "saved": result.checkpoint.name}


def uneven_loaders(rank, world):
    """Ranks given DataLoaders of different lengths agree on the fewest batches per epoch."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    x, y = run_script.dataset().tensors
    mine = TensorDataset(x[: 48 + 24 * rank], y[: 48 + 24 * rank])  # rank 0: 48 samples, rank 1: 72
    loader = DataLoader(mine, batch_size=12, sampler=DistributedSampler(mine, num_replicas=1, rank=0, seed=1))
    state = run_script.state()
    ct.run(ct.distributed(run_script.step), state, loader, epochs=2, progress=False)
    return state.step


def unwritable(rank, world):
    import tempfile
    from pathlib import Path

    blocker = Path(tempfile.gettempdir()) / f"ct-blocker-{rank}"
    blocker.write_text("")  # each rank names its own file: checkpoint_dir is rank 0's anyway
    try:
        run_script.run_distributed(checkpoint_dir=Path(tempfile.gettempdir()) / "ct-blocker-0" / "runs")
    except PermissionError as e:
        return str(e)
    return "no error"


def _run_two(step, **options):
    options = {**run_script.QUICK, "epochs": 1, **options}
    return ct.run(ct.distributed(step), run_script.state(), run_script.dataset(), **options)


def eval_names_differ(rank, world):
    def unequal(model, batch):
        return {**accuracy(model, batch), **({"extra": 1.0} if rank == 1 else {})}

    return outcome(lambda: _run_two(run_script.step, eval_step=unequal, eval_data=run_script.dataset(50)))


def eval_fails_on_one_rank(rank, world):
    def fails(model, batch):
        if rank == 1:
            raise RuntimeError("the eval step broke")
        return accuracy(model, batch)

    return outcome(lambda: _run_two(run_script.step, eval_step=fails, eval_data=run_script.dataset(50)))


def train_names_differ(rank, world):
    def unequal(model, batch):
        loss, metrics = run_script.step(model, batch)
        return loss, {**metrics, **({"extra": 1.0} if rank == 1 else {})}

    return outcome(lambda: _run_two(unequal, log_every=2))


def stop_inside_a_window(rank, world):
    return _run_two(run_script.step, max_steps=3, log_every=50).history

"""Streams on two gloo ranks (the file's pool): ranks whose streams end at different updates stop together, a run
resumed three times trains on the uninterrupted run's batches on every rank, two ranks reading the same share are
refused before training, a stream raising on one rank fails every rank, and a checkpoint resumes on another number
of processes only where the dataset says its state is the whole job's."""

from __future__ import annotations

import time

import pytest
import run_script
import torch
import torch.nn.functional as F
from helpers import outcome
from stream_data import Counting, Failing, Global, GlobalRestarting, Unreachable, Unsplit

import composetrain as ct

SEEN: list[torch.Tensor] = []


def step(model, batch):
    x, y = batch
    SEEN.append(x.clone())
    return F.cross_entropy(model(x), y)


def run(data, folder=None, *, ranks=True, state=None, **options):
    """``ct.run`` of ``step`` (``distributed`` on the pool's ranks) from a fresh state: result, state, batches."""
    SEEN.clear()
    state = run_script.state() if state is None else state
    # a rank that waits for another past 30 s fails (a hang would fail the pool's call only after 120 s)
    options = {"batch_size": 3, "num_workers": 0, "progress": False, "log_every": 2, "timeout": 30, **options}
    result = ct.run(ct.distributed(step) if ranks else step, state, data, checkpoint_dir=folder, **options)
    return result, state, list(SEEN)


def params(state):
    return [p.detach().clone() for p in state.model.parameters()]


def test_ranks_whose_streams_end_at_different_updates_stop_together(pool):
    (a, b), (c, d) = pool.run(__name__, "uneven", None), pool.run(__name__, "uneven", 10)
    assert a["steps"] == b["steps"] == 4 and a["epochs"] == b["epochs"] == 2  # 2 updates a pass: rank 0's share
    assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))
    assert not a["exhausted"] and not b["exhausted"]
    assert c["steps"] == d["steps"] == 2 and c["exhausted"] and d["exhausted"]  # one pass, before max_steps=10


def test_a_stream_resumed_three_times_on_two_ranks_trains_on_the_uninterrupted_batches(pool, tmp_path):
    straight = pool.run(__name__, "chain", str(tmp_path / "straight"), [])
    chained = pool.run(__name__, "chain", str(tmp_path / "chain"), [4, 7, 10])
    for s, c in zip(straight, chained, strict=True):
        assert len(s["seen"]) == len(c["seen"]) == 14 and all(
            torch.equal(x, y) for x, y in zip(s["seen"], c["seen"], strict=True)
        )
        assert all(torch.equal(p, q) for p, q in zip(s["params"], c["params"], strict=True))
    assert not torch.equal(straight[0]["seen"][0], straight[1]["seen"][0])  # each rank its own share


def test_two_ranks_reading_the_same_share_are_refused_before_training(pool):
    for said, steps in pool.run(__name__, "unsplit"):
        assert said.startswith("ValueError: run: ranks 0, 1 read the same first batch: the stream is not split")
        assert "set_rank(rank, world_size)" in said and steps == 0


def test_a_stream_raising_on_one_rank_fails_every_rank_and_keeps_the_last_checkpoint(pool, tmp_path):
    zero, one = pool.run(__name__, "failing", str(tmp_path))
    assert one == "OSError: shard lost at item 9"  # rank 1's own error, as it came
    assert zero.startswith("RuntimeError: run: the stream raised on rank 1 while reading the batch of update 2")
    assert "(OSError: shard lost at item 9)" in zero
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000001"]


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("iter", "the stream raised on rank 1 while reading the batch of update 1 of its pass"),
        ("set_epoch", "the stream raised on rank 1 while reading the batch of update 1 of its pass"),
        ("set_rank", "setting up the stream failed on rank 1: OSError: bucket unreachable in set_rank; every rank"),
    ],
)
def test_a_stream_failing_in_iter_set_epoch_or_set_rank_on_one_rank_fails_every_rank_at_once(pool, where, said):
    """Not only its items: the other rank was left at the next collective until the timeout (or told that a rank
    died, to be restarted by the launcher)."""
    zero, one = pool.run(__name__, "unreachable", where)
    assert one[0] == f"OSError: bucket unreachable in {where}"
    assert zero[0].startswith(f"RuntimeError: run: {said}") and f"bucket unreachable in {where}" in zero[0]
    assert zero[1] < 15 and zero[2] == one[2] == (2 if where == "set_epoch" else 0)  # at once; a pass trained


def test_a_stream_resumes_on_another_number_of_processes_only_where_its_state_is_the_jobs(pool, tmp_path):
    pool.run(__name__, "saved_on_two", str(tmp_path / "ranks"), "Counting")
    with pytest.raises(ValueError, match=r"saved by 2 process\(es\), this run has 1; a stream's state is each rank"):
        run(Counting(length=None), tmp_path / "ranks", ranks=False, max_steps=5, batch_size=2)
    pool.run(__name__, "saved_on_two", str(tmp_path / "global"), "Global")
    result, _, seen = run(Global(length=None), tmp_path / "global", ranks=False, max_steps=5, batch_size=2)
    # 3 updates of 2 items on each of 2 ranks read items 0..11; one process goes on with 12, 13, then 14, 15
    items = Global(length=None)
    expected = [torch.stack([items.item(i)[0] for i in (k, k + 1)]) for k in (12, 14)]
    assert result.steps == 5 and all(torch.equal(x, y) for x, y in zip(seen, expected, strict=True))
    assert len(result.history) >= 1 and result.history[-1]["step"] == 5


def test_a_global_stream_saved_after_its_last_short_batch_resumes_on_another_number_of_processes_at_the_pass_end(
    pool, tmp_path
):
    """The job's record said the stream had not ended: one process resumed the pass, and a stream that starts over by
    itself read the whole pass again inside it (13 updates instead of 8)."""
    pool.run(__name__, "ended_on_two", str(tmp_path))  # 10 items: updates of 4, 4, then 2 (short on both ranks)
    result, _, seen = run(GlobalRestarting(length=10), tmp_path, ranks=False, epochs=2, batch_size=2)
    items = GlobalRestarting(length=10)
    items.set_epoch(1)
    expected = [torch.stack([items.item(i)[0] for i in (k, k + 1)]) for k in range(0, 10, 2)]  # pass 2 alone
    assert result.steps == 8 and result.epochs == 2 and len(seen) == 5
    assert all(torch.equal(x, y) for x, y in zip(seen, expected, strict=True))


# -- the ranks' side -------------------------------------------------------------------------------------------


def uneven(rank, world, max_steps):
    data = Counting(length=12 if rank == 0 else 40)  # rank 0: 6 items, 2 batches a pass; rank 1: 20, 7 batches
    result, state, _ = run(data, epochs=2 if max_steps is None else None, max_steps=max_steps)
    return {"steps": result.steps, "epochs": result.epochs, "params": params(state), "exhausted": result.exhausted}


def chain(rank, world, folder, stops):
    """Counting(40) in 2 passes, each rank 20 items a pass: 7 batches of 3 (the last of 2); stopped at ``stops``."""
    seen = []
    for stop in stops:
        seen += run(Counting(length=40), folder, epochs=2, max_steps=stop, checkpoint_every=3)[2]
    result, state, last = run(Counting(length=40), folder, epochs=2, checkpoint_every=3)
    return {"seen": seen + last, "params": params(state), "steps": result.steps}


def unsplit(rank, world):
    state = run_script.state()
    said = outcome(lambda: ct.run(ct.distributed(step), state, Unsplit(length=20), batch_size=3, progress=False))
    return said, state.step


def failing(rank, world, folder):
    data = Failing(length=40, at=9) if rank == 1 else Counting(length=40)  # item 9 is rank 1's 5th: update 2
    return outcome(lambda: run(data, folder, checkpoint_every=1))


def unreachable(rank, world, where):
    state, started = run_script.state(), time.monotonic()
    data = Unreachable(length=12, where=where)  # 6 items a rank: 2 updates a pass
    said = outcome(lambda: run(data, epochs=2, state=state))
    return said, time.monotonic() - started, state.step


def saved_on_two(rank, world, folder, kind):
    data = {"Counting": Counting, "Global": Global}[kind](length=None)
    return run(data, folder, max_steps=3, batch_size=2)[0].steps


def ended_on_two(rank, world, folder):
    return run(GlobalRestarting(length=10), folder, max_steps=3, epochs=2, batch_size=2)[0].steps

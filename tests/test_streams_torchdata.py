"""Streams read through torchdata's StatefulDataLoader (the optional extra ``composetrain[streams]``): one given
by the user, or the one ct.run builds for ``num_workers > 0``; its state (its workers' streams' states inside) is
checkpointed per rank and resumed several times, across a pass's end, to the uninterrupted run's batches."""

from __future__ import annotations

import pytest
import run_script
import torch
from stream_data import Counting, EpochSeeded, Stateless, WorkerRandom
from test_streams import params, run, same, step

import composetrain as ct

pytest.importorskip("torchdata")
from torchdata.stateful_dataloader import StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 under newer torch


def loader(workers, data=None):
    return StatefulDataLoader(data if data is not None else Counting(length=30), batch_size=4, num_workers=workers)


def resumed(make, folder, stops, **options):
    """The run interrupted at each of ``stops`` (each part a new process's: a fresh stream and state) and finished:
    its last result and state, and every batch it trained on."""
    seen = []
    for stop in stops:
        part, _, part_seen = run(make(), folder, **{**options, "max_steps": stop})
        assert part.steps == stop
        seen += part_seen
    last, state, last_seen = run(make(), folder, **options)
    return last, state, seen + last_seen


@pytest.mark.parametrize("workers", [0, 2])
def test_a_given_stateful_dataloader_resumes_three_times_across_a_pass_end(tmp_path, workers):
    options = {"batch_size": None, "num_workers": workers, "epochs": 2, "checkpoint_every": 3}
    straight, straight_state, straight_seen = run(loader(workers), tmp_path / "straight", **options)
    assert straight.steps == 16 and straight.epochs == 2  # 8 updates a pass: 7 of 4, one of 2
    last, state, seen = resumed(lambda: loader(workers), tmp_path / "chain", [3, 8, 11], **options)
    assert same(seen, straight_seen) and last.steps == 16 and last.epochs == 2
    assert all(torch.equal(p, q) for p, q in zip(params(state), params(straight_state), strict=True))


def test_workers_read_a_stream_through_a_stateful_dataloader_ct_run_builds(tmp_path):
    options = {"num_workers": 2, "max_steps": 12, "epochs": 2}
    straight, straight_state, straight_seen = run(Counting(length=30), tmp_path / "straight", **options)
    assert straight.steps == 12 and straight.epochs == 1
    assert sorted(len(x) for x in straight_seen[:8]) == [3] * 2 + [4] * 6  # each worker's share ends short
    last, state, seen = resumed(lambda: Counting(length=30), tmp_path / "chain", [5, 9], **options)
    assert same(seen, straight_seen) and last.steps == 12
    assert all(torch.equal(p, q) for p, q in zip(params(state), params(straight_state), strict=True))
    saved = torch.load(tmp_path / "chain" / "step-000000012" / "rank-0.pt", weights_only=True)
    assert set(saved["stream"]["state"]["_snapshot"]["_worker_snapshots"]) == {"worker_0", "worker_1"}


def test_a_stateful_dataloader_over_a_stream_without_state_is_refused_with_checkpoints(tmp_path):
    with pytest.raises(TypeError, match=r"the StatefulDataLoader's dataset Stateless has no state_dict\(\)") as e:
        run(loader(0, Stateless()), tmp_path, batch_size=None)
    assert "stream_resume='replay'" in str(e.value)
    result, _, _ = run(loader(0, Stateless()), tmp_path, batch_size=None, stream_resume="replay", max_steps=3)
    assert result.steps == 3


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2), (2, 1)])
def test_a_stream_resumed_with_another_number_of_workers_is_refused_before_anything_changes(tmp_path, before, after):
    """Each worker keeps its own share's state: the dataset's load_state_dict was handed the loader's (a KeyError
    blamed on the stream), and a loader of other workers raised torchdata's AssertionError after the model was
    loaded."""
    run(Counting(length=30), tmp_path, num_workers=before, max_steps=3)
    state, data = run_script.state(), Counting(length=30)
    fresh = params(state)
    with pytest.raises(ValueError, match=rf"read by {before} loader worker\(s\) .* this run reads it with {after}: "):
        ct.run(step, state, data, batch_size=4, num_workers=after, checkpoint_dir=tmp_path, progress=False)
    assert all(torch.equal(p, q) for p, q in zip(params(state), fresh, strict=True)) and data.next == 0
    assert run(Counting(length=30), tmp_path, num_workers=before, max_steps=5)[0].steps == 5  # as it was saved


def test_a_stateful_dataloader_out_of_order_is_refused_with_checkpoints(tmp_path):
    """in_order=False: batches in the order the workers finish them, whose state torchdata does not promise to resume
    (a resumed run trained on other batches than the uninterrupted one)."""
    unordered = StatefulDataLoader(Counting(length=30), batch_size=4, num_workers=2, in_order=False)
    with pytest.raises(TypeError, match=r"checkpoint_dir is given, but the StatefulDataLoader given has in_order=Fa"):
        run(unordered, tmp_path, batch_size=None, num_workers=2)
    assert not list(tmp_path.iterdir())
    assert run(unordered, batch_size=None, num_workers=2)[0].steps == 8  # nothing to resume: read as given


@pytest.mark.parametrize("given", [False, True])
def test_loader_workers_start_after_set_epoch_also_when_checkpoints_are_saved(tmp_path, given):
    """The check of the stream's state before the first update asked the loader for its state_dict(), which started
    its workers there, with copies of the stream made before set_epoch(0): the first pass read them unset."""

    def data():
        made = EpochSeeded(length=16)
        return StatefulDataLoader(made, batch_size=4, num_workers=2) if given else made

    options = {"num_workers": 2, "epochs": 2, **({"batch_size": None} if given else {})}
    unsaved, _, expected = run(data(), None, **options)
    result, _, seen = run(data(), tmp_path, **options)
    assert result.steps == unsaved.steps == 8 and same(seen, expected)
    assert [round(float(x[0, 0]), -3) for x in seen] == [1000.0] * 4 + [2000.0] * 4  # each pass its own


def test_a_pass_read_by_workers_ct_run_builds_draws_alike_in_a_resumed_run(tmp_path):
    """Their base seed is drawn per pass from (seed, rank, epoch): a generator seeded once drew the first pass's for
    the first pass a resumed process read, and every later pass of the run differed. Inside the pass a resume lands
    in, what the workers' own generators draw still differs (torchdata restores the stream's state, not theirs):
    randomness that must resume exactly comes from a generator the stream keeps in its state_dict()."""
    options = {"num_workers": 2, "epochs": 3, "checkpoint_every": 2}
    _, _, straight_seen = run(WorkerRandom(length=16), tmp_path / "straight", **options)
    _, _, clean = run(Counting(length=16), None, num_workers=2, epochs=3)  # the items without their noise
    noise = [x - c for x, c in zip(straight_seen, clean, strict=True)]
    assert not any(torch.allclose(noise[k], noise[k + 4]) for k in range(8))  # each pass draws its own
    run(WorkerRandom(length=16), tmp_path / "chain", **options, max_steps=6)  # 2 updates into pass 2 of 4
    last, _, seen = run(WorkerRandom(length=16), tmp_path / "chain", **options)
    assert last.steps == 12 and same(seen[2:], straight_seen[8:])  # pass 3 as the uninterrupted run read it

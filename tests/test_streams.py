"""ct.run over a stream (an IterableDataset keeping its place by torchdata's Stateful protocol), in one process:
batched per process, read in passes, its state checkpointed with the run, and resumed any number of times to the
same batches and the same model, bit for bit; what it refuses, before anything trains."""

from __future__ import annotations

import sys
from collections import OrderedDict

import pytest
import run_script
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from run_script import untimed
from stream_data import BadLoad, Counting, Drawing, Failing, NumpyState, Restarting, Stateless
from torch.utils.data import DataLoader, IterableDataset, default_collate

import composetrain as ct

SEEN: list[torch.Tensor] = []  # the inputs of every forward, in order


def step(model, batch):
    x, y = batch
    SEEN.append(x.clone())
    return F.cross_entropy(model(x), y)


def run(data, tmp=None, **options):
    """ct.run of ``step`` from a fresh state (a model with dropout: the random states resume too): the result, the
    state and the batches it trained on."""
    SEEN.clear()
    state = run_script.state()
    options = {"batch_size": 4, "num_workers": 0, "progress": False, "log_every": 3, **options}
    result = ct.run(step, state, data, checkpoint_dir=tmp, **options)
    return result, state, list(SEEN)


def records(resumed, straight):
    """Whether a resumed run's records are the straight run's; but a pass's end found first thing after a resume
    logs updates an earlier process made, whose rate this one does not know: null, as a finished run run again."""
    if len(resumed) != len(straight):
        return False
    pairs = zip(resumed, straight, strict=True)
    return all(untimed([r if r["lr"] is not None else {**r, "lr": s["lr"]}]) == untimed([s]) for r, s in pairs)


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def params(state):
    return [p.detach().clone() for p in state.model.parameters()]


def test_a_stream_is_batched_per_process_and_trains_as_its_items_in_a_list():
    items = list(Counting(length=30))
    result, state, seen = run(Counting(length=30))
    assert same(seen, [default_collate(items[i : i + 4])[0] for i in range(0, 30, 4)])  # 7 of 4, the last of 2
    assert result.steps == 8 and result.epochs == 1 and not result.exhausted
    assert result.history[-1]["global_batch"] == 4
    listed, listed_state, listed_seen = run(items, shuffle=False)  # the same items, map-style, in order
    assert same(seen, listed_seen) and untimed(result.history) == untimed(listed.history)
    assert all(torch.equal(p, q) for p, q in zip(params(state), params(listed_state), strict=True))


def test_each_pass_is_an_epoch_begun_with_set_epoch_and_ended_saved(tmp_path):
    data = Counting(length=10)  # 3 updates a pass: 4, 4 and 2 items
    result, _, seen = run(data, tmp_path, epochs=3, log_every=50, keep_checkpoints=3)
    assert data.epochs_set == [0, 1, 2] and result.steps == 9 and result.epochs == 3
    assert [r["epoch"] for r in result.history] == [1, 2, 3] and [r["step"] for r in result.history] == [3, 6, 9]
    assert not same(seen[:3], seen[3:6])  # each pass its own items: set_epoch reached the dataset
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [f"step-00000000{n}" for n in (3, 6, 9)]
    saved = torch.load(tmp_path / "step-000000009" / "state.pt", weights_only=True)
    assert (saved["epoch"], saved["position"]) == (3, 0)  # the run's end: its last pass over, saved


def test_a_stream_that_starts_over_at_its_end_resumes_after_its_short_last_batch(tmp_path):
    """Its state after the short batch is already the next pass's start: ct.run records that it saw the end, and the
    resumed run ends the pass instead of reading it again."""
    straight, _, straight_seen = run(Restarting(length=10), tmp_path / "straight", epochs=2)
    run(Restarting(length=10), tmp_path / "chain", epochs=2, max_steps=3)  # stopped after the short batch
    last, _, seen = run(Restarting(length=10), tmp_path / "chain", epochs=2)
    assert same(seen, straight_seen[3:]) and last.steps == straight.steps == 6 and last.epochs == 2


def test_max_steps_ends_an_endless_stream_and_a_stream_that_ends_first_says_so():
    result, _, seen = run(Counting(length=None), max_steps=7)
    assert result.steps == 7 and len(seen) == 7 and not result.exhausted
    with pytest.warns(UserWarning, match=r"the stream ended after 8 updates in 1 pass\(es\), before max_steps=20"):
        result, _, _ = run(Counting(length=30), max_steps=20)
    assert result.steps == 8 and result.exhausted


def test_drop_last_drops_the_passes_short_batch():
    result, _, seen = run(Counting(length=30), drop_last=True)
    assert result.steps == 7 and all(len(x) == 4 for x in seen)


@st.composite
def chains(draw):
    """A stream run and the points where it is interrupted: (stream, options, stops)."""
    kind = draw(st.sampled_from([Counting, Restarting, Drawing]))
    length = draw(st.one_of(st.none(), st.integers(1, 24)))
    batch_size = draw(st.integers(1, 5))
    options = {
        "batch_size": batch_size,
        "log_every": draw(st.integers(1, 4)),
        "checkpoint_every": draw(st.one_of(st.none(), st.integers(1, 4))),
        "drop_last": draw(st.booleans()) and (length is None or length >= batch_size),
    }
    if length is None:
        options["max_steps"] = draw(st.integers(2, 12))
        total = options["max_steps"]
    else:
        options["epochs"] = draw(st.integers(1, 3))
        per_pass = length // batch_size if options["drop_last"] else -(-length // batch_size)
        total = options["epochs"] * per_pass
        if draw(st.booleans()) and total > 2:
            options["max_steps"] = total - 1
            total -= 1
    stops = draw(st.lists(st.integers(1, max(1, total - 1)), max_size=4, unique=True)) if total > 1 else []
    return kind, length, options, sorted(stops)


@settings(max_examples=12, deadline=None)
@given(chain=chains())
def test_k_resumes_at_random_points_train_on_the_uninterrupted_runs_batches_bit_for_bit(tmp_path_factory, chain):
    """Pitfall 42: streams that break on the second resume. Each stop is a new process's run (a fresh stream and
    state), stopped at ``max_steps`` (saved there); the last one finishes the run."""
    kind, length, options, stops = chain
    straight, straight_state, straight_seen = run(kind(length=length), tmp_path_factory.mktemp("straight"), **options)
    folder = tmp_path_factory.mktemp("chain")
    seen = []
    for stop in stops:
        part, _, part_seen = run(kind(length=length), folder, **{**options, "max_steps": stop})
        seen += part_seen
        assert part.steps == stop
    last, state, last_seen = run(kind(length=length), folder, **options)
    seen += last_seen
    assert same(seen, straight_seen)
    assert all(torch.equal(p, q) for p, q in zip(params(state), params(straight_state), strict=True))
    assert last.steps == straight.steps and last.epochs == straight.epochs
    assert records(last.history, straight.history) and last.exhausted == straight.exhausted


def test_checkpoints_hold_each_ranks_stream_state_and_load_with_weights_only(tmp_path):
    data = Drawing(length=None)
    run(data, tmp_path, max_steps=5)
    folder = tmp_path / "step-000000005"
    local = torch.load(folder / "rank-0.pt", weights_only=True)
    shared = torch.load(folder / "state.pt", weights_only=True)
    assert local["stream"]["ended"] is False and local["stream"]["state"]["next"] == 20
    assert torch.equal(local["stream"]["state"]["g"], data.g.get_state())
    assert shared["stream"] is None and shared["settings"]["stream"] == "state"
    assert shared["settings"]["updates_per_epoch"] is None and shared["position"] == 5


def test_a_stream_without_state_is_refused_with_checkpoints_and_resumed_by_replay_when_asked(tmp_path):
    with pytest.raises(
        TypeError, match=r"run: checkpoint_dir is given, but the stream Stateless has no state_dict"
    ) as e:
        run(Stateless(), tmp_path)
    message = str(e.value)
    assert "load_state_dict(state) (the next iter() continues from there)" in message
    assert "stream_resume='replay'" in message and not list(tmp_path.iterdir())
    run(Stateless())  # no checkpoint_dir: nothing to resume, nothing refused
    straight, straight_state, straight_seen = run(Stateless(), tmp_path / "straight", epochs=2, stream_resume="replay")
    run(Stateless(), tmp_path / "replayed", epochs=2, max_steps=3, stream_resume="replay")
    with pytest.warns(UserWarning, match=r"by replay \(stream_resume='replay'\): reading pass 1 again from its start"):
        run(Stateless(), tmp_path / "replayed", epochs=2, max_steps=11, stream_resume="replay")
    with pytest.warns(UserWarning, match=r"reading pass 2 again from its start and dropping its first 3 batches"):
        last, state, seen = run(Stateless(), tmp_path / "replayed", epochs=2, stream_resume="replay")
    assert same(seen, straight_seen[11:]) and last.steps == straight.steps == 16
    assert all(torch.equal(p, q) for p, q in zip(params(state), params(straight_state), strict=True))


def test_a_replay_of_a_stream_that_gives_other_batches_is_refused(tmp_path):
    run(Stateless(length=30), tmp_path, max_steps=6, stream_resume="replay")
    says = r"cannot replay the stream Stateless: rank 0's stream gave 2 batches of the 6"
    with pytest.raises(ValueError, match=says), pytest.warns(UserWarning, match="by replay"):
        run(Stateless(length=8), tmp_path, stream_resume="replay")


def test_a_given_dataloader_without_state_is_refused_with_checkpoints_naming_the_stateful_one(tmp_path):
    loader = DataLoader(Counting(), batch_size=4)
    with pytest.raises(TypeError, match=r"the DataLoader given has no state_dict\(\).*StatefulDataLoader") as e:
        run(loader, tmp_path, batch_size=None)
    assert "or the dataset itself (ct.run batches it)" in str(e.value)
    result, _, seen = run(loader, batch_size=None)  # without checkpoints it is read as given
    assert result.steps == 8 and len(seen[0]) == 4


def test_a_state_dict_no_checkpoint_could_hold_is_refused_before_training(tmp_path):
    state = run_script.state()
    before = params(state)
    with pytest.raises(
        TypeError, match=r"cannot save the stream NumpyState's state to checkpoint it: the stream's"
    ) as e:
        ct.run(step, state, NumpyState(), batch_size=4, num_workers=0, progress=False, checkpoint_dir=tmp_path)
    message = str(e.value)
    assert "state_dict()['seen'] is array([0, 1, 2]) (ndarray)" in message and "weights_only=True" in message
    assert "a NumPy array as a tensor or a list" in message
    assert state.step == 0 and all(torch.equal(p, q) for p, q in zip(params(state), before, strict=True))
    assert not list(tmp_path.glob("step-*"))
    run(NumpyState())  # nothing to checkpoint: accepted


class Ordered(Counting):
    def state_dict(self):
        return OrderedDict(super().state_dict())


def test_a_state_dict_returned_as_an_ordered_dict_is_saved_and_resumed(tmp_path):
    """It loads with weights_only=True as it was (inside a state it always was accepted): 'not a dict' refused it."""
    straight, _, straight_seen = run(Ordered(), tmp_path / "straight", epochs=2)
    run(Ordered(), tmp_path / "chain", epochs=2, max_steps=5)
    saved = torch.load(tmp_path / "chain" / "step-000000005" / "rank-0.pt", weights_only=True)["stream"]["state"]
    assert type(saved) is OrderedDict and saved == {"next": 20, "epoch": 0}
    last, _, seen = run(Ordered(), tmp_path / "chain", epochs=2)
    assert same(seen, straight_seen[5:]) and last.steps == straight.steps == 16


def test_a_load_state_dict_that_raises_is_named_and_changes_nothing(tmp_path):
    run(Counting(), tmp_path, max_steps=3)
    state = run_script.state()
    before = params(state)
    with pytest.raises(
        ValueError, match=r"cannot resume the stream BadLoad from checkpoint .*step-000000003: its "
    ) as e:
        ct.run(step, state, BadLoad(), batch_size=4, num_workers=0, progress=False, checkpoint_dir=tmp_path)
    assert "load_state_dict() raised KeyError: 'offset'" in str(e.value)
    assert state.step == 0 and all(torch.equal(p, q) for p, q in zip(params(state), before, strict=True))


def test_a_stream_that_raises_mid_pass_raises_its_error_and_leaves_the_last_checkpoint(tmp_path):
    straight, straight_state, straight_seen = run(Counting(), tmp_path / "straight", checkpoint_every=2)
    with pytest.raises(OSError, match="shard lost at item 13"):
        run(Failing(at=13), tmp_path / "failed", checkpoint_every=2)  # item 13 is in update 4's batch
    saved = sorted(p.name for p in (tmp_path / "failed").glob("step-*"))
    assert saved == ["step-000000002"]  # updates 3 trained, then the read failed: the checkpoint of 2 is intact
    last, state, seen = run(Counting(), tmp_path / "failed", checkpoint_every=2)  # the shard back: resumed
    assert same(seen, straight_seen[2:]) and last.steps == straight.steps
    assert all(torch.equal(p, q) for p, q in zip(params(state), params(straight_state), strict=True))


class Empty(IterableDataset):
    def __iter__(self):
        return iter([])


def test_a_stream_that_gives_nothing_is_refused_before_training():
    with pytest.raises(ValueError, match=r"run: the stream Empty gave no batch: there is nothing to train on"):
        run(Empty())
    with pytest.raises(ValueError, match=r"the stream Counting gave no batch.*batch_size=4, drop_last=True"):
        run(Counting(length=3), drop_last=True)


class Once(IterableDataset):
    """A stream read once: a second iter() gives nothing."""

    def __init__(self):
        self.items = iter(list(Counting(length=8)))

    def __iter__(self):
        return self.items


def test_persistent_workers_that_would_never_see_set_epoch_are_refused_for_several_passes():
    """Their copies of the stream stay where the first pass left them: the second pass gave nothing, and the warning
    said the stream does not start over (it does, in set_epoch)."""
    loader = DataLoader(Counting(length=16), batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.raises(ValueError, match=r"epochs=2 over a DataLoader with persistent_workers=True: its workers ke"):
        run(loader, batch_size=None, num_workers=2, epochs=2)
    result, _, _ = run(loader, batch_size=None, num_workers=2, epochs=1)  # one pass: set_epoch(0) reaches them
    assert result.steps == 4 and not result.exhausted
    fresh = DataLoader(Counting(length=16), batch_size=4, num_workers=2)  # workers started again each pass
    result, _, seen = run(fresh, batch_size=None, num_workers=2, epochs=2)
    assert result.steps == 8 and not result.exhausted and same(seen[4:], seen[:4]) is False


def test_a_stream_that_does_not_start_over_ends_the_run_saying_so():
    with pytest.warns(UserWarning, match=r"before epochs=3; its pass 2 gave no batch: it does not start over"):
        result, _, _ = run(Once(), epochs=3)
    assert result.steps == 2 and result.epochs == 1 and result.exhausted


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"global_batch_size": 8, "batch_size": None}, ValueError, r"global_batch_size=8 but data is a stream"),
        ({"shuffle": True}, ValueError, r"shuffle=True but data is a stream \(Counting\), which orders its items"),
        ({"batch_size": None}, ValueError, r"batch_size is required when data is a stream \(Counting\)"),
        ({"stream_resume": "skip"}, ValueError, r"stream_resume must be one of 'state', 'replay' .*got 'skip'"),
        ({"stream_resume": "replay"}, ValueError, r"stream_resume='replay' but no checkpoint_dir: a run that saves"),
    ],
)
def test_what_a_stream_cannot_take_is_refused_with_the_fix(options, error, says):
    with pytest.raises(error, match=says):
        run(Counting(), **options)


def test_stream_resume_is_refused_for_a_map_style_dataset():
    with pytest.raises(ValueError, match=r"stream_resume='replay' but data is .* not a stream .*leave stream_resume"):
        run(run_script.dataset(), stream_resume="replay")


def test_workers_without_torchdata_are_refused_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    with pytest.raises(ImportError, match=r"num_workers=2 for a stream needs torchdata's StatefulDataLoader.*pip"):
        run(Counting(), num_workers=2)


def test_auto_reads_a_stream_in_this_process_and_says_why():
    result, _, _ = run(Counting(), num_workers="auto")
    assert 'num_workers="auto" chose 0 for a stream' in result.bottleneck


def test_a_checkpoint_of_a_stream_and_one_of_a_dataset_do_not_resume_each_other(tmp_path):
    run(Counting(), tmp_path / "a", max_steps=2)
    with pytest.raises(ValueError, match=r"continues a run with other data settings .*updates_per_epoch was None"):
        run(run_script.dataset(), tmp_path / "a")
    run(run_script.dataset(), tmp_path / "b", max_steps=2)
    with pytest.raises(ValueError, match=r"continues a run with other data settings .*stream was None, now 'state'"):
        run(Counting(), tmp_path / "b")

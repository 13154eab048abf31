"""checkpoint/format.py is the one definition of what a checkpoint's files hold: the parts the driver builds
pass its reader's schemas, and the reader refuses what ct.run never writes (a bool where an int belongs, an
unknown world size, a step other than its folder's)."""

import dataclasses

import pytest
import torch

from composetrain.checkpoint.format import (
    FORMAT,
    LOCAL,
    ORDER,
    SHARED,
    Local,
    Order,
    Shared,
    UnloggedStep,
    check_fits,
    local_problem,
    same_ranks,
    shape_problem,
    shared_problem,
    stamp_local,
    stamp_shared,
    window_problem,
)
from composetrain.core.rng import capture_rng
from composetrain.core.state import KEYS, TrainState


def fresh_state():
    model = torch.nn.Linear(2, 1)
    return TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))


def parts():
    state = fresh_state()
    shared = Shared(state.state_dict(), {"updates_per_epoch": 4}, 1, 3, [{"step": 0}], [])
    window = [UnloggedStep(torch.tensor(1.0), {"acc": torch.tensor(0.5)}, False).to_file()]
    order = Order(capture_rng(), [], None).to_file()
    return stamp_shared(shared.to_file(), 2), stamp_local(Local(window, order, []).to_file())


def test_the_schemas_are_the_typed_parts_keys():
    assert set(SHARED) == {"format", "world_size", "data_shards"} | {f.name for f in dataclasses.fields(Shared)}
    assert set(LOCAL) == {"rng"} | {f.name for f in dataclasses.fields(Local)}
    assert set(ORDER) == {f.name for f in dataclasses.fields(Order)}
    assert set(fresh_state().state_dict()) >= KEYS


def test_what_the_driver_builds_passes_the_reader():
    shared, local = parts()
    assert shared["format"] == FORMAT and shared["world_size"] == 2 and shared["data_shards"] == [0, 1]
    assert shape_problem(shared, SHARED) is None and shared_problem(shared, step=0) is None
    assert shape_problem(local, LOCAL) is None and local_problem(local) is None


@pytest.mark.parametrize("key", ["epoch", "position", "world_size", "format"])
def test_a_bool_where_an_int_belongs_is_refused(key):
    shared, _ = parts()
    assert shape_problem({**shared, key: True}, SHARED) == f"its {key!r} is a bool"


def test_a_step_other_than_the_folders_and_a_missing_state_key_are_refused():
    shared, _ = parts()
    assert "not the step of its folder (7)" in shared_problem(shared, step=7)
    for key in ("model", "optimizer", "scheduler", "step", "transforms"):  # what TrainState.state_dict writes
        assert key in KEYS
        state = {k: v for k, v in shared["state"].items() if k != key}
        assert shared_problem({**shared, "state": state}) == f"its TrainState lacks {[key]}"
    assert shared_problem({**shared, "position": 4}) is not None  # position == updates_per_epoch: past the end
    assert shared_problem({**shared, "position": 3}) is None


def test_a_checkpoint_of_another_world_size_or_format_does_not_fit(tmp_path):
    shared, _ = parts()
    check_fits(shared, 2, tmp_path)
    with pytest.raises(ValueError, match="saved by 2 process"):
        check_fits(shared, 3, tmp_path)
    with pytest.raises(ValueError, match="in format 1"):
        check_fits({**shared, "format": 1}, 2, tmp_path)


def test_a_rank_file_continues_only_on_processes_reading_the_same_data_shards(tmp_path):
    """A mesh maps ranks to data shards by its layout (TP 2 x FSDP 2: [0, 0, 1, 1], PP 2 x DP 2: [0, 1, 0, 1]): a
    rank's own file (its random states) applies only where the same rank reads the same shard; a batch_size run
    (per-process state) refuses another layout, naming both, and a global batch run continues without them."""
    shared, _ = parts()
    tp = stamp_shared({**shared, "world_size": 4}, 4, [0, 0, 1, 1])
    assert same_ranks(tp, 4, [0, 0, 1, 1]) and not same_ranks(tp, 4, [0, 1, 0, 1]) and not same_ranks(tp, 4)
    assert not same_ranks(tp, 2, [0, 0]) and same_ranks(stamp_shared(shared, 2), 2, [0, 1])
    assert same_ranks({**shared, "data_shards": []}, 2)  # written before the stamp: rank r read shard r
    check_fits(tp, 4, tmp_path, [0, 0, 1, 1])
    with pytest.raises(ValueError, match=r"reading data shards \[0, 0, 1, 1\] .* this run's read \[0, 1, 0, 1\]"):
        check_fits(tp, 4, tmp_path, [0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"this run's read \[0, 1, 2, 3\]; resume with the same layout"):
        check_fits(tp, 4, tmp_path)
    global_batch = {**tp, "settings": {**tp["settings"], "global_batch_size": 8}}
    check_fits(global_batch, 4, tmp_path, [0, 1, 0, 1])
    check_fits(global_batch, 2, tmp_path)
    assert shared_problem(tp) is None
    for bad in ([0, 0, 1], [0, 0, 1, -1], [0, 0, 1, True]):
        assert "are not a data shard for each of its 4 process(es)" in shared_problem({**tp, "data_shards": bad})


def test_an_unlogged_step_of_another_shape_is_refused():
    _, local = parts()
    bad = {**local, "window": [{"loss": 1.0, "metrics": {}, "skipped": False}]}
    assert local_problem(bad) == window_problem(bad["window"][0]) is not None


def test_only_exact_plain_types_are_saved():
    """What ``torch.load(weights_only=True)`` reads back: a NumPy float is a float subclass and a named tuple a
    tuple one, yet neither loads, so a save refuses them before writing."""
    import collections

    import numpy as np

    from composetrain.checkpoint.format import unplain

    assert unplain({"a": [1, 2.0, "x", None, torch.zeros(1)], "b": (True,)}, "state.pt") is None
    assert unplain({"lr": np.float64(0.1)}, "state.pt").startswith("state.pt['lr'] is ")
    assert unplain([collections.namedtuple("P", "x")(1)], "rank-0.pt").startswith("rank-0.pt[0] is ")


def test_a_checkpoint_is_named_by_its_step_in_nine_or_more_digits_without_a_spare_zero():
    from composetrain.checkpoint.folder import step_of

    assert step_of("step-000000005") == 5 and step_of("step-1234567890") == 1234567890
    for name in ("step-5", "step-0000000005", "step-00000000a", "step-000000005.tmp", "step-" + "\uff10" * 7 + "05"):
        assert step_of(name) is None, name

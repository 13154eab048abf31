"""Checkpoints: loading never runs code, random states round-trip as plain data, anything off is set aside
(the save protocol is tested in test_checkpoint.py)."""

import pathlib
import random
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from helpers import assert_states_equal
from run_script import train

from composetrain.checkpoint.format import FORMAT
from composetrain.core.rng import capture_rng, restore_rng


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_random_states_round_trip_through_a_weights_only_load(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # NumPy's cached Gaussian is part of its state
    torch.save(capture_rng(), tmp_path / "rng.pt")
    expected = draws()
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draws() == expected


class Planted:
    """Unpickling this creates ``marker``: what a file planted in a checkpoint folder could do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def resumed_after(tmp_path, damage):
    """Train 2 epochs into tmp_path/b, ``damage(newest)``, resume to 3 epochs: it resumes from step 8,
    as if 16 had never been, with a warning. Returns the damaged checkpoint's path."""
    straight, _ = train(tmp_path / "a", epochs=3)
    train(tmp_path / "b", epochs=2)
    newest = tmp_path / "b" / "step-000000016"
    damage(newest)
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint .*step-000000016: .*; moved to corrupt-"):
        resumed, _ = train(tmp_path / "b", epochs=3)
    assert_states_equal(resumed, straight)
    return newest


@pytest.mark.parametrize("planted", ["state.pt", "rank-0.pt"])
def test_a_planted_pickle_is_never_run_and_its_checkpoint_is_set_aside(tmp_path, planted):
    marker = tmp_path / "code-ran"
    try:
        newest = resumed_after(tmp_path, lambda step: torch.save({"x": Planted(marker)}, step / planted))
    finally:  # checked first, whatever the resume did
        assert not marker.exists(), "loading a checkpoint ran the code planted in it"
    assert (newest.parent / "corrupt-step-000000016" / planted).is_file()


def rewrite(name, change):
    def damage(step):
        torch.save(change(torch.load(step / name, weights_only=False)), step / name)  # our own file

    return damage


@pytest.mark.parametrize(
    "change",
    [
        lambda saved: {"format": FORMAT},
        lambda saved: [saved],
        lambda saved: {k: v for k, v in saved.items() if k != "epoch"},
        lambda saved: {**saved, "position": "3"},
        lambda saved: {**saved, "position": 8},  # of 8 updates per epoch: the epoch's end saves position 0
        lambda saved: {**saved, "history": "junk"},
        lambda saved: {**saved, "state": {k: v for k, v in saved["state"].items() if k != "optimizer"}},
        lambda saved: {**saved, "state": {**saved["state"], "step": 2.5}},
        lambda saved: {**saved, "state": {**saved["state"], "step": 100}},  # not the step of its folder
    ],
    ids=[
        "format-only",
        "a-list",
        "no-epoch",
        "str-position",
        "past-the-end",
        "str-history",
        "no-optimizer",
        "float-step",
        "other-step",
    ],
)
def test_a_shared_state_of_the_wrong_shape_is_set_aside(tmp_path, change):
    resumed_after(tmp_path, rewrite("state.pt", change))


def bad_rng(rng, part, value):
    return {**rng, part: value}


@pytest.mark.parametrize(
    "change",
    [
        lambda saved: {**saved, "rng": bad_rng(saved["rng"], "torch", torch.zeros(3, dtype=torch.uint8))},
        lambda saved: {**saved, "rng": bad_rng(saved["rng"], "python", {**saved["rng"]["python"], "words": []})},
        lambda saved: {**saved, "rng": bad_rng(saved["rng"], "numpy", {**saved["rng"]["numpy"], "pos": "x"})},
        lambda saved: {k: v for k, v in saved.items() if k != "rng"},
        lambda saved: {**saved, "window": [{"loss": 1.0}]},
        lambda saved: {**saved, "generators": [torch.zeros(2, dtype=torch.uint8)]},
        lambda saved: {**saved, "order": {"rng": saved["rng"]}},
    ],
    ids=["torch-rng", "python-rng", "numpy-rng", "no-rng", "window", "generator", "order"],
)
def test_a_bad_rank_file_is_set_aside_before_anything_is_loaded(tmp_path, change):
    resumed_after(tmp_path, rewrite("rank-0.pt", change))


def test_a_step_corrupted_twice_is_set_aside_under_a_free_name(tmp_path):
    def damage(step):
        (step.parent / "corrupt-step-000000016").mkdir()  # set aside by an earlier run
        (step.parent / "corrupt-step-000000016" / "state.pt").write_bytes(b"the first")
        (step / "state.pt").write_bytes(b"the second")

    newest = resumed_after(tmp_path, damage)
    assert (newest.parent / "corrupt-step-000000016" / "state.pt").read_bytes() == b"the first"
    assert (newest.parent / "corrupt-step-000000016-2" / "state.pt").read_bytes() == b"the second"


def test_with_every_checkpoint_corrupt_the_run_is_refused_not_started_afresh(tmp_path):
    """Days of training would start over unnoticed (a warning in a log): every rank refuses, naming the folders set
    aside and the fix, also when launched again (the set-aside folders still say so), and trains once they are moved
    out of checkpoint_dir."""
    straight, _ = train(tmp_path / "a", epochs=2)
    train(tmp_path / "b", epochs=1)
    (tmp_path / "b" / "step-000000008" / "rank-0.pt").write_bytes(b"junk")
    refused = pytest.raises(
        RuntimeError,
        match=r"no checkpoint in .* could be read \(set aside: "
        r"corrupt-step-000000008\).*move the corrupt-step-\* folders out",
    )
    for first in (True, False):  # the first sets it aside, the second finds only what was set aside
        with pytest.warns(UserWarning, match=r"skipping unreadable") if first else nullcontext(), refused:
            train(tmp_path / "b", epochs=2)
    assert not list((tmp_path / "b").glob("step-*"))
    (tmp_path / "b" / "corrupt-step-000000008").rename(tmp_path / "kept")
    resumed, _ = train(tmp_path / "b", epochs=2)
    assert_states_equal(resumed, straight)

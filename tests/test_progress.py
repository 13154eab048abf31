"""driver.progress: where ct.run's loop stands, its checkpoint payload (format 2) and its schedule."""

import random

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from composetrain.core.protocol import StepOutput
from composetrain.core.rng import seed_everything
from composetrain.driver.progress import Due, Progress, Schedule


def schedule(**kw):
    return Schedule(
        **{
            "per_epoch": 5,
            "epochs": 2,
            "max_steps": None,
            "log_every": 2,
            "eval_every": None,
            "checkpoint_every": None,
            **kw,
        }
    )


def test_the_checkpoint_payload_keeps_format_2s_keys_and_round_trips():
    out = StepOutput(torch.tensor(0.5, dtype=torch.float64), {"acc": torch.tensor(0.25)}, torch.tensor(True))
    order = {"rng": {}, "generators": [], "sampler_seed": None}
    at = Progress(schedule(), 0, 1, 3, [{"step": 6}], [{"step": 5, "epoch": 1, "acc": 0.5}], [out], order)
    shared, local = at.to_checkpoint({"model": 1}, {"seed": 0}, ["g"])
    # as ct.run saved them, and the window's means over ranks (empty unless given: a global batch's run)
    assert list(shared) == ["state", "settings", "epoch", "position", "history", "evals", "window", "stream"]
    assert shared["window"] == [] and shared["stream"] is None  # a stream's state only where it is the job's
    assert list(local) == ["window", "order", "generators", "stream"]  # Checkpoints.save adds the rng
    assert local["stream"] is None  # no stream: nothing of one
    assert (shared["state"], shared["settings"], shared["epoch"], shared["position"]) == (
        {"model": 1},
        {"seed": 0},
        1,
        3,
    )
    assert local["window"] == [{"loss": out.loss, "metrics": {"acc": out.metrics["acc"]}, "skipped": True}]
    assert type(local["window"][0]["skipped"]) is bool and local["order"] is order and local["generators"] == ["g"]
    back = Progress.from_checkpoint(shared, local, schedule(), start=8)
    assert (back.start, back.epoch, back.position, back.history, back.evals, back.order) == (
        8,
        1,
        3,
        at.history,
        at.evals,
        order,
    )
    assert [(o.loss, o.metrics, o.skipped) for o in back.window] == [(out.loss, out.metrics, True)]
    at.position = 0  # at an epoch's start the order is drawn again on resume: none is saved
    assert at.to_checkpoint({}, {}, [])[1]["order"] is None


@given(
    per_epoch=st.integers(1, 7),
    epochs=st.integers(1, 3),
    log_every=st.integers(1, 9),
    eval_every=st.none() | st.integers(1, 9),
    checkpoint_every=st.none() | st.integers(1, 9),
    start_epochs=st.integers(0, 2),
)
def test_what_is_due_after_each_update_follows_the_documented_rules(
    per_epoch, epochs, log_every, eval_every, checkpoint_every, start_epochs
):
    """Log every log_every updates and at each epoch's last; evaluate every eval_every updates, or at
    each epoch's end without it; save every checkpoint_every updates and at each epoch's end; a run
    resumed at an epoch's end keeps the cadences (multiples of the totals)."""
    s = schedule(
        per_epoch=per_epoch,
        epochs=epochs + start_epochs,
        log_every=log_every,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
    )
    step = start_epochs * per_epoch
    at = Progress(s, start=step, epoch=start_epochs)
    while not at.finished(step):
        step, at.position = step + 1, at.position + 1
        end = at.position == per_epoch
        assert at.after_update(step) == Due(
            log=step % log_every == 0 or end,
            save=bool(checkpoint_every and step % checkpoint_every == 0) or end,
            evaluate=bool(eval_every and step % eval_every == 0) or (end and not eval_every),
            epoch_end=end,
        )
        if end:
            at.next_epoch()
    assert (at.epoch, step) == (epochs + start_epochs, (epochs + start_epochs) * per_epoch)


def test_max_steps_ends_the_run_and_saves_where_it_stops():
    at = Progress(schedule(epochs=None, max_steps=3, checkpoint_every=None))
    at.position = 3
    assert at.after_update(3).save and at.finished(3) and not at.finished(2)
    assert schedule(epochs=None, max_steps=3).total_updates == 3 and schedule().total_updates == 10


def test_a_resumed_run_evaluates_first_only_where_an_evaluation_was_due_and_is_missing():
    every = schedule(eval_every=4)
    assert Progress(every, 8, epoch=1, position=3).evaluation_missed(8)
    assert not Progress(every, 8, epoch=1, position=3, evals=[{"step": 8}]).evaluation_missed(8)  # made
    assert not Progress(every, 7, epoch=1, position=2).evaluation_missed(7)  # not due at 7
    assert not Progress(every, 8).evaluation_missed(8)  # a fresh start: nothing to make up
    at_end = schedule()
    assert Progress(at_end, 5, epoch=1, position=0).evaluation_missed(5)  # at an epoch's end
    assert not Progress(at_end, 3, epoch=0, position=3).evaluation_missed(3)


def test_seed_everything_seeds_python_numpy_and_torch():
    def draws():
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    seed_everything(7)
    first = draws()
    seed_everything(7)
    assert draws() == first
    seed_everything(2**40 + 7)  # any non-negative int: NumPy's seed is taken modulo 2**32
    big = draws()
    assert big[1] == first[1] and big[0] != first[0]

"""Schedulers that step by update and by epoch (timm's: step_update(num_updates) after each update, step(epoch) at
each epoch's end) and schedulers fed a metric (ReduceLROnPlateau, timm's PlateauLRScheduler): a TrainState drives
them as timm's train.py does, bit for bit, checkpoints them, and refuses what it cannot drive when it is built."""

import copy
import warnings

import numpy as np
import pytest
import torch
from helpers import assert_untouched, classify, make_batch, mlp, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim import lr_scheduler

import composetrain as ct

timm_scheduler = pytest.importorskip("timm.scheduler")

EPOCHS, PER_EPOCH = 4, 3


def parts(seed=0):
    model = mlp(seed)
    # two groups at different rates, as timm's layer decay builds them (lr_scale)
    groups = [
        {"params": list(model[0].parameters()), "lr_scale": 0.5},
        {"params": list(model[2].parameters()), "weight_decay": 0.0},
    ]
    return model, torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=1e-3)


def timm_cosine(optimizer, per_update: bool, warmup: int = 1, noise=None):
    """timm's train.py scheduler: create_scheduler_v2 as it calls it (per update: step_on_epochs=False)."""
    scheduler, _ = timm_scheduler.create_scheduler_v2(
        optimizer,
        sched="cosine",
        num_epochs=EPOCHS,
        warmup_epochs=warmup,
        warmup_lr=1e-3,
        min_lr=1e-4,
        noise=noise,
        step_on_epochs=not per_update,
        updates_per_epoch=PER_EPOCH,
    )
    return scheduler


def batches(epoch):
    return [make_batch(6, seed=100 * epoch + i) for i in range(PER_EPOCH)]


def timm_loop(model, optimizer, scheduler, epochs=EPOCHS, start_epoch=0):
    """timm's train.py: num_updates = epoch * updates_per_epoch; after each update num_updates += 1 and
    lr_scheduler.step_update(num_updates=num_updates); after each epoch lr_scheduler.step(epoch + 1, metric)."""
    rates = []
    for epoch in range(start_epoch, epochs):
        num_updates = epoch * PER_EPOCH
        for batch in batches(epoch):
            rates.append([g["lr"] for g in optimizer.param_groups])
            classify(model, batch)[0].backward()
            optimizer.step()
            num_updates += 1
            optimizer.zero_grad()
            scheduler.step_update(num_updates=num_updates)
        scheduler.step(epoch + 1)
    return rates


def ct_loop(state, epochs=EPOCHS, start_epoch=0):
    rates, train = [], ct.train_step(classify)
    for epoch in range(start_epoch, epochs):
        for batch in batches(epoch):
            rates.append([g["lr"] for g in state.optimizer.param_groups])
            train(state, batch)
        state.end_epoch()
    return rates


@pytest.mark.parametrize("per_update", [True, False], ids=["per-update", "per-epoch"])
@pytest.mark.parametrize("noise", [None, [0.25, 0.75]], ids=["plain", "noise"])
def test_a_timm_scheduler_steps_as_timms_train_loop_steps_it_bit_for_bit(per_update, noise):
    model, opt = parts()
    state = ct.TrainState(model, opt, timm_cosine(opt, per_update, noise=noise))
    by_hand_model, by_hand_opt = parts()
    by_hand = timm_cosine(by_hand_opt, per_update, noise=noise)
    assert ct_loop(state) == timm_loop(by_hand_model, by_hand_opt, by_hand)
    assert state.epoch == EPOCHS and state.step == EPOCHS * PER_EPOCH
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in by_hand_opt.param_groups]
    for a, b in zip(model.parameters(), by_hand_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert state.scheduler.state_dict() == by_hand.state_dict()


def test_the_rates_change_within_an_epoch_per_update_and_only_at_its_end_per_epoch():
    """The test above compares against something that moves: warmup and cosine in updates, or in epochs."""
    per_update, per_epoch = (ct_loop(ct.TrainState(*p, timm_cosine(p[1], u))) for p, u in ((parts(), 1), (parts(), 0)))
    assert len({r[0] for r in per_update[:PER_EPOCH]}) == PER_EPOCH
    assert len({r[0] for r in per_epoch[:PER_EPOCH]}) == 1 and per_epoch[PER_EPOCH] != per_epoch[0]


@given(stop=st.integers(1, EPOCHS * PER_EPOCH - 1), per_update=st.booleans())
@settings(max_examples=12, deadline=None)
def test_a_timm_scheduler_resumes_from_a_checkpoint_exactly(stop, per_update):
    """Saved after any update (mid-epoch or at an epoch's end) and loaded into a fresh state: the rest of the run is
    the uninterrupted one's, rates and weights; the epochs ended are part of the state."""
    whole_model, whole_opt = parts()
    whole = ct.TrainState(whole_model, whole_opt, timm_cosine(whole_opt, per_update))
    straight = ct_loop(whole)
    model, opt = parts()
    first = ct.TrainState(model, opt, timm_cosine(opt, per_update))
    train, rates, done = ct.train_step(classify), [], 0
    for epoch in range(EPOCHS):
        for batch in batches(epoch):
            if done == stop:
                break
            rates.append([g["lr"] for g in opt.param_groups])
            train(first, batch)
            done += 1
        else:
            first.end_epoch()
            continue
        break
    saved = copy.deepcopy(first.state_dict())
    assert saved["epoch"] == stop // PER_EPOCH
    fresh_model, fresh_opt = parts(seed=7)
    resumed = ct.TrainState(fresh_model, fresh_opt, timm_cosine(fresh_opt, per_update))
    resumed.load_state_dict(saved)
    epoch, position = divmod(stop, PER_EPOCH)
    for batch in batches(epoch)[position:]:
        rates.append([g["lr"] for g in fresh_opt.param_groups])
        train(resumed, batch)
    resumed.end_epoch()
    rates += ct_loop(resumed, start_epoch=epoch + 1)
    assert rates == straight
    assert resumed.epoch == EPOCHS and resumed.scheduler.state_dict() == whole.scheduler.state_dict()
    for a, b in zip(fresh_model.parameters(), whole_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_older_checkpoint_without_the_epoch_count_loads_as_epoch_0():
    model, opt = parts()
    state = ct.TrainState(model, opt)
    saved = state.state_dict()
    del saved["epoch"]
    state.epoch = 3
    state.load_state_dict(saved)
    assert state.epoch == 0
    for bad, error in [(-1, ValueError), (1.5, TypeError), ("2", TypeError)]:
        with pytest.raises(error, match=r"^TrainState\.load_state_dict: epoch must be a non-negative int"):
            state.load_state_dict({**saved, "epoch": bad})


# -- an object of your own with the same two methods: the protocol ---------------------------------------------
class Halving:
    """Any object with step_update(num_updates) and step(epoch): halves the rate at every epoch's end and counts
    the updates it was told of."""

    def __init__(self, optimizer):
        self.optimizer, self.updates, self.epochs = optimizer, [], []

    def step_update(self, num_updates):
        self.updates.append(num_updates)

    def step(self, epoch, metric=None):
        self.epochs.append((epoch, metric))
        for g in self.optimizer.param_groups:
            g["lr"] *= 0.5

    def state_dict(self):
        return {"updates": list(self.updates), "epochs": list(self.epochs)}

    def load_state_dict(self, state_dict):
        self.updates, self.epochs = list(state_dict["updates"]), list(state_dict["epochs"])


def test_any_object_with_step_update_and_step_epoch_is_driven_alike():
    model, opt = parts()
    state = ct.TrainState(model, opt, Halving(opt))
    ct_loop(state, epochs=2)
    assert state.scheduler.updates == list(range(1, 2 * PER_EPOCH + 1))
    assert state.scheduler.epochs == [(1, None), (2, None)]
    assert opt.param_groups[1]["lr"] == 0.1 * 0.25


def test_a_skipped_update_does_not_count_for_step_update():
    """state.step counts applied updates: a skipped one steps no schedule (pitfall 7)."""
    model = mlp(0, torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = ct.TrainState(model, opt, Halving(opt))
    batch = make_batch(6, dtype=torch.float32)
    nan = (batch[0] * float("nan"), batch[1])
    train = ct.mixed_precision(dtype="bf16")(classify)
    for b in (batch, nan, batch):
        train(state, b)
    assert state.step == 2 and state.scheduler.updates == [1, 2]


# -- refused when the TrainState is built, changing nothing ---------------------------------------------------
def test_a_scheduler_whose_step_update_needs_more_than_the_count_is_refused():
    model, opt = parts()
    sched = Halving(opt)
    sched.step_update = lambda num_updates, lr: None
    with pytest.raises(TypeError) as e:
        ct.TrainState(model, opt, sched)
    said = str(e.value)
    assert said.startswith("TrainState: scheduler Halving's step_update() cannot be called as step_update(num_updates)")
    assert "its signature is (num_updates, lr)" in said
    assert "step_update(num_updates) after each applied update, step(epoch) at each epoch's end" in said


def test_a_scheduler_whose_step_needs_more_than_the_epoch_is_refused():
    model, opt = parts()
    sched = Halving(opt)
    sched.step = lambda epoch, metric, other: None
    with pytest.raises(TypeError, match=r"^TrainState: scheduler Halving's step\(\) cannot be called as step\(epoch\)"):
        ct.TrainState(model, opt, sched)


@pytest.mark.parametrize("interval", ["epoch"])
def test_a_scheduler_stepping_both_ways_refuses_an_interval(interval):
    model, opt = parts()
    with pytest.raises(ValueError) as e:
        ct.TrainState(model, opt, timm_cosine(opt, True), scheduler_interval=interval)
    said = str(e.value)
    assert said.startswith("TrainState: scheduler CosineLRScheduler steps both by update and by epoch")
    assert "leave scheduler_interval at 'update'" in said


def test_a_failing_step_update_leaves_the_state_marked_unusable():
    """After optimizer.step() nothing can be undone: the state says so, and every later step refuses it."""
    model, opt = parts()
    sched = Halving(opt)

    def broken(num_updates):
        raise RuntimeError("no")

    sched.step_update = broken
    state = ct.TrainState(model, opt, sched)
    train = ct.train_step(classify)
    with pytest.raises(RuntimeError, match="no"):
        train(state, make_batch(4))
    assert state.step == 0 and "step_update() raised" in state.unusable
    with pytest.raises(RuntimeError, match="half-updated"):
        train(state, make_batch(4))


# -- schedulers fed a metric ---------------------------------------------------------------------------------
def plateau_parts(kind, mode="min"):
    model, opt = parts()
    if kind == "torch":
        return model, opt, lr_scheduler.ReduceLROnPlateau(opt, mode=mode, patience=1, factor=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # timm deprecates it, not its behaviour
        return model, opt, timm_scheduler.PlateauLRScheduler(opt, decay_rate=0.5, patience_t=1, mode=mode)


METRICS = [1.0, 0.9, 0.95, 0.97, 0.99, 0.99, 0.5]


@pytest.mark.parametrize("kind", ["torch", "timm"])
def test_a_plateau_scheduler_fed_by_end_epoch_decays_as_by_hand(kind):
    model, opt, plateau = plateau_parts(kind)
    interval = "epoch" if kind == "torch" else "update"
    state = ct.TrainState(model, opt, plateau, scheduler_interval=interval)
    _, by_hand_opt, by_hand = plateau_parts(kind)
    rates = []
    for epoch, metric in enumerate(METRICS):
        state.end_epoch(metric=metric)
        by_hand.step(metric) if kind == "torch" else by_hand.step(epoch + 1, metric)
        rates.append(opt.param_groups[0]["lr"])
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in by_hand_opt.param_groups]
    assert len(set(rates)) > 1  # it decayed


@pytest.mark.parametrize("kind", ["torch", "timm"])
def test_a_plateau_scheduler_without_its_metric_is_refused_changing_nothing(kind):
    model, opt, plateau = plateau_parts(kind)
    state = ct.TrainState(model, opt, plateau, scheduler_interval="epoch" if kind == "torch" else "update")
    before, sched_before = snapshot(state), copy.deepcopy(plateau.state_dict())
    with pytest.raises(TypeError) as e:
        state.end_epoch()
    said = str(e.value)
    name = type(plateau).__name__
    assert said.startswith(f"TrainState.end_epoch: the scheduler {name} steps on a metric, and none was given")
    assert "end_epoch(metric=" in said and "scheduler_metric=" in said
    assert_untouched(state, before)
    assert plateau.state_dict() == sched_before and state.epoch == 0


def test_reduce_lr_on_plateau_stepping_per_update_is_refused_with_the_interval_to_use():
    model, opt, plateau = plateau_parts("torch")
    with pytest.raises(TypeError) as e:
        ct.TrainState(model, opt, plateau)
    said = str(e.value)
    assert said.startswith("TrainState: scheduler ReduceLROnPlateau steps on a metric")
    assert "scheduler_interval='epoch'" in said and "scheduler_metric=" in said


@pytest.mark.parametrize("metric", [0.5, 1, float("inf")])
def test_a_metric_given_to_a_scheduler_that_takes_none_is_refused(metric):
    model, opt = parts()
    for state in (
        ct.TrainState(model, opt, lr_scheduler.StepLR(opt, 1), scheduler_interval="epoch"),
        ct.TrainState(model, opt, lr_scheduler.StepLR(opt, 1)),
        ct.TrainState(model, opt),
    ):
        before = snapshot(state)
        with pytest.raises(ValueError, match=r"^TrainState\.end_epoch: metric was given"):
            state.end_epoch(metric=metric)
        assert_untouched(state, before)
        assert state.epoch == 0


@pytest.mark.parametrize("metric", ["0.5", True, torch.tensor(0.5), [0.5]])
def test_a_metric_that_is_no_number_is_refused(metric):
    model, opt, plateau = plateau_parts("torch")
    state = ct.TrainState(model, opt, plateau, scheduler_interval="epoch")
    with pytest.raises(TypeError, match=r"^TrainState\.end_epoch: metric must be a number, got .*metric=val_loss.item"):
        state.end_epoch(metric=metric)
    assert plateau.last_epoch == 0 and state.epoch == 0


@pytest.mark.parametrize("kind", ["torch", "timm"])
@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_nan_metric_is_an_epoch_without_improvement_as_the_scheduler_takes_it(kind, mode):
    """torch's ReduceLROnPlateau (and timm's plateau, which steps it) take NaN as no improvement, and timm's
    train.py feeds whatever its evaluation gave (a metric of 0/0, a diverged epoch): refused, a run fed by
    scheduler_metric could not go on, not even from its checkpoint (it evaluates to NaN again)."""
    model, opt, plateau = plateau_parts(kind, mode)
    state = ct.TrainState(model, opt, plateau, scheduler_interval="epoch" if kind == "torch" else "update")
    _, by_hand_opt, by_hand = plateau_parts(kind, mode)
    nan = float("nan")
    for epoch, metric in enumerate([1.0, nan, nan, 0.5, np.float64(nan), nan, nan]):
        state.end_epoch(metric=metric)
        by_hand.step(metric) if kind == "torch" else by_hand.step(epoch + 1, metric)
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in by_hand_opt.param_groups]
    assert state.epoch == 7 and opt.param_groups[0]["lr"] < 0.1  # it decayed on the NaN epochs


def test_a_timm_scheduler_takes_the_metric_as_timms_loop_gives_it():
    model, opt = parts()
    state = ct.TrainState(model, opt, Halving(opt))
    state.end_epoch(metric=0.25)
    state.end_epoch(metric=np.float64(0.5))
    assert state.scheduler.epochs == [(1, 0.25), (2, 0.5)]
    assert all(type(m) is float for _, m in state.scheduler.epochs)


@pytest.mark.parametrize("stop", [4, PER_EPOCH * 2])
def test_ct_run_resumes_a_timm_scheduler_exactly_mid_epoch_and_at_an_epoch_end(tmp_path, stop):
    from torch.utils.data import TensorDataset

    x, y = make_batch(6 * PER_EPOCH, seed=11)
    options = {"batch_size": 6, "num_workers": 0, "progress": False, "shuffle": False, "epochs": EPOCHS}

    def fresh(seed=0):
        model, opt = parts(seed)
        return ct.TrainState(model, opt, timm_cosine(opt, per_update=True))

    straight = fresh()
    ct.run(classify, straight, TensorDataset(x, y), **options)
    ct.run(classify, fresh(), TensorDataset(x, y), checkpoint_dir=tmp_path, **{**options, "max_steps": stop})
    resumed = fresh(seed=4)
    ct.run(classify, resumed, TensorDataset(x, y), checkpoint_dir=tmp_path, **options)
    assert resumed.epoch == straight.epoch == EPOCHS
    assert resumed.scheduler.state_dict() == straight.scheduler.state_dict()
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [g["lr"] for g in straight.optimizer.param_groups]
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)

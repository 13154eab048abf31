"""scheduler_interval='epoch': the TrainStep does not step the scheduler, end_epoch() does and ct.run calls it once
per epoch, also across a resume in the middle or at the end of an epoch; a schedule's horizon is checked."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler as sched
from torch.utils.data import TensorDataset

import composetrain as ct
from composetrain.driver.schedules import horizon

EPOCHS, PER_EPOCH, BATCH = 5, 4, 6


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def recipe_scheduler(opt, epochs=EPOCHS):
    """torchvision references/classification/train.py: linear warmup of 2 epochs, then cosine, per epoch."""
    warm = sched.LinearLR(opt, start_factor=0.01, total_iters=2)
    cosine = sched.CosineAnnealingLR(opt, T_max=epochs - 2, eta_min=0.0)
    return sched.SequentialLR(opt, schedulers=[warm, cosine], milestones=[2])


def recipe_state(seed=0, interval="epoch"):
    m = model(seed)
    opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    return ct.TrainState(m, opt, recipe_scheduler(opt), scheduler_interval=interval)


def data():
    g = torch.Generator().manual_seed(3)
    n = PER_EPOCH * BATCH
    return TensorDataset(torch.randn(n, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))


def rates_recorder(state, rates):
    def step(m, batch):
        rates.append(state.optimizer.param_groups[0]["lr"])  # the rate this update uses
        x, y = batch
        return F.cross_entropy(m(x), y)

    return step


def recipe_rates():
    """The recipe's own loop: the rate of each update, the scheduler stepped after each epoch."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    scheduler = recipe_scheduler(opt)
    rates = []
    for _ in range(EPOCHS):
        rates += [opt.param_groups[0]["lr"]] * PER_EPOCH
        scheduler.step()
    return rates


def test_the_train_step_leaves_an_epoch_scheduler_alone_and_end_epoch_steps_it_once():
    state = recipe_state()
    x, y = data().tensors
    train = ct.train_step(lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    for _ in range(3):
        train(state, (x[:BATCH], y[:BATCH]))
    assert state.scheduler.last_epoch == 0 and state.step == 3
    state.end_epoch()
    assert state.scheduler.last_epoch == 1
    per_update = recipe_state(interval="update")
    train(per_update, (x[:BATCH], y[:BATCH]))
    per_update.end_epoch()  # a per-update scheduler: nothing, so a loop may always call it
    assert per_update.scheduler.last_epoch == 1
    m = model()
    ct.TrainState(m, torch.optim.SGD(m.parameters(), lr=0.1)).end_epoch()  # no scheduler: nothing


def test_ct_run_steps_the_recipe_schedule_per_epoch_and_uses_its_rates_exactly():
    state = recipe_state()
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its horizon fits: no warning
        ct.run(
            rates_recorder(state, rates), state, data(), batch_size=BATCH, epochs=EPOCHS, shuffle=False, progress=False
        )
    assert rates == recipe_rates()  # exactly: the same floats
    assert state.scheduler.last_epoch == EPOCHS


@pytest.mark.parametrize("stop", [6, 8], ids=["mid-epoch", "epoch-end"])
def test_a_resume_steps_the_epoch_scheduler_neither_twice_nor_never(tmp_path, stop):
    args = dict(batch_size=BATCH, epochs=EPOCHS, progress=False, seed=1)
    straight = recipe_state()
    straight_rates = []
    ct.run(ct.ema(0.8)(rates_recorder(straight, straight_rates)), straight, data(), **args)
    first = recipe_state()
    rates = []
    ct.run(
        ct.ema(0.8)(rates_recorder(first, rates)),
        first,
        data(),
        max_steps=stop,
        checkpoint_dir=tmp_path,
        checkpoint_every=3,
        **args,
    )
    assert first.scheduler.last_epoch == stop // PER_EPOCH
    resumed = recipe_state(seed=9)
    ct.run(ct.ema(0.8)(rates_recorder(resumed, rates)), resumed, data(), checkpoint_dir=tmp_path, **args)
    assert rates == straight_rates
    assert resumed.scheduler.state_dict() == straight.scheduler.state_dict()
    a, b = resumed.state_dict(), straight.state_dict()
    for k, v in b["model"].items():
        assert torch.equal(a["model"][k], v), k
    for k, v in b["transforms"]["ema"]["averages"].items():
        assert torch.equal(a["transforms"]["ema"]["averages"][k], v), k


def test_a_schedule_built_in_epochs_but_stepped_per_update_is_warned_about_with_the_fix():
    state = recipe_state(interval="update")
    with pytest.warns(UserWarning) as caught:
        ct.run(
            lambda m, b: F.cross_entropy(m(b[0]), b[1]), state, data(), batch_size=BATCH, epochs=EPOCHS, progress=False
        )
    message = str(caught[0].message)
    assert "run: the scheduler SequentialLR ends after 5 of its steps (milestones [2] + CosineAnnealingLR T_max=3)" in (
        message
    )
    assert f"steps it {EPOCHS * PER_EPOCH} times (once per update" in message
    assert "scheduler_interval='epoch' (it then steps 5 times)" in message


def test_an_epoch_schedule_shorter_than_the_epochs_is_warned_about_too():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    state = ct.TrainState(m, opt, sched.CosineAnnealingLR(opt, T_max=1), scheduler_interval="epoch")
    with pytest.warns(
        UserWarning,
        match=r"CosineAnnealingLR ends after 1 .* steps it 4 times \(once per epoch.*"
        r"climbs back up and cycles; build it for 4 epochs",
    ):
        ct.run(lambda m, b: F.cross_entropy(m(b[0]), b[1]), state, data(), batch_size=BATCH, epochs=4, progress=False)


def test_horizons():
    opt = torch.optim.SGD(model().parameters(), lr=0.1)
    assert horizon(sched.CosineAnnealingLR(opt, T_max=7)) == (7, "T_max=7")
    assert horizon(sched.PolynomialLR(opt, total_iters=9))[0] == 9
    assert horizon(sched.LinearLR(opt, 1.0, 0.0, total_iters=4))[0] == 4  # a decay ends
    assert horizon(sched.LinearLR(opt, 0.1, 1.0, total_iters=4)) is None  # a warmup then holds: none
    assert horizon(sched.ConstantLR(opt, 0.5, total_iters=3)) is None
    assert horizon(sched.MultiStepLR(opt, [3, 8]))[0] == 8
    assert horizon(sched.StepLR(opt, 3)) is None and horizon(sched.ExponentialLR(opt, 0.9)) is None
    assert horizon(sched.OneCycleLR(opt, 0.1, total_steps=11))[0] == 11
    assert horizon(recipe_scheduler(opt, 10)) == (10, "milestones [2] + CosineAnnealingLR T_max=8")
    chained = sched.ChainedScheduler([sched.ExponentialLR(opt, 0.9), sched.MultiStepLR(opt, [6])])
    assert horizon(chained) == (6, "MultiStepLR milestones up to 6")
    assert horizon(sched.SequentialLR(opt, [sched.LinearLR(opt, 0.1), sched.StepLR(opt, 2)], [3])) is None


def test_a_wrong_interval_and_a_checkpoint_of_the_other_interval_are_refused():
    with pytest.raises(
        ValueError,
        match=r"TrainState: scheduler_interval must be 'update' or 'epoch', got 'step' "
        r"\(str\) \(Lightning's 'step' is 'update' here\)",
    ):
        recipe_state(interval="step")
    saved = copy.deepcopy(recipe_state(interval="update").state_dict())
    state = recipe_state()
    with pytest.raises(ValueError, match=r"stepped once per 'update'.*build it with scheduler_interval='update'"):
        state.load_state_dict(saved)
    del saved["scheduler_interval"]  # an older checkpoint: per update
    with pytest.raises(ValueError, match="scheduler_interval='update'"):
        state.load_state_dict(saved)
    recipe_state(interval="update").load_state_dict(saved)


def test_an_exhausted_one_cycle_schedule_is_refused_at_the_epoch_end_before_it_changes():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    state = ct.TrainState(m, opt, sched.OneCycleLR(opt, 0.1, total_steps=2), scheduler_interval="epoch")
    state.end_epoch()
    state.end_epoch()
    before = state.scheduler.state_dict()
    with pytest.raises(ValueError, match=r"TrainState\.end_epoch: the scheduler OneCycleLR is exhausted.*2 epochs"):
        state.end_epoch()
    assert state.scheduler.state_dict() == before
    assert math.isfinite(opt.param_groups[0]["lr"])


def cosine_state(t_max):
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    return ct.TrainState(m, opt, sched.CosineAnnealingLR(opt, T_max=t_max), scheduler_interval="epoch")


def test_a_finished_run_continued_for_more_epochs_is_warned_about_the_schedule_it_restored(tmp_path):
    """Trained 2 epochs on T_max=2, continued to 10 with a new T_max=10: the checkpoint's scheduler (T_max=2) is the
    one that trains, and its rate falls to 0 and climbs back: the horizon check sees it, after the resume."""
    args = dict(batch_size=BATCH, progress=False, checkpoint_dir=tmp_path)
    step = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 2 steps of a horizon of 2: nothing to say
        ct.run(step, cosine_state(2), data(), epochs=2, **args)
    continued = cosine_state(10)
    restored = (
        r"CosineAnnealingLR ends after 2 of its steps \(T_max=2\), but this run steps it 10 times.* but this is the "
        r"checkpoint's scheduler, restored over the one given"
    )
    with pytest.warns(UserWarning, match=restored):
        ct.run(step, continued, data(), epochs=10, **args)
    assert continued.scheduler.T_max == 2


@pytest.mark.parametrize("stop", [6, 8])
def test_a_one_cycle_schedule_of_exactly_the_runs_epochs_resumes_part_way(tmp_path, stop):
    """OneCycleLR(total_steps=EPOCHS), per epoch, stopped at update 6 (mid-epoch 2) or 8 (its end) and resumed:
    the epochs done are not counted again against its steps left; the rates are the straight run's."""

    def state():
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        return ct.TrainState(m, opt, sched.OneCycleLR(opt, 0.1, total_steps=EPOCHS), scheduler_interval="epoch")

    args = dict(batch_size=BATCH, progress=False, epochs=EPOCHS, seed=1)
    straight, straight_rates = state(), []
    ct.run(rates_recorder(straight, straight_rates), straight, data(), **args)
    first, rates = state(), []
    ct.run(rates_recorder(first, rates), first, data(), max_steps=stop, checkpoint_dir=tmp_path, **args)
    resumed = state()
    ct.run(rates_recorder(resumed, rates), resumed, data(), checkpoint_dir=tmp_path, **args)
    assert rates == straight_rates
    assert resumed.scheduler.last_epoch == EPOCHS


# -- per-epoch schedules that cannot serve the run, refused before the first update -----------------------------------


def cross_entropy(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def bn_net(seed=0):
    """A float32 model with BatchNorm."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


def one_cycle_state(total):
    model = bn_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=total)
    return ct.TrainState(model, opt, cycle, scheduler_interval="epoch")


def test_a_per_epoch_one_cycle_too_short_for_the_run_is_refused_before_the_first_update(tmp_path):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(36, 5, generator=g), torch.randint(0, 3, (36,), generator=g))
    state = one_cycle_state(3)
    with pytest.raises(
        ValueError,
        match=r"run: the scheduler OneCycleLR has 3 steps left \(total_steps=3\), but this "
        r"run reaches 4 epoch ends",
    ):
        ct.run(
            ct.train_step(cross_entropy), state, data, batch_size=12, epochs=4, progress=False, checkpoint_dir=tmp_path
        )
    assert state.step == 0  # was: it trained all 4 epochs, then end_epoch raised before the last one was saved
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enough = one_cycle_state(4)
        ct.run(ct.train_step(cross_entropy), enough, data, batch_size=12, epochs=4, progress=False)
        assert enough.scheduler.last_epoch == 4
        stops = one_cycle_state(2)  # max_steps ends it after 2 epochs
        ct.run(ct.train_step(cross_entropy), stops, data, batch_size=12, epochs=4, max_steps=7, progress=False)
        assert stops.step == 7 and stops.scheduler.last_epoch == 2


def test_reduce_lr_on_plateau_is_refused_per_update_and_driven_per_epoch_with_a_metric():
    model = bn_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    with pytest.raises(TypeError, match=r"cannot step once per update; build the TrainState with scheduler_interval"):
        ct.TrainState(model, opt, plateau)
    state = ct.TrainState(model, opt, plateau, scheduler_interval="epoch")  # was: refused, end_epoch had no metric
    state.end_epoch(metric=1.0)
    state.end_epoch(metric=2.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01) and state.epoch == 2

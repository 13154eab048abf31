"""The schedulers a TrainState accepts are those it can drive: one whose step() needs an argument it cannot give is
refused when the TrainState is built, not after the first optimizer.step(); timm's step(epoch) and step_update(n),
and ReduceLROnPlateau's metric, are driven (tests/test_timm_schedulers.py)."""

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

import composetrain as ct


class TimmLike:
    """timm.scheduler.Scheduler's interface (timm is not installed here): step(epoch) and step_update(n)."""

    def __init__(self, optimizer, t_initial=10):
        self.optimizer, self.t_initial, self.base = optimizer, t_initial, [g["lr"] for g in optimizer.param_groups]

    def step(self, epoch, metric=None):
        for g, lr in zip(self.optimizer.param_groups, self.base, strict=True):
            g["lr"] = lr * (1 - epoch / self.t_initial)

    def step_update(self, num_updates, metric=None):
        pass

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


class Counting:
    """A scheduler of its own, not torch's, whose step() takes no argument: ct can drive it."""

    def __init__(self, optimizer):
        self.optimizer, self.n = optimizer, 0

    def step(self):
        self.n += 1
        for g in self.optimizer.param_groups:
            g["lr"] = 0.1 / (1 + self.n)

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state_dict):
        self.n = state_dict["n"]


def parts():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(model, batch):
    return model(batch).pow(2).mean()


def test_a_timm_style_scheduler_is_driven_both_ways_and_refuses_an_epoch_interval():
    model, opt = parts()
    state = ct.TrainState(model, opt, TimmLike(opt))
    assert state.scheduler_kind == "both"
    state.end_epoch()
    assert opt.param_groups[0]["lr"] == 0.1 * (1 - 1 / 10)  # was: refused for its step(epoch)
    with pytest.raises(ValueError, match=r"TrainState: scheduler TimmLike steps both by update and by epoch") as e:
        ct.TrainState(model, opt, TimmLike(opt), scheduler_interval="epoch")
    assert "leave scheduler_interval at 'update'" in str(e.value)


def test_a_scheduler_whose_step_needs_an_argument_is_refused_without_the_timm_note():
    model, opt = parts()
    sched = Counting(opt)
    sched.step = lambda when: None  # an instance's own step, with no self
    with pytest.raises(TypeError, match=r"scheduler Counting's step\(\) needs \['when'\], but a TrainState") as e:
        ct.TrainState(model, opt, sched)
    assert "give yours a step_update(num_updates)" in str(e.value)


def test_a_scheduler_without_load_state_dict_is_refused_for_it_could_not_resume():
    model, opt = parts()

    class NoLoad:
        optimizer = opt

        def step(self):
            pass

        def state_dict(self):
            return {}

    with pytest.raises(TypeError, match=r"scheduler must be a torch.optim.lr_scheduler.LRScheduler or None"):
        ct.TrainState(model, opt, NoLoad())


def test_reduce_lr_on_plateau_per_update_is_refused_with_its_own_fix():
    model, opt = parts()
    with pytest.raises(TypeError, match=r"ReduceLROnPlateau steps on a metric.*scheduler_interval='epoch'"):
        ct.TrainState(model, opt, lr_scheduler.ReduceLROnPlateau(opt))


TORCH = {
    "StepLR": lambda o: lr_scheduler.StepLR(o, 2),
    "OneCycleLR": lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=10),
    "LambdaLR": lambda o: lr_scheduler.LambdaLR(o, lambda n: 1 / (1 + n)),
    "CosineAnnealingLR": lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=5),
    "SequentialLR": lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.LinearLR(o, 0.1, total_iters=2), lr_scheduler.ExponentialLR(o, 0.9)], milestones=[2]
    ),
    "ChainedScheduler": lambda o: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(o, 0.5, total_iters=2), lr_scheduler.ExponentialLR(o, 0.9)]
    ),
    "Counting": Counting,
}


@pytest.mark.parametrize("kind", sorted(TORCH))
def test_torch_schedulers_and_any_argumentless_one_step_once_per_update_as_by_hand(kind):
    model, opt = parts()
    state = ct.TrainState(model, opt, TORCH[kind](opt))
    by_hand_model, by_hand_opt = parts()
    by_hand = TORCH[kind](by_hand_opt)
    batch = torch.randn(4, 3)
    for _ in range(3):
        ct.train_step(step)(state, batch)
        step(by_hand_model, batch).backward()
        by_hand_opt.step()
        by_hand.step()
        by_hand_opt.zero_grad()
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in by_hand_opt.param_groups]
    for a, b in zip(model.parameters(), by_hand_model.parameters(), strict=True):
        assert torch.equal(a, b)

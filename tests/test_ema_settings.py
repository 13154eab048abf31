"""ct.ema's settings travel with its checkpoint: a resume with another decay, every, warmup or formula says so,
naming both; ct.ema_model refuses an ``into`` of another architecture or dtype in its own words."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import composetrain as ct


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g)


def state_of(model):
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9))


def saved_after(ema, updates=3):
    state = state_of(net())
    train = ema(step)
    for i in range(updates):
        train(state, batch(i))
    return copy.deepcopy(state.state_dict())


@pytest.mark.parametrize("claimed", ["setup-then-load", "load-then-first-update"])
@pytest.mark.parametrize(
    ("saved", "resumed", "shown"),
    [
        (ct.ema(0.9), ct.ema(0.99), ("decay=0.9", "decay=0.99")),
        (ct.ema(0.9, every=2), ct.ema(0.9, every=3), ("every=2", "every=3")),
        (ct.ema(0.9), ct.ema(0.9, warmup=5), ("warmup=0", "warmup=5")),
        (ct.ema(0.9), ct.ema(0.9, formula="sum"), ("formula='lerp'", "formula='sum'")),
    ],
)
def test_a_resume_with_other_ema_settings_warns_naming_both(saved, resumed, shown, claimed):
    checkpoint = saved_after(saved)
    state, train = state_of(net()), resumed(step)
    with pytest.warns(UserWarning, match=r"ema: the checkpoint's average was kept with ema\(") as caught:
        if claimed == "setup-then-load":  # ct.run's order: the averages exist when the checkpoint loads
            train.setup(state)
            state.load_state_dict(checkpoint)
        else:  # a plain loop: the checkpoint's average is claimed by the first update
            state.load_state_dict(checkpoint)
            train(state, batch(7))
    message = str(caught[0].message)
    assert message.index(shown[0]) < message.index("this run's ct.ema is") < message.index(shown[1])
    assert "continues with this run's settings" in message


def test_a_resume_with_the_same_settings_or_from_a_checkpoint_without_them_is_silent():
    checkpoint = saved_after(ct.ema(0.9, every=2))
    older = copy.deepcopy(checkpoint)
    del older["transforms"]["ema"]["settings"]  # saved before the settings were checkpointed
    for saved in (checkpoint, older):
        state, train = state_of(net()), ct.ema(0.9, every=2)(step)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            train.setup(state)
            state.load_state_dict(saved)
            train(state, batch(7))


def test_the_settings_are_plain_values_in_the_checkpoint():
    settings = saved_after(ct.ema(0.5, every=2, warmup=1, formula="sum"))["transforms"]["ema"]["settings"]
    assert settings == {"decay": 0.5, "every": 2, "warmup": 1, "formula": "sum"}
    assert [type(v) for v in settings.values()] == [float, int, int, str]


def test_ema_model_into_another_architecture_is_refused_as_ema_model_with_a_fix_that_applies():
    state = state_of(net())
    ct.ema(0.9)(step)(state, batch())
    other = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"ema_model: into \(Sequential\) is not the architecture averaged") as e:
        ct.ema_model(state, into=other)
    assert "into=build_model()" in str(e.value) and "new TrainState" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_ema_model_into_another_dtype_is_refused_and_leaves_into_untouched(dtype):
    state = state_of(net())
    ct.ema(0.9)(step)(state, batch())
    into = net(seed=3).to(dtype)
    before = copy.deepcopy(into.state_dict())
    with pytest.raises(ValueError, match=rf"ema_model: into's '0.weight' is \(8, 5\) {dtype}, its average \(8, 5\)"):
        ct.ema_model(state, into=into)
    assert all(torch.equal(v, into.state_dict()[k]) for k, v in before.items())
    cast = ct.ema_model(state, into=net(seed=3)).to(dtype)  # the fix the message gives
    assert cast[0].weight.dtype == dtype


def test_ema_model_into_another_shape_is_still_refused():
    state = state_of(net())
    ct.ema(0.9)(step)(state, batch())
    into = net()
    into[3] = nn.Linear(8, 4)
    with pytest.raises(ValueError, match=r"ema_model: into's '3.weight' is \(4, 8\) torch.float32, its average"):
        ct.ema_model(state, into=into)

"""ct.ema and epoch schedules, adversarial: a model changed after the EMA began is refused before the update (not
after it), averages follow their weights to another device, an evaluation never leaves the model half-swapped, a
per-epoch OneCycleLR too short for the run is refused before the first update."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct
from composetrain.core.protocol import Context


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


def snapshot(state):
    saved = state.state_dict()
    return copy.deepcopy({"model": saved["model"], "ema": saved["transforms"].get("ema"), "step": state.step})


def assert_unchanged(state, before):
    after = snapshot(state)
    assert after["step"] == before["step"]
    for k, v in before["model"].items():
        assert torch.equal(after["model"][k], v), k
    if before["ema"] is not None:
        assert after["ema"]["n_averaged"] == before["ema"]["n_averaged"]
        for k, v in before["ema"]["averages"].items():
            assert torch.equal(after["ema"]["averages"][k], v), k


def grow(model):
    model.add_module("extra", nn.Linear(3, 3))


def reshape(model):
    model[3] = nn.Linear(8, 4)


def widen(model):
    model.double()


@pytest.mark.parametrize(
    "change, error",
    [
        (grow, r"ema: the model's parameters and buffers differ from the averaged ones \(missing \[\], new \['extra"),
        (reshape, r"ema: the model's '3.weight' is \(4, 8\) torch.float32, its average \(3, 8\) torch.float32"),
        (widen, r"ema: the model's '0.weight' is \(8, 5\) torch.float64, its average \(8, 5\) torch.float32"),
    ],
)
def test_a_model_changed_after_the_ema_began_is_refused_before_the_update(change, error):
    state = state_of(net())
    train = ct.ema(0.9)(step)
    train(state, batch())
    train(state, batch(2))
    change(state.model)
    before = snapshot(state)
    x, y = batch(3)
    with pytest.raises(ValueError, match=error):
        train(state, (x.to(state.model[0].weight.dtype), y))
    assert_unchanged(state, before)  # was: the update applied, then the EMA raised (or a bare torch error)


def test_a_checkpoints_average_of_another_shape_is_refused_before_the_first_update():
    state = state_of(net())
    ct.ema(0.9)(step)(state, batch())
    saved = copy.deepcopy(state.state_dict())
    saved["transforms"]["ema"]["averages"]["3.weight"] = torch.zeros(4, 8)
    fresh = state_of(net(1))
    fresh.load_state_dict(saved)  # not yet claimed: no ct.ema has run on this state
    before = snapshot(fresh)
    with pytest.raises(ValueError, match=r"ema: the checkpoint's average of '3.weight' is \(4, 8\)"):
        ct.ema(0.9)(step)(fresh, batch())
    assert_unchanged(fresh, before)


def test_evaluating_the_average_of_a_changed_model_leaves_the_model_whole():
    state = state_of(net())
    train = ct.ema(0.5)(step)
    for seed in range(3):
        train(state, batch(seed))
    reshape(state.model)
    before = snapshot(state)
    (weights,) = train.eval_weights(state).values()
    with pytest.raises(ValueError, match=r"ema: the model's '3.weight' is \(4, 8\)"), weights:
        pass
    assert_unchanged(state, before)  # was: the tensors before '3.weight' left holding the averages


def test_the_averages_follow_their_weights_to_another_device():
    """A model placed after the EMA began (pipeline_split places it in its first update, after ct.run made the
    averages; a loop that moves it): its averages move with it instead of failing in the fused update."""
    state = state_of(net())
    train = ct.ema(0.5)(step)
    train(state, batch())
    state.model.to("meta")  # a device of its own, on any machine
    train.prepare(state, batch(), Context(state.model, None, total_weight=12.0, piece_weight=12.0))
    averages = state.transform_state("ema", lambda: None)
    assert {str(a.device) for a in averages.tensors.values()} == {"cpu"}  # prepare only checks: nothing moved
    averages.verify(state.model)
    averages.update(state.model, 0.5, "lerp", follow=False)  # what ct.ema's update phase does after the update
    found = state.state_dict()["transforms"]["ema"]["averages"]
    assert {str(a.device) for a in found.values()} == {"meta"}


def one_cycle_state(total):
    model = net()
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
        ct.run(ct.train_step(step), state, data, batch_size=12, epochs=4, progress=False, checkpoint_dir=tmp_path)
    assert state.step == 0  # was: it trained all 4 epochs, then end_epoch raised before the last one was saved
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enough = one_cycle_state(4)
        ct.run(ct.train_step(step), enough, data, batch_size=12, epochs=4, progress=False)
        assert enough.scheduler.last_epoch == 4
        stops = one_cycle_state(2)  # max_steps ends it after 2 epochs
        ct.run(ct.train_step(step), stops, data, batch_size=12, epochs=4, max_steps=7, progress=False)
        assert stops.step == 7 and stops.scheduler.last_epoch == 2


@pytest.mark.parametrize(
    "crafted",
    [None, {"n_averaged": 1}, {"averages": [1, 2], "n_averaged": 1}, {"averages": {"0.weight": 3}, "n_averaged": 1}],
)
def test_ema_model_of_a_crafted_unclaimed_checkpoint_is_refused_clearly(crafted):
    state = state_of(net())
    ct.ema(0.9)(step)(state, batch())
    saved = copy.deepcopy(state.state_dict())
    if isinstance(crafted, dict) and isinstance(crafted.get("averages"), dict):
        crafted = {**crafted, "averages": {**saved["transforms"]["ema"]["averages"], **crafted["averages"]}}
    saved["transforms"]["ema"] = crafted
    fresh = state_of(net(1))
    fresh.load_state_dict(saved)  # held for ct.ema, which checks it when it claims it
    with pytest.raises(TypeError, match=r"ema_model: the state's EMA \(loaded from a checkpoint\) is not ct\.ema's"):
        ct.ema_model(fresh)  # was: a bare TypeError, KeyError or AttributeError


def test_reduce_lr_on_plateau_is_refused_for_the_interval_asked():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(TypeError, match=r"cannot step once per update;"):
        ct.TrainState(model, opt, plateau)
    with pytest.raises(TypeError, match=r"which end_epoch\(\) does not have; keep it out"):
        ct.TrainState(model, opt, plateau, scheduler_interval="epoch")  # was: 'cannot step once per update'


def test_string_likes_are_kept_as_plain_strings_so_checkpoints_load_without_code():
    import io

    import numpy as np

    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, 1), scheduler_interval=np.str_("epoch"))
    assert type(state.scheduler_interval) is str
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["scheduler_interval"] == "epoch"  # was: ct.run's first save refused
    assert repr(ct.ema(0.9, formula=np.str_("sum"))(step)) == "ema(0.9, formula='sum')(step)"


class Counting(nn.Module):
    """A module that reassigns its buffer in forward (a new tensor, in eval mode too), as hand-written statistics do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.seen = self.seen + x.shape[0]
        return self.lin(x)


def test_evaluating_the_average_restores_a_buffer_the_forward_reassigned():
    torch.manual_seed(0)
    state = state_of(Counting())
    train = ct.ema(0.5)(step)
    for seed in range(3):
        train(state, batch(seed))
    before = snapshot(state)
    (weights,) = train.eval_weights(state).values()
    with weights, torch.no_grad():
        state.model(batch(7)[0])  # seen: the average's + 12, in a new tensor
    assert_unchanged(state, before)  # was: the model kept the average's count + 12, and trained on from it


def test_a_buffer_the_forward_reassigns_is_averaged_as_averaged_model_averages_it():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    state, plain = state_of(Counting()), state_of(copy.deepcopy(Counting()))
    plain.model.load_state_dict(state.model.state_dict())
    ref = AveragedModel(plain.model, multi_avg_fn=get_ema_multi_avg_fn(0.5), use_buffers=True)
    train = ct.ema(0.5)(step)
    for seed in range(3):
        train(state, batch(seed))
        ct.train_step(step)(plain, batch(seed))
        ref.update_parameters(plain.model)
    found = state.state_dict()["transforms"]["ema"]["averages"]
    assert found["seen"].item() == ref.module.seen.item() == 27.0  # 12, (12 + 24) / 2, (18 + 36) / 2
    assert all(torch.equal(found[k], v) for k, v in ref.module.state_dict().items())

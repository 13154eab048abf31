"""TrainState: loading a checkpoint is all or nothing; optimizers and schedulers that cannot fit are refused."""

import copy
import io

import pytest
import torch
from helpers import CLASSES, IN, assert_states_equal, assert_untouched, classify, make_batch, mlp, snapshot
from torch import nn

import composetrain as ct

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "sgd0": lambda params: torch.optim.SGD(params, lr=0.1),  # no momentum: no per-parameter state
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamax": lambda params: torch.optim.Adamax(params, lr=1e-2),
}
SCHEDULERS = {
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
    None: lambda opt: None,
}


def trained(optimizer="sgd", *, seed=0, updates=2, scheduler="step", model=None, train=None):
    """A TrainState after a few updates, so that a load that writes anything shows."""
    model = mlp(seed) if model is None else model
    train = ct.train_step(classify) if train is None else train
    opt = OPTIMIZERS[optimizer](model.parameters())
    state = ct.TrainState(model, opt, SCHEDULERS[scheduler](opt))
    for i in range(updates):
        train(state, make_batch(8, seed=seed * 100 + i, dtype=next(model.parameters()).dtype))
    return state


def old(saved):
    """A checkpoint as saved before TrainState recorded the optimizer's and scheduler's classes."""
    return {k: v for k, v in saved.items() if k not in ("optimizer_class", "scheduler_class")}


def refused(state, saved, error, pattern):
    """Loading ``saved`` raises, and leaves ``state`` exactly as it was, transform state included."""
    before = snapshot(state)
    with pytest.raises(error, match=pattern):
        state.load_state_dict(saved)
    assert_untouched(state, before)
    assert snapshot(state)["state"]["transforms"].keys() == before["state"]["transforms"].keys()
    ct.train_step(classify)(state, make_batch(8, seed=7))  # and it still trains


@pytest.mark.parametrize(
    ("saved_with", "loaded_into", "pattern"),
    [
        ("sgd", "adamw", r"checkpoint's optimizer is torch.optim.sgd.SGD, this TrainState's is .*AdamW; build"),
        ("sgd0", "adamw", r"checkpoint's optimizer is torch.optim.sgd.SGD, this TrainState's is .*AdamW; build"),
        ("adamw", "sgd", r"checkpoint's optimizer is .*AdamW, this TrainState's is torch.optim.sgd.SGD; build"),
    ],
)
def test_another_optimizers_checkpoint_is_refused_before_anything_is_written(saved_with, loaded_into, pattern):
    saved = trained(saved_with, updates=3).state_dict()
    assert saved["optimizer_class"] in ("torch.optim.sgd.SGD", "torch.optim.adamw.AdamW")  # a plain string
    refused(trained(loaded_into, seed=1), copy.deepcopy(saved), ValueError, pattern)


@pytest.mark.parametrize(
    ("saved_with", "loaded_into", "pattern"),
    [
        ("sgd", "adamw", r"group 0 .* has hyperparameters \['dampening', 'momentum', 'nesterov'\] that AdamW does"),
        ("sgd0", "adamw", r"group 0 .* has hyperparameters \['dampening', 'momentum', 'nesterov'\] that AdamW does"),
        ("adamw", "sgd", r"group 0 .* has hyperparameters \['amsgrad', 'betas', .*\] that SGD does not have"),
        # Adamax's hyperparameters are a subset of Adam's: its per-parameter state gives it away
        ("adamax", "adam", r"holds \['exp_avg', 'exp_inf', 'step'\] per parameter, which Adam never keeps .*Adamax"),
    ],
)
def test_an_older_checkpoint_of_another_optimizer_is_recognised_and_refused(saved_with, loaded_into, pattern):
    saved = old(trained(saved_with, updates=3).state_dict())
    refused(trained(loaded_into, seed=1), copy.deepcopy(saved), ValueError, pattern)


def test_a_hyperparameter_missing_after_loading_is_refused_and_the_optimizer_restored():
    saved = old(trained("sgd", updates=3).state_dict())
    del saved["optimizer"]["param_groups"][0]["momentum"]  # SGD fills in what older torch lacked, not this
    refused(trained("sgd", seed=1), copy.deepcopy(saved), ValueError, r"lacks hyperparameters \['momentum'\]")


def test_optimizers_that_need_a_closure_are_refused_when_the_state_is_built():
    model = mlp()
    pattern = r"TrainState: optimizer LBFGS's step\(\) needs \['closure'\] \(a closure .*e.g. torch.optim"
    with pytest.raises(TypeError, match=pattern):
        ct.TrainState(model, torch.optim.LBFGS(model.parameters()))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_exhausted_schedule_refuses_the_update_before_anything_changes(precision):
    model = mlp().float()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = ct.TrainState(model, opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=3))
    train = ct.train_step(classify) if precision == "fp32" else ct.mixed_precision(dtype="fp16")(classify)
    for i in range(3):  # total_steps updates are fine
        train(state, make_batch(8, seed=i, dtype=torch.float32))
    before = snapshot(state)
    with pytest.raises(ValueError, match=r"OneCycleLR is exhausted: .*total_steps=3 .*taken 3; .*max_steps=3\)"):
        train(state, make_batch(8, seed=3, dtype=torch.float32))
    assert_untouched(state, before)
    assert state.state_dict()["transforms"] == before["state"]["transforms"]  # the loss scale too


def test_a_parameter_unfrozen_later_has_its_gradient_cleared():
    model = mlp()
    model[0].requires_grad_(False)
    state = ct.TrainState(model, torch.optim.SGD(model[2].parameters(), lr=0.1))  # the frozen layer not optimized
    model[0].requires_grad_(True)  # unfrozen after the state was built
    for i in range(2):
        ct.train_step(classify)(state, make_batch(6, seed=i))
        assert all(p.grad is None for p in model.parameters()), "a gradient left to grow from update to update"


class TwoLayers(nn.Module):
    """The same names, and parameters listed in either order."""

    def __init__(self, a_first: bool, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        if a_first:
            self.a, self.b = nn.Linear(IN, 8), nn.Linear(8, CLASSES)
        else:
            self.b, self.a = nn.Linear(8, CLASSES), nn.Linear(IN, 8)
        self.double()

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("target_trained", [False, True])
def test_a_checkpoint_with_parameters_in_another_order_is_refused(optimizer, target_trained):
    saved = trained(optimizer, model=TwoLayers(a_first=True), updates=2).state_dict()
    target = trained(optimizer, model=TwoLayers(a_first=False, seed=1), updates=int(target_trained))
    pattern = r"state '\w+' of parameter 0 has shape \(8, 5\), but .*parameter 0 \(b.weight\) has shape \(3, 8\)"
    refused(target, copy.deepcopy(saved), ValueError, pattern + ".*another order")


def test_a_checkpoint_with_param_groups_in_another_order_is_refused():
    def grouped(a_first, seed):
        model = TwoLayers(a_first=True, seed=seed)
        groups = [{"params": list(model.a.parameters())}, {"params": list(model.b.parameters())}]
        opt = torch.optim.SGD(groups if a_first else groups[::-1], lr=0.1, momentum=0.9)
        state = ct.TrainState(model, opt)
        ct.train_step(classify)(state, make_batch(8, seed=seed))
        return state

    saved = grouped(True, 0).state_dict()
    refused(grouped(False, 1), copy.deepcopy(saved), ValueError, r"momentum_buffer' of parameter 0 .*another order")


@pytest.mark.parametrize(
    ("entry", "pattern"),
    [
        ("junk", r"mismatched entries \(checkpoint vs model\) \[\"2.weight: 'junk' \(str\), not a tensor\"\]"),
        (torch.zeros(3, 8, dtype=torch.float32), r"\['2.weight: torch.float32 vs torch.float64'\].*same dtype"),
    ],
)
def test_a_model_entry_that_cannot_be_copied_exactly_is_refused(entry, pattern):
    saved = copy.deepcopy(trained("sgd", updates=3).state_dict())
    saved["model"]["2.weight"] = entry  # after entries that a copy entry by entry would have written
    refused(trained("sgd", seed=1), saved, ValueError, pattern)


def test_another_schedulers_checkpoint_is_refused():
    saved = trained("sgd", updates=3, scheduler="step").state_dict()
    assert saved["scheduler_class"] == "torch.optim.lr_scheduler.StepLR"
    target = trained("sgd", seed=1, scheduler="cosine")
    pattern = r"scheduler is torch.optim.lr_scheduler.StepLR, this TrainState's is .*CosineAnnealingLR; build"
    refused(target, copy.deepcopy(saved), ValueError, pattern)
    pattern = r"scheduler state has entries \['gamma', 'step_size'\] that CosineAnnealingLR does not keep"
    refused(target, copy.deepcopy(old(saved)), ValueError, pattern)


def test_transform_state_of_the_wrong_kind_leaves_nothing_half_loaded():
    saved = copy.deepcopy(trained("sgd", updates=3).state_dict())
    target = trained("sgd", seed=1)
    scaler = target.transform_state("scaler", lambda: torch.amp.GradScaler("cpu", init_scale=4.0))
    refused(target, {**saved, "transforms": {"scaler": "junk"}}, TypeError, None)  # GradScaler's own error, undone
    assert scaler.get_scale() == 4.0 and target.transform_state("scaler", lambda: None) is scaler
    refused(target, {**saved, "transforms": {3: {}}}, TypeError, r"'transforms'\] must map transform names \(str\)")


@pytest.mark.parametrize("failing", ["optimizer", "scheduler", "model"])
def test_a_write_that_fails_midway_is_undone(monkeypatch, failing):
    """Checks cannot foresee everything (a custom load_state_dict): what was written is restored."""
    saved = copy.deepcopy(trained("adamw", updates=3).state_dict())
    target = trained("adamw", seed=1)
    target.transform_state("scaler", lambda: torch.amp.GradScaler("cpu", init_scale=4.0))
    saved["transforms"] = {"scaler": {**target.state_dict()["transforms"]["scaler"], "scale": 16.0}}
    part = getattr(target, failing)
    real = part.load_state_dict

    def write_then_fail(*args, **kwargs):
        real(*args, **kwargs)
        if not calls:  # once: undoing may reload through the same method
            calls.append(1)
            raise RuntimeError("injected failure after writing")

    calls = []

    monkeypatch.setattr(part, "load_state_dict", write_then_fail)
    before = snapshot(target)
    with pytest.raises(RuntimeError, match="injected failure"):
        target.load_state_dict(saved)
    assert_untouched(target, before)
    assert target.transform_state("scaler", lambda: None).get_scale() == 4.0
    monkeypatch.undo()
    target.load_state_dict(saved)  # nothing was left half-done: the same load now goes through
    assert target.transform_state("scaler", lambda: None).get_scale() == 16.0 and target.step == 3


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_state_dict_round_trips_through_weights_only_loading(optimizer):
    """Only tensors and plain values: torch.load(weights_only=True) runs no code to read a checkpoint."""
    train = ct.mixed_precision(dtype="fp16")(classify)
    a = trained(optimizer, model=mlp(0).float(), updates=3, train=train)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert (
        saved["transforms"]["mixed_precision"]["scaler"]["scale"]
        == a.state_dict()["transforms"]["mixed_precision"]["scaler"]["scale"]
    )
    b = trained(optimizer, model=mlp(5).float(), seed=5, updates=1, train=train)
    b.load_state_dict(saved)
    assert_states_equal(b, a)
    for i in range(2):
        assert torch.equal(
            train(a, make_batch(8, seed=i, dtype=torch.float32)).loss,
            train(b, make_batch(8, seed=i, dtype=torch.float32)).loss,
        )
    assert_states_equal(b, a)
    assert a.state_dict()["transforms"] == b.state_dict()["transforms"]


def test_an_undo_that_fails_too_says_so_and_the_other_parts_are_still_restored(monkeypatch):
    saved = copy.deepcopy(trained("sgd", updates=3).state_dict())
    target = trained("sgd", seed=1)
    real = target.scheduler.load_state_dict

    def write_then_fail(*args, **kwargs):  # fails every time, undoing included
        real(*args, **kwargs)
        raise RuntimeError("injected failure after writing")

    monkeypatch.setattr(target.scheduler, "load_state_dict", write_then_fail)
    before = copy.deepcopy({"model": target.model.state_dict(), "optimizer": target.optimizer.state_dict()})
    pattern = r"loading failed \(RuntimeError\('injected .*undoing it failed too .*partly loaded: rebuild it"
    with pytest.raises(RuntimeError, match=pattern):
        target.load_state_dict(saved)
    for key, value in before["model"].items():
        assert torch.equal(target.model.state_dict()[key], value), key
    now = target.optimizer.state_dict()
    assert now["param_groups"] == before["optimizer"]["param_groups"]
    for index, entries in before["optimizer"]["state"].items():
        assert all(torch.equal(now["state"][index][k], v) for k, v in entries.items())

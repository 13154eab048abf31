"""A model moved to another device type keeps its loss scale and growth tracker (PITFALLS 19's twin: a scale
that restarts at 2**16 overflows again for as many updates as it took to back off).

Every test first moves the scale away from its start (an overflow backs it off) and lets the growth tracker
count, so a scaler that restarted on the new device would show.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import make_batch
from torch import nn

import composetrain as ct
from composetrain.transforms._scaling import LossScaling


def state_of(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))  # no optimizer state to move


def step_poisoned_on(bad):
    """Cross-entropy, multiplied by inf on the given (0-based) calls."""
    calls = []

    def step(model, batch):
        x, y = batch
        device = next(model.parameters()).device
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        calls.append(1)
        return loss * math.inf if len(calls) - 1 in bad else loss

    return step


def scaler_of(state):
    saved = state.state_dict()["transforms"]["mixed_precision"]["scaler"]
    return saved["scale"], saved["_growth_tracker"]


def batch(i):
    return make_batch(12, seed=i, dtype=torch.float32)


def test_the_scale_carries_over_when_the_device_type_changes_on_cpu():
    """The move's own code path, without a GPU: the TrainState's scaler was set up for another device type
    (as after training on a GPU), this update runs on the CPU. The scale and growth tracker must carry over,
    and the updates stay those of one GradScaler run straight through."""
    ours, theirs = state_of(), state_of()
    train = ct.mixed_precision(dtype="fp16")(step_poisoned_on({1, 5}))
    raw = step_poisoned_on({1, 5})
    scaler = torch.amp.GradScaler("cpu")
    for i in range(7):
        if i == 3:  # as if updates 0-2 had run on another device type
            scaling = ours.transform_state("mixed_precision", LossScaling)
            assert scaler_of(ours) == (2.0**15, 1)
            scaling.device = "cuda"
        out = train(ours, batch(i))
        with torch.autocast("cpu", dtype=torch.float16):
            loss = raw(theirs.model, batch(i))
        scaler.scale(loss).backward()
        scaler.step(theirs.optimizer)
        scaler.update()
        theirs.optimizer.zero_grad(set_to_none=True)
        assert out.skipped is (i in {1, 5})
        assert scaler_of(ours) == (scaler.get_scale(), scaler._get_growth_tracker()), i
        for p, q in zip(ours.model.parameters(), theirs.model.parameters(), strict=True):
            assert torch.equal(p, q), i
    assert scaler_of(ours) == (2.0**14, 1)
    assert ours.transform_state("mixed_precision", LossScaling).device == "cpu"


def test_the_scale_survives_a_state_dict_round_trip_of_a_moved_scaler():
    """What the move relies on: a scaler's state_dict loaded into a fresh one gives the same scale and tracker."""
    scaling = LossScaling()
    scaling.configure(("fp16", None), "cpu", "test")
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for poison in (True, False, False):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.ones(4, 3)).float().mean() * (math.inf if poison else 1e-2)
        scaling.scaler.scale(loss).backward()
        scaling.unscale(opt)
        scaling.scaler.step(opt)
        scaling.scaler.update()
        scaling.unscaled = False
        opt.zero_grad(set_to_none=True)
    assert (scaling.scaler.get_scale(), scaling.scaler._get_growth_tracker()) == (2.0**15, 2)
    scaling.device = "elsewhere"  # the next configure() sees a move
    scaling.configure(("fp16", None), "cpu", "test")
    assert (scaling.scaler.get_scale(), scaling.scaler._get_growth_tracker()) == (2.0**15, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_model_moved_between_cpu_and_gpu_keeps_its_backed_off_scale_and_tracker():
    state = state_of()
    train = ct.mixed_precision(dtype="fp16")(step_poisoned_on({0, 4}))
    for i in range(3):  # overflow, then two clean updates, on the CPU
        train(state, batch(i))
    assert scaler_of(state) == (2.0**15, 2)
    state.model.cuda()  # the Parameters move in place: the optimizer (no state) still holds them
    assert train(state, batch(3)).skipped is False
    assert scaler_of(state) == (2.0**15, 3)  # not (2**16, 1): the scaler did not restart
    assert train(state, batch(4)).skipped is True  # an overflow on the GPU backs off from the carried scale
    assert train(state, batch(5)).skipped is False
    assert scaler_of(state) == (2.0**14, 1)
    assert state.transform_state("mixed_precision", LossScaling).device == "cuda"
    state.model.cpu()  # and back
    assert train(state, batch(6)).skipped is False
    assert scaler_of(state) == (2.0**14, 2)
    assert state.transform_state("mixed_precision", LossScaling).device == "cpu"

"""checkpoint_activations on a submodule registered under two names (weight sharing by module).

Found by the adversarial pass: names were looked up in ``model.named_modules()``, which lists a shared
submodule under its first name only, so naming it by its second name was refused as "has no submodule",
and choosing it beside its other parent was not seen as one chosen module inside another.
"""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import composetrain as ct


class DrawingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return x + float(np.random.rand()) * random.random() * self.drop(torch.tanh(self.lin(x)))


class Shared(nn.Module):
    """``block`` is ``stack[0]``: named_modules() lists it as 'stack.0' only."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.stack = nn.Sequential(DrawingBlock())
        self.block = self.stack[0]
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.stack(self.block(self.inp(x))))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def train(modules):
    torch.manual_seed(0)
    model = Shared().double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    g = torch.Generator().manual_seed(1)
    train_step = ct.checkpoint_activations(modules)(step) if modules else ct.accumulate(1)(step)
    random.seed(0)
    np.random.seed(0)
    for _ in range(2):
        batch = (torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))
        train_step(state, batch)
    return model, (random.random(), float(np.random.rand()), float(torch.rand(())))


@pytest.mark.parametrize("modules", ["block", "stack.0", ["block"]])
def test_a_shared_submodule_is_found_by_either_name_and_trains_exactly(modules):
    plain, streams = train(None)
    model, after = train(modules)
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(p, q)
    assert after == streams


@pytest.mark.parametrize("modules", [["stack", "block"], ["block", "stack"]])
def test_a_shared_submodule_inside_another_chosen_one_is_refused(modules):
    model = Shared()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"'block' lies inside 'stack', which is checkpointed whole"):
        ct.checkpoint_activations(modules)(step)(state, (torch.randn(4, 5), torch.randint(0, 3, (4,))))


def test_one_module_chosen_by_both_its_names_is_refused():
    model = Shared()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"submodule 'stack.0' is chosen twice \(as 'block'"):
        ct.checkpoint_activations(["block", "stack.0"])(step)(state, (torch.randn(4, 5), torch.randint(0, 3, (4,))))

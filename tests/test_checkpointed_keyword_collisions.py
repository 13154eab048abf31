"""checkpoint_activations: a chosen module's keyword named like the wrapper's own parameters reaches it.

Found by the adversarial pass: the wrapper put around the chosen module's forward took the module's
forward and the running-statistics keeper as parameters named ``forward`` and ``stats``, so a module
called as ``block(x, stats=...)`` failed with "_run_checkpointed() got multiple values for argument
'stats'", with and without gradients.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import composetrain as ct


class KeywordBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, forward=1.0, stats=1.0, module=1.0):
        return torch.tanh(self.lin(x)) * forward * module + stats


class PassesKeyword(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 4)
        self.block = KeywordBlock()
        self.out = nn.Linear(4, 3)
        self.name = name

    def forward(self, x):
        return self.out(self.block(self.inp(x), **{self.name: 0.5}))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


@pytest.mark.parametrize("name", ["forward", "stats", "module"])
def test_a_keyword_named_like_the_wrappers_parameters_reaches_the_module(name):
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))
    models = []
    for train in (ct.checkpoint_activations("block")(step), ct.accumulate(1)(step)):
        torch.manual_seed(0)
        model = PassesKeyword(name).double()
        train(ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)), batch)
        models.append(model)
    for p, q in zip(*(m.parameters() for m in models), strict=True):
        assert torch.equal(p, q)


def step_with_a_look(model, batch):
    with torch.no_grad():  # the wrapper's path without a checkpoint
        model(batch[0])
    return step(model, batch)


@pytest.mark.parametrize("name", ["forward", "stats", "module"])
def test_the_keyword_reaches_the_module_without_gradients_too(name):
    model = PassesKeyword(name)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ct.checkpoint_activations("block")(step_with_a_look)(state, (torch.randn(4, 5), torch.randint(0, 3, (4,))))

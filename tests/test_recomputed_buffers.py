"""checkpoint_activations: a chosen module that changes a buffer in place and reads it trains exactly.

Found by the adversarial pass: the recomputation changed such a buffer a second time (a step counter
driving a ramp, an exponential average fed back into the output) and computed with the changed value,
so the gradients differed from the plain step's, silently, and the buffer ended changed twice. The
recomputation now starts from the values the buffers held when the original forward started and leaves
the live buffers as the original forward left them. Compared bit for bit in float64 with the plain step.
"""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import Net
from torch import nn

import composetrain as ct


class Ramp(nn.Module):
    """A counter bumped in place scales the residual branch (a warm-up inside the model)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x + torch.tanh(self.lin(x)) * self.calls


class Average(nn.Module):
    """An exponential average of the inputs, updated in place on a random draw and fed back."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.norm = nn.BatchNorm1d(6)
        self.register_buffer("mean", torch.zeros(6))

    def forward(self, x):
        if random.random() < 0.7:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return torch.tanh(self.norm(self.lin(x - self.mean))) * (1 + float(np.random.rand()))


def net(block: type[nn.Module]) -> nn.Module:
    """inp, blocks (two of ``block`` in a Sequential), out."""
    return Net(width=6, blocks=lambda: nn.Sequential(block(), block()))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def train(block, wrap):
    torch.manual_seed(0)
    model = net(block).double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    g = torch.Generator().manual_seed(1)
    random.seed(2)
    np.random.seed(2)
    losses = []
    for _ in range(3):
        batch = (torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))
        losses.append(wrap(step)(state, batch).loss)
    return model.state_dict(), losses, (random.random(), float(np.random.rand()))


@pytest.mark.parametrize("block", [Ramp, Average])
@pytest.mark.parametrize("split", [1, 3])
def test_a_buffer_changed_in_place_and_read_trains_as_the_plain_step(block, split):
    plain = train(block, ct.accumulate(split))
    checkpointed = train(block, lambda s: ct.checkpoint_activations("blocks.0")(ct.accumulate(split)(s)))
    (mine, my_losses, my_streams), (theirs, their_losses, their_streams) = checkpointed, plain
    for key in theirs:
        assert torch.equal(mine[key], theirs[key]), key
    assert all(torch.equal(a, b) for a, b in zip(my_losses, their_losses, strict=True))
    assert my_streams == their_streams


def looks_first(model, batch):
    """Differentiates the loss once itself (retain_graph) before the update's backward: two recomputations."""
    loss = step(model, batch)
    torch.autograd.grad(loss, list(model.blocks.parameters()), retain_graph=True)
    return loss


def test_a_graph_recomputed_twice_starts_from_the_same_buffers_twice():
    plain = train(Ramp, lambda s: ct.train_step(looks_first))
    checkpointed = train(Ramp, lambda s: ct.checkpoint_activations(Ramp)(ct.train_step(looks_first)))
    for key in plain[0]:
        assert torch.equal(checkpointed[0][key], plain[0][key]), key
    assert all(torch.equal(a, b) for a, b in zip(checkpointed[1], plain[1], strict=True))


class Twice(nn.Module):
    """One counter tensor registered on the block and on its layer: changed once per call through either."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6, dtype=torch.float64)  # float64 already: .double() keeps the one tensor
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))
        self.lin.register_buffer("calls", self.calls)

    def forward(self, x):
        self.lin.calls.add_(1)
        return x + torch.tanh(self.lin(x)) * self.calls


def test_the_live_buffers_stay_the_same_tensors_and_one_tensor_registered_twice_stays_one():
    torch.manual_seed(0)
    model = net(Twice).double()
    before = {k: b for k, b in model.named_buffers(remove_duplicate=False)}
    plain = train(Twice, ct.accumulate(1))
    checkpointed = train(Twice, ct.checkpoint_activations(Twice))
    for key in plain[0]:
        assert torch.equal(checkpointed[0][key], plain[0][key]), key
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ct.checkpoint_activations(Twice)(step)(state, (torch.randn(4, 5, dtype=torch.float64), torch.randint(0, 3, (4,))))
    assert all(b is before[k] for k, b in model.named_buffers(remove_duplicate=False))  # references others hold
    assert model.blocks[0].calls is model.blocks[0].lin.calls

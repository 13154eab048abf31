"""accumulate("auto"): what the rollback of a failed attempt must also cover (a buffer it registered, the
gradient of a parameter only the optimizer holds).

Found by the adversarial pass: the rollback kept the buffer tables of the modules that had buffers
before the call only, so a buffer that the failed attempt registered on a module without any (a lazily
built cache) survived into the retry, which then read the failed attempt's value. Compared bit for bit
in float64 with accumulate(n) for the n the automatic size settles on.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import make_batch
from torch import nn

import composetrain as ct


class LazyCache(nn.Module):
    """Registers a buffer on its first forward, on a submodule (or itself) that had none before."""

    def __init__(self, on_root: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.out = nn.Linear(8, 3)
        self.on_root = on_root

    def forward(self, x):
        owner = self if self.on_root else self.inp
        if "first" not in owner._buffers:  # the first forward's input mean, kept for good
            owner.register_buffer("first", x.mean(0).detach().clone())
        return self.out(torch.tanh(self.inp(x)) + owner.first.sum())


def out_of_memory_above(limit):
    def step(model, batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        if x.shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected, {x.shape[0]} samples)")
        return loss

    return step


@pytest.mark.parametrize("on_root", [False, True])
def test_a_buffer_registered_by_a_failed_attempt_is_removed(on_root):
    results = []
    for train in (ct.accumulate("auto")(out_of_memory_above(3)), ct.accumulate(4)(out_of_memory_above(99))):
        torch.manual_seed(0)
        model = LazyCache(on_root).double()
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        for seed in range(2):
            train(state, make_batch(12, seed=seed))
        results.append(model.state_dict())
    auto, split = results
    assert auto.keys() == split.keys()
    for key in split:
        assert torch.equal(auto[key], split[key]), key


def test_the_gradient_of_a_parameter_only_the_optimizer_holds_survives_a_retry():
    """Found by the adversarial pass: the gradients from before the call were kept for the model's
    parameters only, so a parameter the optimizer holds outside the model (a learnable temperature of
    the loss) lost its gradient on a retry, and the update differed from accumulate(n)'s."""
    results = []
    for train, limit in ((ct.accumulate("auto"), 3), (ct.accumulate(4), 99)):
        torch.manual_seed(0)
        model = nn.Linear(5, 3).double()
        temperature = nn.Parameter(torch.ones((), dtype=torch.float64))
        state = ct.TrainState(model, torch.optim.SGD([*model.parameters(), temperature], lr=0.1))
        for p in (*model.parameters(), temperature):
            p.grad = torch.full_like(p, 0.5)

        def step(model, batch, limit=limit, temperature=temperature):
            x, y = batch
            loss = F.cross_entropy(model(x) / temperature, y)
            if x.shape[0] > limit:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return loss

        train(step)(state, make_batch(12))
        results.append([temperature.detach().clone(), *(p.detach().clone() for p in model.parameters())])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_the_gradient_of_a_model_parameter_the_optimizer_does_not_hold_survives_a_retry():
    """A parameter of the model left out of the optimizer keeps its gradient from before the call too:
    the attempt that fits sees it as the first attempt did (a step may read it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    state = ct.TrainState(model, torch.optim.SGD(model[2].parameters(), lr=0.1))  # model[0] not held
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    inner, seen = out_of_memory_above(3), []

    def step(model, batch):
        seen.append(model[0].weight.grad.clone())
        return inner(model, batch)

    ct.accumulate("auto")(step)(state, make_batch(12))
    assert [len(seen), *seen[0].shape] == [6, 8, 5]  # 1 x 12 and 2 x 6 fail in their first pass, then 4 x 3
    for grad in seen[:3]:  # each attempt starts from the gradients the call found
        assert torch.equal(grad, torch.full_like(grad, 0.5))

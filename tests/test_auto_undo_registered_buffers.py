"""accumulate("auto"): a buffer that a failed attempt registers is gone when the retry starts.

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

"""distributed(find_unused_parameters=True)(accumulate("auto")(step)) with a parameter the step never uses:
it stays as it is, with no gradient and no momentum, under SGD with momentum and weight decay, as under
plain distributed. A zero gradient instead of None would let weight decay and momentum move it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import global_batch, shard
from processes import Pool
from torch import nn

import composetrain as ct


@pytest.fixture(scope="module")
def results():
    pool = Pool(2)
    try:
        yield {inner: pool.run(__name__, "train", inner, timeout=120) for inner in ("none", "auto")}
    finally:
        pool.close()


@pytest.mark.parametrize("inner", ["none", "auto"])
def test_an_unused_parameter_keeps_its_value_and_no_gradient(results, inner):
    for r in results[inner]:
        assert r["step"] == 3
        assert r["spare_unchanged"]
        assert r["spare_grads"] == [None, None]
        assert r["spare_momentum"] == [None, None]


def test_the_used_parameters_train_as_under_plain_distributed(results):
    for auto, plain in zip(results["auto"], results["none"], strict=True):
        for p, q in zip(auto["body"], plain["body"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# A parameter the step never uses, under distributed(find_unused_parameters=True) with and without accumulate("auto").


class WithSpare(nn.Module):
    """A classifier with a layer its forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
        self.spare = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def limited(limit: int | None):
    def step(model, batch):
        x, y = batch
        if limit is not None and x.shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected above {limit} samples)")
        return F.cross_entropy(model(x), y)

    return step


def train(rank: int, world: int, inner: str) -> dict[str, Any]:
    """Three updates of distributed(find_unused_parameters=True)(<inner>(step)); rank 1 runs out of memory
    above 3 samples, so accumulate("auto") retries on both ranks."""
    torch.manual_seed(0)
    model = WithSpare().double()
    spare = [p.detach().clone() for p in model.spare.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    state = ct.TrainState(model, opt)
    wrap = ct.accumulate("auto") if inner == "auto" else None
    step = limited(3 if rank == 1 and inner == "auto" else None)
    parts = [ct.distributed(find_unused_parameters=True)] + ([wrap] if wrap is not None else [])
    train_step = ct.compose(*parts)(step)
    for i in range(3):
        train_step(state, shard(global_batch("classify", [6] * world, 40 + i, torch.float64), [6] * world, rank))
    return {
        "spare_unchanged": all(torch.equal(p, q) for p, q in zip(model.spare.parameters(), spare, strict=True)),
        "spare_grads": [p.grad for p in model.spare.parameters()],
        "spare_momentum": [opt.state[p].get("momentum_buffer") for p in model.spare.parameters()],
        "body": [p.detach().clone() for p in model.body.parameters()],
        "step": state.step,
    }

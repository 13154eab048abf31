"""What ct.full_state_dict returns for a sharded model is a snapshot, not a view of the live model."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import composetrain as ct


def test_full_state_dict_does_not_change_when_training_goes_on(pool):
    """0-dim parameters (kept whole beside FSDP2's shards) and buffers were returned as the live tensors
    themselves: the exported weights kept changing as training went on."""
    first, other = pool.run(__name__, "full_state_dict_is_a_copy")
    assert first["keys"] == [
        "blocks.0.bias",
        "blocks.0.weight",
        "blocks.1.bias",
        "blocks.1.weight",
        "logit_scale",
        "seen",
    ]
    assert first["changed_since"] == [], first
    assert first["trained_on"] == first["keys"]  # the second update did change every one of them
    assert other == {"keys": [], "changed_since": [], "trained_on": []}  # rank 0 gets the tensors


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------


class Scaled(nn.Module):
    """A block (a sharding unit), CLIP's 0-dim logit_scale (kept whole) and a 0-dim buffer counting forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 2)])
        self.logit_scale = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))
        self.register_buffer("seen", torch.tensor(0.0, dtype=torch.float64))

    def forward(self, x):
        self.seen += 1
        return self.blocks[1](self.blocks[0](x).tanh()) * self.logit_scale


def full_state_dict_is_a_copy(rank: int, world: int) -> dict[str, Any]:
    """ct.full_state_dict taken after one update, then a second update: the dict must still hold the
    first update's values (an export is a snapshot, as it is for a model that is not sharded)."""
    torch.manual_seed(0)
    model = Scaled().double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    train = ct.sharded(ct.train_step(lambda m, b: m(b).pow(2).mean()))
    train(state, torch.ones(2, 4, dtype=torch.float64))
    taken = ct.full_state_dict(state.model)
    kept = {k: v.clone() for k, v in taken.items()}
    train(state, torch.ones(2, 4, dtype=torch.float64) * 3)
    now = ct.full_state_dict(state.model)
    return {
        "keys": sorted(taken),
        "changed_since": sorted(k for k in taken if not torch.equal(taken[k], kept[k])),
        "trained_on": sorted(k for k in now if not torch.equal(now[k], kept[k])),
    }

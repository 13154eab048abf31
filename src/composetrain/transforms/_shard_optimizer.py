"""Optimizer state that sharding can carry over: only what the optimizer's ``__init__`` makes (internal).

Sharding replaces the model's parameters, so optimizer state keyed by the old ones would be lost.
Most optimizers hold none before their first step; a few (Adagrad: its sums and step 0) make it in
``__init__``. That state is recognised by building the same optimizer again and comparing, and is
made again for the sharded parameters, as an optimizer built after ``fully_shard`` would hold it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["only_initial_state", "remake_initial_state"]


def remake_initial_state(optimizer: torch.optim.Optimizer) -> None:
    """Replace the optimizer's state by what its ``__init__`` makes for its (new) parameters."""
    remade = _rebuilt(optimizer)
    optimizer.state.clear()
    optimizer.state.update(remade.state)


def _rebuilt(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A new optimizer of the same class, settings and groups over the same parameters: the state its
    ``__init__`` makes."""
    groups = [dict(g) for g in optimizer.param_groups]
    return type(optimizer)(groups, **optimizer.defaults)


def only_initial_state(step: object, optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer holds state, all of it what its ``__init__`` made (Adagrad's sums and step 0),
    which sharding makes again for the sharded parameters; a ValueError if it holds any other state."""
    if not optimizer.state:
        return False
    fresh: Mapping[Any, Any] = {}  # an optimizer whose settings do not rebuild it: compared with nothing
    with contextlib.suppress(Exception):
        fresh = _rebuilt(optimizer).state
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if all(_same(optimizer.state.get(p, {}), fresh.get(p, {})) for p in params):
        return True
    raise ValueError(
        f"{step!r}: the optimizer already holds state (momentum, moments) for {len(optimizer.state)} unsharded "
        "parameter(s); sharding replaces the parameters, so that state would be lost: build the TrainState on a "
        "fresh optimizer, and resume through ct.run (or ct.apply_sharding, then TrainState.load_state_dict), "
        "which shards before loading (the state an optimizer's __init__ makes, such as Adagrad's, is fine: "
        "sharding makes it again for the shards)"
    )


def _same(a: Any, b: Any) -> bool:
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if isinstance(v, torch.Tensor) or isinstance(w, torch.Tensor):
            if not (isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor)):
                return False
            if v.dtype != w.dtype or v.shape != w.shape or not torch.equal(v, w):
                return False
        elif v != w:
            return False
    return True

"""ct.ema under ct.distributed and ct.sharded, run on every rank of a processes.Pool, and the one-process reference.

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

import copy
from typing import Any

import distributed_workers as dw
import sharded_workers
import torch
from torch.distributed.tensor import DTensor

import composetrain as ct

SIZES, UPDATES = [4, 4], 4


def averages(state: ct.TrainState) -> dict[str, torch.Tensor]:
    return state.state_dict()["transforms"]["ema"]["averages"]


def train(kind: str, rank: int | None) -> dict[str, Any]:
    """``kind``: "distributed", "ema outside sharded" or "ema inside sharded"; rank None: one process, whole batches."""
    state = sharded_workers.make_state("classify", 4 + (rank or 0), torch.float64)  # rank 0's weights win
    wrap = {
        "distributed": lambda s: ct.ema(0.6, every=2)(ct.distributed(s)),
        "ema outside sharded": lambda s: ct.ema(0.6, every=2)(ct.sharded(s)),
        "ema inside sharded": lambda s: ct.sharded(ct.ema(0.6, every=2)(s)),
    }[kind]
    step = ct.ema(0.6, every=2)(dw.classify) if rank is None else wrap(dw.classify)
    for i in range(UPDATES):
        batch = dw.global_batch("classify", SIZES, 50 + i, torch.float64)
        step(state, batch if rank is None else dw.shard(batch, SIZES, rank))
    found = averages(state)
    out: dict[str, Any] = {
        "kinds": sorted({type(a).__name__ for a in found.values()}),
        "n_averaged": state.state_dict()["transforms"]["ema"]["n_averaged"],
        "ema": {k: v.state_dict() for k, v in [("m", ct.ema_model(state, into=sharded_workers.Net().double()))]}["m"],
    }
    if rank is not None and "sharded" in kind:
        out["refused"] = _refused(state)
        out["resumed"] = _resumed(state, step, rank)
    return out


def _refused(state: ct.TrainState) -> str:
    try:
        ct.ema_model(state)
    except ValueError as e:
        return str(e)
    return ""


def _resumed(state: ct.TrainState, step: ct.TrainStep, rank: int) -> bool:
    """A sharded state's EMA through state_dict into another sharded state, and whole averages loaded into its
    shards, continue bit for bit."""
    saved = copy.deepcopy(state.state_dict())
    other = sharded_workers.make_state("classify", 4, torch.float64)
    batch = dw.shard(dw.global_batch("classify", SIZES, 99, torch.float64), SIZES, rank)
    step(other, batch)  # sharded now, with averages of its own
    other.load_state_dict(saved)
    whole = {k: v.full_tensor() for k, v in saved["transforms"]["ema"]["averages"].items()}
    live = other.transform_state("ema", lambda: None)
    live.load_state_dict({"averages": whole, "n_averaged": saved["transforms"]["ema"]["n_averaged"]})
    for s in (state, other):
        step(s, batch)
    return all(
        isinstance(b, DTensor) and torch.equal(a.to_local(), b.to_local())
        for a, b in zip(averages(state).values(), averages(other).values(), strict=True)
    )


def run_case(rank: int, world: int, kind: str) -> dict[str, Any]:
    return train(kind, rank)

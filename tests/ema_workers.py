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


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    model = sharded_workers.Net().double()
    model.inp = torch.nn.Linear(6, 8).double()  # run_script's data has 6 features
    return model


def _run_state() -> ct.TrainState:
    """The recipe's per-epoch warmup + cosine (3 epochs of 4 updates)."""
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)
    schedule = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[1])
    return ct.TrainState(model, opt, schedule, scheduler_interval="epoch")


def _evaluate(model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    x, y = batch
    return {"loss": torch.nn.functional.cross_entropy(model(x), y)}


def run_resumed(rank: int, world: int, kind: str, folder: str) -> dict[str, Any]:
    """ct.run straight through, and stopped mid-epoch (max_steps) then resumed from its checkpoint, on two ranks:
    the scheduler's position, the gathered averages and the evaluations, for both."""
    import run_script

    wrap = ct.distributed if kind == "distributed" else ct.sharded
    step = ct.ema(0.7, every=2, warmup=2)(wrap(run_script.step))
    evals = {"eval_step": _evaluate, "eval_data": run_script.dataset(20)} if kind == "distributed" else {}
    args = dict(batch_size=12, epochs=3, num_workers=0, progress=False, seed=2, **evals)
    found = []
    for stops in ([None], [6, None]):
        for stop in stops:
            state = _run_state()
            where = f"{folder}/{kind}-{len(stops)}"
            result = ct.run(step, state, run_script.dataset(), max_steps=stop, checkpoint_dir=where, **args)
        found.append(
            {
                "scheduler": state.scheduler.state_dict(),
                "ema": ct.ema_model(state, into=_net()).state_dict(),
                "evals": result.evals,
            }
        )
    return {"straight": found[0], "resumed": found[1]}


def run_disagreeing(rank: int, world: int, kind: str) -> str:
    """ct.run on two ranks whose ct.ema differ in decay (a rank-dependent config): the refusal every rank gives."""
    import run_script

    wrap = ct.distributed if kind == "distributed" else ct.sharded
    state = _run_state()
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    try:
        ct.run(
            ct.ema([0.9, 0.95][rank])(wrap(run_script.step)),
            state,
            run_script.dataset(),
            batch_size=12,
            epochs=1,
            num_workers=0,
            progress=False,
        )
    except ValueError as e:
        return str(e) if state.step == 0 and _same(before, state) else f"changed: {e}"
    return "ran"


def _same(before: dict[str, torch.Tensor], state: ct.TrainState) -> bool:
    after = ct.ema_model(state, into=_net()).state_dict()  # gathered whole under sharded
    return all(torch.equal(after[k], v) for k, v in before.items())


def _bn_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
    ).double()


def run_batchnorm(rank: int, world: int) -> dict[str, torch.Tensor]:
    """A BatchNorm model under distributed through ct.run: this rank's averages."""
    import run_script

    model = _bn_net()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05))
    ct.run(
        ct.ema(0.7)(ct.distributed(run_script.step)),
        state,
        run_script.dataset(48),
        batch_size=12,
        epochs=1,
        num_workers=0,
        progress=False,
    )
    return averages(state)


def run_ema_on_one_rank(rank: int, world: int) -> str:
    """ct.run on two ranks where only rank 0 composes ct.ema."""
    import run_script

    step = ct.distributed(run_script.step)
    if rank == 0:
        step = ct.ema(0.9)(step)
    try:
        ct.run(
            step, _run_state(), run_script.dataset(), batch_size=12, epochs=1, num_workers=0, progress=False, timeout=20
        )
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "ran"

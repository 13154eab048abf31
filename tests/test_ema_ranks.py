"""ct.ema on two gloo ranks: the same average on every rank under distributed, an average of the shards under
sharded (DTensors, gathered whole by ct.ema_model, checkpointed), both the one-process average on the whole batch."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers import classify_acc, global_batch, shard, sharded_net, sharded_state
from torch.distributed.tensor import DTensor

import composetrain as ct


@pytest.mark.parametrize("kind", ["distributed", "ema outside sharded", "ema inside sharded"])
def test_the_average_over_ranks_is_the_one_process_average(pool, kind):
    ranks = pool.run(__name__, "run_case", kind)
    one = train(kind, None)
    for got in ranks:
        assert got["n_averaged"] == one["n_averaged"] == 2
        assert got["kinds"] == (["DTensor"] if "sharded" in kind else ["Tensor"])
        for k, v in one["ema"].items():
            torch.testing.assert_close(got["ema"][k], v, rtol=1e-12, atol=1e-14, msg=k)
    for k, v in ranks[0]["ema"].items():
        assert torch.equal(ranks[1]["ema"][k], v), k  # every rank the same
    if "sharded" in kind:
        assert all(
            "ema_model: the averages are sharded (ct.sharded); give a plain model" in r["refused"] for r in ranks
        )
        assert all(r["resumed"] for r in ranks)


@pytest.mark.parametrize("kind", ["distributed", "sharded"])
def test_ct_run_resumed_mid_epoch_on_two_ranks_ends_with_the_same_average_and_schedule(pool, tmp_path, kind):
    for got in pool.run(__name__, "run_resumed", kind, str(tmp_path)):
        straight, resumed = got["straight"], got["resumed"]
        assert straight["scheduler"] == resumed["scheduler"] and straight["scheduler"]["last_epoch"] == 3
        for k, v in straight["ema"].items():
            assert torch.equal(resumed["ema"][k], v), k
        assert resumed["evals"] == straight["evals"]
        if kind == "distributed":
            assert [set(e["eval_ema"]) for e in straight["evals"]] == [{"loss"}] * 3


@pytest.mark.parametrize("kind", ["distributed", "sharded"])
def test_ranks_that_average_differently_are_refused_by_ct_run_before_the_first_update(pool, kind):
    """Each rank would keep its own average (the checkpoint rank 0's, an evaluation their mean), silently."""
    for got in pool.run(__name__, "run_disagreeing", kind):
        assert "the ranks' ct.ema differ: rank 0 ema(0.9), rank 1 ema(0.95)" in got, got


def test_under_distributed_batchnorm_statistics_are_averaged_per_rank_as_documented(pool):
    """DDP broadcasts rank 0's buffers at each forward, which then updates them from the rank's own batch: the
    averages of the parameters are the same on every rank, those of BatchNorm's running statistics each rank's own
    (a checkpoint keeps rank 0's; README Known limits, ct.ema's docstring)."""
    ranks = pool.run(__name__, "run_batchnorm")
    for k, v in ranks[0].items():
        assert torch.equal(ranks[1][k], v) == (k not in ("1.running_mean", "1.running_var")), k


def test_ct_ema_on_one_rank_only_is_refused_on_every_rank_before_the_setup(pool):
    """Was: rank 0's agreement collective met rank 1's next one: a 60 s gloo timeout, then unclear errors."""
    for got in pool.run(__name__, "run_ema_on_one_rank", timeout=60):
        assert "run: the ranks' train steps apply different transforms: rank 0 ['distributed', 'ema'], rank 1 " in got


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.ema under ct.distributed and ct.sharded on every rank, and the one-process reference.


SIZES, UPDATES = [4, 4], 4


def averages(state: ct.TrainState) -> dict[str, torch.Tensor]:
    return state.state_dict()["transforms"]["ema"]["averages"]


def train(kind: str, rank: int | None) -> dict[str, Any]:
    """``kind``: "distributed", "ema outside sharded" or "ema inside sharded"; rank None: one process, whole batches."""
    state = sharded_state("classify", 4 + (rank or 0), torch.float64)  # rank 0's weights win
    wrap = {
        "distributed": lambda s: ct.ema(0.6, every=2)(ct.distributed(s)),
        "ema outside sharded": lambda s: ct.ema(0.6, every=2)(ct.sharded(s)),
        "ema inside sharded": lambda s: ct.sharded(ct.ema(0.6, every=2)(s)),
    }[kind]
    step = ct.ema(0.6, every=2)(classify_acc) if rank is None else wrap(classify_acc)
    for i in range(UPDATES):
        batch = global_batch("classify", SIZES, 50 + i, torch.float64)
        step(state, batch if rank is None else shard(batch, SIZES, rank))
    found = averages(state)
    out: dict[str, Any] = {
        "kinds": sorted({type(a).__name__ for a in found.values()}),
        "n_averaged": state.state_dict()["transforms"]["ema"]["n_averaged"],
        "ema": {k: v.state_dict() for k, v in [("m", ct.ema_model(state, into=sharded_net().double()))]}["m"],
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
    other = sharded_state("classify", 4, torch.float64)
    batch = shard(global_batch("classify", SIZES, 99, torch.float64), SIZES, rank)
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
    model = sharded_net().double()
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

"""ct.compile under ct.distributed, run on every rank of a processes.Pool (see distributed_workers.py)."""

from __future__ import annotations

from typing import Any

import torch
from distributed_workers import classify, global_batch, make_state, shard

import composetrain as ct


def count_syncs(rank: int, world: int, n: int, updates: int, outside: bool, bucket_mb: float = 1.0) -> dict[str, Any]:
    """All-reduces per update (a counting DDP communication hook) of a compiled composition, and
    its parameters after the updates, to compare with the eager composition's on one process."""
    from torch._dynamo.utils import counters
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch._dynamo.reset()
    counters.clear()
    calls: list[int] = []

    def counting(state, bucket):  # unannotated: DDP checks hook annotations against its own types
        calls.append(1)
        return allreduce_hook(state, bucket)

    state = make_state("classify", 0, torch.float64)
    compiled = ct.compile(backend="aot_eager")
    distributed = ct.distributed(bucket_cap_mb=bucket_mb, comm_hook=counting)
    inner = ct.accumulate(n)(classify)
    step = compiled(distributed(inner)) if outside else distributed(compiled(inner))
    per_update = []
    for i in range(updates):
        before = len(calls)
        step(state, shard(global_batch("classify", [8] * world, i, torch.float64), [8] * world, rank))
        per_update.append(len(calls) - before)
    params = [p.detach().clone() for p in state.model.parameters()]
    torch._dynamo.reset()
    return {"syncs": per_update, "params": params, "graphs": counters["stats"]["unique_graphs"]}


def refused_small_buckets(rank: int, world: int) -> list[str]:
    """What compile inside, then outside, distributed with too small buckets says."""
    said = []
    for outside in (False, True):
        try:
            count_syncs(rank, world, 2, 1, outside, bucket_mb=1e-6)
            said.append("not refused")
        except ValueError as e:
            said.append(str(e))
    return said


def compiled_run(rank: int, world: int) -> list[dict[str, Any]]:
    """ct.run of a compiled distributed composition on every rank: its records."""
    import run_script

    torch._dynamo.reset()
    train = ct.distributed(ct.compile(backend="aot_eager")(ct.accumulate(2)(run_script.step)))
    result = ct.run(
        train,
        run_script.state(),
        run_script.dataset(),
        batch_size=12,
        epochs=1,
        num_workers=0,
        progress=False,
        log_every=2,
    )
    torch._dynamo.reset()
    return result.history

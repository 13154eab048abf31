"""distributed(mixed_precision(...)) under torch.set_default_dtype(torch.float64), on every rank of a processes.Pool.

Rank None runs the reference: the same composition without distributed, in one process, on the global batches,
split into the same micro-batches as the ranks'.

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

from typing import Any

import torch
from distributed_workers import classify, global_batch, make_state, shard

import composetrain as ct

CASES = {  # name: (precision, parameter dtype, accumulate: n or "auto", step's OOM limit on rank 1)
    "bf16-fp32-weights": ("bf16", torch.float32, 2, None),
    "fp16-fp32-weights": ("fp16", torch.float32, 2, None),
    "bf16-fp64-weights-auto": ("bf16", torch.float64, "auto", 3),
}
SIZES = [[6, 6]] * 3  # micro-batches of 3 on the ranks, and in the reference


def limited(limit: int | None):
    def step(model, batch):
        if limit is not None and batch[0].shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected above {limit} samples)")
        return classify(model, batch)

    return step


def train_float64_default(rank: int | None, world: int) -> dict[str, Any]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        results = {}
        for name, (precision, dtype, n, limit) in CASES.items():
            state = make_state("classify", 7 + (rank or 0), dtype)
            # the reference splits the global batch into the ranks' micro-batches: only the sums' order differs
            inner = ct.accumulate(n if rank is not None else 2 * world)
            parts = [ct.clip_grad_norm(0.5), ct.mixed_precision(dtype=precision), inner]
            plain = limited(limit if rank == 1 else None)
            step = ct.compose(ct.distributed, *parts)(plain) if rank is not None else ct.compose(*parts)(plain)
            start = [p.detach().clone() for p in state.model.parameters()]  # rank 0's: DDP broadcasts them
            skipped = []
            for i, sizes in enumerate(SIZES):
                batch = global_batch("classify", sizes, 50 + i, dtype)
                out = step(state, batch if rank is None else shard(batch, sizes, rank))
                skipped.append(bool(out.skipped))
            params = [p.detach().clone() for p in state.model.parameters()]
            results[name] = {"start": start, "params": params, "skipped": skipped}
        return results
    finally:
        torch.set_default_dtype(previous)

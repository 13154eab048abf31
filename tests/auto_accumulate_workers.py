"""accumulate("auto") and checkpoint_activations on every rank of a processes.Pool, with references.

Out-of-memory errors are injected: the step raises ``torch.OutOfMemoryError`` when its
micro-batch holds more samples than this rank's limit, so one rank can fail alone.

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from distributed_workers import global_batch, make_state, shard
from helpers import composed, without
from torch import nn

import composetrain as ct


def limited(limit: int | None, seen: list[int] | None = None):
    """A classification step that runs out of memory above ``limit`` samples (and records the sizes it got)."""

    def step(model, batch):
        x, y = batch
        if seen is not None:
            seen.append(x.shape[0])
        if limit is not None and x.shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected above {limit} samples)")
        logits = model(x)
        return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).to(logits.dtype).mean()}

    return step


def build(printed: str, step, **distributed_options: Any) -> ct.TrainStep:
    """The composition ``printed`` (as the step prints: ``"distributed(accumulate('auto')(step))"``)."""
    parts = {
        "distributed": ct.distributed(**distributed_options),
        "mixed_precision(dtype='bf16')": ct.mixed_precision(dtype="bf16"),
        "accumulate('auto')": ct.accumulate("auto"),
        "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
        "checkpoint_activations('0')": ct.checkpoint_activations("0"),
        "accumulate(2)": ct.accumulate(2),
    }
    return composed(printed, parts, step)


def train_auto(rank: int | None, world: int, case: dict[str, Any]) -> dict[str, Any]:
    """The case's updates; rank None runs the reference: the composition without distributed,
    accumulate('auto') and the limits,
    in one process on the global batches."""
    dtype = torch.float32 if "mixed_precision" in case["composition"] else torch.float64
    printed = case["composition"]
    if rank is None:
        printed = without(printed, "distributed", "accumulate('auto')")
    state = make_state("classify", case["seed"] + (rank or 0), dtype)
    seen: list[int] = []
    limit = case["limits"][rank] if rank is not None else None
    step = build(printed, limited(limit, seen), **case.get("options", {}))
    losses, micro = [], []
    for i, sizes in enumerate(case["sizes"]):
        batch = global_batch("classify", sizes, case["seed"] * 100 + i, dtype)
        out = step(state, batch if rank is None else shard(batch, sizes, rank))
        losses.append(out.loss)
        micro.append(out.metrics.get("micro_batch"))
    return {
        "params": [p.detach().clone() for p in state.model.parameters()],
        "losses": losses,
        "micro": micro,
        "seen": seen,
        "step": state.step,
        "saved": state.state_dict()["transforms"].get("accumulate_auto"),
    }


def run_auto(rank: int, world: int, case: dict[str, Any]) -> dict[str, Any]:
    return train_auto(rank, world, case)


def hopeless(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 cannot fit one sample: every rank raises, with its state untouched, and the ranks stay usable."""
    state = make_state("classify", 0, torch.float64)
    before = [p.detach().clone() for p in state.model.parameters()]
    step = build("distributed(accumulate('auto')(step))", limited(0 if rank == 1 else None))
    batch = shard(global_batch("classify", [4] * world, 0, torch.float64), [4] * world, rank)
    try:
        step(state, batch)
        error = None
    except torch.OutOfMemoryError as caught:
        error = str(caught)
    untouched = all(torch.equal(p, q) for p, q in zip(state.model.parameters(), before, strict=True))
    grads = [p.grad for p in state.model.parameters()]
    # the ranks are still in step: a normal update afterwards works and agrees
    build("distributed(accumulate('auto')(step))", limited(None))(state, batch)
    after = [p.detach().clone() for p in state.model.parameters()]
    return {"error": error, "untouched": untouched, "grads": grads, "after": after, "step": state.step}


def count_syncs_auto(rank: int, world: int, limits: list[int], updates: int) -> list[int]:
    """Gradient all-reduces per update through a counting DDP communication hook, one bucket per parameter."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls: list[int] = []

    def counting(state, bucket):  # unannotated: DDP checks hook annotations against its own types
        calls.append(1)
        return allreduce_hook(state, bucket)

    state = make_state("classify", 0, torch.float64)
    step = build("distributed(accumulate('auto')(step))", limited(limits[rank]), bucket_cap_mb=1e-6, comm_hook=counting)
    per_update = []
    for i in range(updates):
        before = len(calls)
        step(state, shard(global_batch("classify", [8] * world, i, torch.float64), [8] * world, rank))
        per_update.append(len(calls) - before)
    return per_update


def checkpointed(rank: int, world: int, printed: str, seed: int) -> list[torch.Tensor]:
    """A dropout model trained by the composition ``printed`` (with or without checkpoint_activations),
    three updates: final parameters."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.3), nn.Tanh()), nn.Linear(8, 3)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = ct.TrainState(model, opt)
    step = build(printed, limited(None))
    torch.manual_seed(100 + rank)  # distinct dropout per rank, the same with and without checkpointing
    for i in range(3):
        step(state, shard(global_batch("classify", [6] * world, i, torch.float64), [6] * world, rank))
    return [p.detach().clone() for p in model.parameters()]

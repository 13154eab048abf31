"""Evaluation for ct.run: no grad, eval mode, exact means over the eval data, reduced over ranks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from composetrain._util import show
from composetrain.batching import leading_size
from composetrain.data import to_device
from composetrain.rendezvous import Process

__all__ = ["EvalStep", "evaluator"]

EvalStep = Callable[[torch.nn.Module, Any], Mapping[str, Any]]


def evaluator(
    eval_step: EvalStep | None,
    eval_data: Any,
    *,
    batch_size: int | None,
    collate_fn: Any,
    num_workers: int,
    proc: Process,
    who: str,
) -> Callable[[torch.nn.Module], dict[str, float]] | None:
    """``evaluate(model) -> {name: mean}``: ``eval_step``'s batch means, weighted by batch size,
    over all of ``eval_data`` (each rank a disjoint, unpadded share); None without eval data."""
    if eval_step is None and eval_data is None:
        return None
    if eval_step is None or eval_data is None:
        raise ValueError(f"{who}: give eval_step and eval_data together")
    if isinstance(eval_data, DataLoader):
        loader = eval_data
    else:
        if batch_size is None:
            raise ValueError(f"{who}: batch_size is required when eval_data is a Dataset")
        if len(eval_data) < proc.world_size:
            raise ValueError(
                f"{who}: eval_data has {len(eval_data)} samples for {proc.world_size} processes; every "
                "process needs at least one"
            )
        shard = Subset(eval_data, range(proc.rank, len(eval_data), proc.world_size))
        loader = DataLoader(
            shard,
            batch_size=batch_size,
            collate_fn=collate_fn,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            pin_memory=proc.device.type == "cuda",
            generator=torch.Generator().manual_seed(proc.rank),  # never the global one: resume stays exact
        )

    @torch.no_grad()
    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        try:
            for batch in loader:
                batch = to_device(batch, proc.device)
                metrics = eval_step(model, batch)
                if not isinstance(metrics, Mapping):
                    raise TypeError(f"{who}: eval_step must return a mapping of names to scalars, got {show(metrics)}")
                n = leading_size(batch) or 1
                for k, v in metrics.items():
                    value = torch.as_tensor(v, dtype=torch.float64, device=proc.device).reshape(()) * n
                    sums[k] = sums[k] + value if k in sums else value
                count += n
        finally:
            model.train(was_training)
        names = sorted(sums)
        totals = torch.stack(
            [*(sums[k] for k in names), torch.tensor(float(count), dtype=torch.float64, device=proc.device)]
        )
        if proc.world_size > 1:
            dist.all_reduce(totals)
        values = totals.tolist()
        return {k: v / values[-1] for k, v in zip(names, values[:-1], strict=True)}

    return evaluate

"""Evaluation for ct.run: no grad, eval mode, exact means over the eval data, reduced over ranks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from composetrain.core.batching import leading_size, to_device
from composetrain.core.util import RUN, show
from composetrain.driver.monitor import EVAL_FIELDS, metric_names
from composetrain.driver.options import EvalOptions
from composetrain.driver.reader import Reader, indexable, worker_loader
from composetrain.launch.rendezvous import Process

__all__ = ["EvalStep", "Evaluate", "evaluator"]

EvalStep = Callable[[torch.nn.Module, Any], Mapping[str, Any]]


class Evaluate:
    """``evaluate(model) -> {name: mean}``; ``close()`` stops the workers of the eval loader ct.run built."""

    def __init__(self, run: Callable[[torch.nn.Module], dict[str, float]], readers: list[Reader]) -> None:
        self.run, self.readers = run, readers

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        return self.run(model)

    def close(self) -> None:
        for reader in self.readers:
            reader.close()


def evaluator(
    options: EvalOptions,
    *,
    batch_size: int | Callable[[], int] | None,
    collate_fn: Any,
    num_workers: Callable[[], int],
    proc: Process,
) -> Evaluate | None:
    """``evaluate(model) -> {name: mean}``: ``eval_step``'s batch means, weighted by batch size,
    over all of ``eval_data`` (each rank a disjoint, unpadded share); None without eval_step (the
    options, checked when built, hold both or neither). ``batch_size`` (of a Dataset's batches) may be a
    function, read at the first evaluation."""
    if not options.enabled:
        return None
    eval_step, eval_data = options.eval_step, options.eval_data
    assert eval_step is not None and eval_data is not None  # for the type checker: EvalOptions holds both
    loader: DataLoader[Any] | None = None  # a DataLoader given as is, or ct.run's own, built when first used
    built: list[Reader] = []
    if isinstance(eval_data, DataLoader):
        loader = eval_data
    else:
        if batch_size is None:
            raise ValueError(f"{RUN}: batch_size is required when eval_data is a Dataset")
        if len(eval_data) < proc.world_size:
            raise ValueError(
                f"{RUN}: eval_data has {len(eval_data)} samples for {proc.world_size} processes; every "
                "process needs at least one"
            )
        mine = range(proc.rank, len(eval_data), proc.world_size)  # a disjoint, unpadded share per rank

        workers = functools.partial(
            worker_loader,
            dataset=eval_data,
            sampler=mine,
            drop_last=False,
            collate_fn=collate_fn,
            pin_memory=proc.device.type == "cuda",
            seed=proc.rank,  # its own generator, never the global one: resume stays exact
        )

        def loader_now() -> Reader:
            """Built at the first evaluation, when the training loader's "auto" has chosen: a TensorDataset
            is indexed a whole batch at a time in this process, others read by as many workers as training's."""
            if not built:
                n = 0 if indexable(eval_data, collate_fn) else num_workers()
                size = batch_size() if callable(batch_size) else batch_size
                assert size is not None  # for the type checker: refused above
                read = functools.partial(workers, batch_size=size)
                built.append(Reader(eval_data, mine, size, False, collate_fn, n, read, 0))
            return built[0]

    @torch.no_grad()
    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        modes = [(m, m.training) for m in model.modules()]  # each submodule's own: a frozen BatchNorm stays so
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        count, failure = 0, None
        try:
            for i, batch in enumerate(loader if loader is not None else loader_now()):
                metrics = _checked(eval_step(model, to_device(batch, proc.device)), sums, i, proc.device)
                n = leading_size(batch) or 1
                for k, v in metrics.items():
                    sums[k] = sums[k] + v * n if k in sums else v * n
                count += n
            if count == 0:
                raise ValueError(f"{RUN}: eval_data gave rank {proc.rank} no batch; give every process some eval data")
        except Exception as e:  # agreed below first: the other ranks must not wait for this one forever
            failure = e
        finally:
            for module, training in modes:
                module.training = training
        names = sorted(sums)
        _agree(proc, names, failure)
        totals = torch.stack(
            [*(sums[k] for k in names), torch.tensor(float(count), dtype=torch.float64, device=proc.device)]
        )
        if proc.world_size > 1:
            dist.all_reduce(totals)
        values = totals.tolist()
        return {k: v / values[-1] for k, v in zip(names, values[:-1], strict=True)}

    return Evaluate(evaluate, built)


def _checked(metrics: Any, seen: Mapping[str, Any], index: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One batch's metrics as float64 scalars, with the names of the batches before it (a metric
    missing from some batches has no exact mean over the eval data)."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{RUN}: eval_step must return a mapping of names to scalars, got {show(metrics)}")
    metrics = metric_names(metrics, EVAL_FIELDS, "eval_step")  # plain str, none of the record's own fields
    if index > 0 and metrics.keys() != seen.keys():
        extra, missing = sorted(metrics.keys() - seen.keys()), sorted(seen.keys() - metrics.keys())
        name, where, where_not = (extra[0], index + 1, 1) if extra else (missing[0], 1, index + 1)
        raise ValueError(
            f"{RUN}: eval_step returned metric {name!r} for batch {where} but not for batch {where_not} (metrics "
            f"{sorted(metrics)} against {sorted(seen)}); return the same metric names for every batch"
        )
    values = {}
    for k, v in metrics.items():
        if isinstance(v, complex) or (v.is_complex() if isinstance(v, torch.Tensor) else _kind(v) == "c"):
            raise TypeError(
                f"{RUN}: eval_step's metric {k!r} is complex ({show(v)} for batch {index + 1}); a logged metric is "
                f"a real number: return {k!r}: z.abs(), or z.real and z.imag as two metrics"
            )
        try:
            value = torch.as_tensor(v, dtype=torch.float64, device=device)
        except (TypeError, ValueError, RuntimeError, OverflowError):  # an int past float64's range
            value = None
        if value is None or value.numel() != 1:
            got = f"shape {tuple(value.shape)}" if value is not None else show(v)
            raise ValueError(
                f"{RUN}: eval_step's metric {k!r} must be a scalar (the batch mean), got {got} for batch "
                f"{index + 1}; reduce it, e.g. (pred == y).double().mean()"
            )
        values[k] = value.reshape(())
    return values


def _kind(value: Any) -> str | None:
    """A NumPy array's or scalar's dtype kind ("c": complex), None for anything else."""
    return getattr(getattr(value, "dtype", None), "kind", None)


def _agree(proc: Process, names: list[str], failure: Exception | None) -> None:
    """Raise on every rank together, or on none: an evaluation that failed on some rank, or metric
    names that differ between ranks (their sums could not be added up name by name)."""
    everyone = proc.differing((names, None if failure is None else f"{type(failure).__name__}: {failure}"))
    if failure is not None:
        raise failure  # this rank's own error, as it was
    if everyone is None:
        return
    failed = [(rank, problem) for rank, (_, problem) in enumerate(everyone) if problem is not None]
    if failed:
        rank, problem = failed[0]
        raise RuntimeError(f"{RUN}: evaluation failed on rank {rank}: {problem}")
    listing = "; ".join(f"rank {rank}: {theirs}" for rank, (theirs, _) in enumerate(everyone))
    raise ValueError(
        f"{RUN}: eval_step returned different metric names on different ranks ({listing}); return the same "
        "names on every rank"
    )

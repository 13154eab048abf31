"""ct.run's argument checks (internal): every option validated before anything starts, and none
silently ignored."""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Any

from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from composetrain.core.state import TrainState
from composetrain.core.util import check_int, check_real, show

__all__ = ["check_arguments", "loader_options"]


def check_arguments(state: Any, who: str, **options: Any) -> None:
    """Refuse, naming the argument and the fix, any of ``ct.run``'s options that is malformed or would be
    ignored (checkpoint_every without checkpoint_dir, eval_every without eval_step)."""
    if not isinstance(state, TrainState):
        raise TypeError(
            f"{who}: state must be a ct.TrainState, got {show(state)}; build ct.TrainState(model, optimizer)"
        )
    for name in ("epochs", "max_steps", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every"):
        value, optional = options[name], name not in ("log_every", "keep_checkpoints")
        if not (value is None and optional):  # the one rule for ints: a wrong kind TypeError, out of range ValueError
            check_int(value, who, name, example=f"{name}=10" + (" or None" if optional else ""))
    if check_int(options["seed"], who, "seed", minimum=0, example="seed=0") >= 2**32:
        raise ValueError(f"{who}: seed must be below 2**32, got {show(options['seed'])}; e.g. seed=0")
    for name in ("eval_step", "collate_fn"):
        if options[name] is not None and not callable(options[name]):
            raise TypeError(
                f"{who}: {name} must be a function, got {show(options[name])}; "
                + ("e.g. eval_step=lambda model, batch: {'acc': ...}" if name == "eval_step" else "or leave it out")
            )
    if options["collate_fn"] is not None and isinstance(options["data"], DataLoader):
        raise ValueError(
            f"{who}: collate_fn is given but so is a DataLoader, which collates with its own; give the DataLoader "
            "collate_fn=, or pass the Dataset"
        )
    data = options["data"]
    if isinstance(data, Mapping) or (isinstance(data, tuple) and data and all(isinstance(t, Tensor) for t in data)):
        raise TypeError(
            f"{who}: data must be a Dataset or DataLoader, got {show(data)}; wrap tensors as "
            "torch.utils.data.TensorDataset(x, y)"
        )
    for name in ("shuffle", "drop_last", "progress", "requeue"):
        value, optional = options[name], name in ("shuffle", "drop_last")
        if not isinstance(value, bool) and not (value is None and optional):
            raise TypeError(
                f"{who}: {name} must be True or False{' (or None: the default)' if optional else ''}, got "
                f"{show(value)}; e.g. {name}=True"
            )
    if options["checkpoint_every"] is not None and options["checkpoint_dir"] is None:
        raise ValueError(
            f"{who}: checkpoint_every={options['checkpoint_every']} but no checkpoint_dir to save in; give "
            "checkpoint_dir, or leave checkpoint_every out"
        )
    _check_eval_data(options["eval_data"], data, who)
    if options["eval_every"] is not None and options["eval_step"] is None:
        raise ValueError(
            f"{who}: eval_every={options['eval_every']} but no eval_step to evaluate with; give eval_step and "
            "eval_data, or leave eval_every out"
        )
    check_real(options["timeout"], who, "timeout", example="timeout=300 (seconds)")


def loader_options(
    data: Any, batch_size: int | None, shuffle: bool | None, drop_last: bool | None, who: str
) -> tuple[int | None, bool, bool]:
    """batch_size, shuffle and drop_last with their defaults; for a DataLoader given as is (its own
    batching and sampler decide), any of them that says otherwise is refused rather than ignored."""
    if not isinstance(data, DataLoader):
        return batch_size, True if shuffle is None else shuffle, bool(drop_last)
    fix = "leave it out (the DataLoader is used as given), or pass the Dataset and let ct.run build the loader"
    if batch_size is not None and batch_size != data.batch_size:
        by = data.batch_size if data.batch_size is not None else f"its {type(data.batch_sampler).__name__}"
        raise ValueError(f"{who}: batch_size={batch_size} but the DataLoader given batches by {by}; {fix}")
    if drop_last is not None and drop_last != data.drop_last:
        raise ValueError(f"{who}: drop_last={drop_last} but the DataLoader given has drop_last={data.drop_last}; {fix}")
    own = _shuffles(data.sampler)
    if shuffle is not None and own is None:
        raise ValueError(
            f"{who}: shuffle={shuffle} but the DataLoader given orders its data by its own "
            f"{type(data.sampler).__name__}, which ct.run cannot change; {fix}"
        )
    if shuffle is not None and shuffle != own:
        raise ValueError(
            f"{who}: shuffle={shuffle} but the DataLoader given has a {type(data.sampler).__name__} "
            f"({'shuffled' if own else 'in order'}); {fix}"
        )
    return batch_size, True if shuffle is None else shuffle, False if drop_last is None else drop_last


def _shuffles(sampler: Any) -> bool | None:
    """Whether a sampler reshuffles its data (None: a sampler of unknown kind)."""
    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    if isinstance(sampler, DistributedSampler):
        return bool(sampler.shuffle)
    return None


def _check_eval_data(eval_data: Any, data: Any, who: str) -> None:
    """Refuse eval_data that ct.run could not batch or split among processes (a DataLoader is used as given)."""
    if eval_data is None or isinstance(eval_data, DataLoader):
        return
    if isinstance(eval_data, Mapping) or (
        isinstance(eval_data, tuple) and eval_data and all(isinstance(t, Tensor) for t in eval_data)
    ):  # as data: a dict is Sized, and read by index it fails with a bare KeyError at the first evaluation
        raise TypeError(
            f"{who}: eval_data must be a Dataset or DataLoader, got {show(eval_data)}; wrap tensors as "
            "torch.utils.data.TensorDataset(x, y)"
        )
    if isinstance(eval_data, IterableDataset) or not isinstance(eval_data, Sized):
        kind = "an IterableDataset, without a length" if isinstance(eval_data, IterableDataset) else "without a length"
        raise TypeError(
            f"{who}: eval_data is a {type(eval_data).__name__} ({kind}), which ct.run cannot batch and split among "
            "processes; give a map-style Dataset, or a DataLoader that reads this process's share: "
            "eval_data=DataLoader(eval_data, batch_size=...)"
        )
    if isinstance(data, DataLoader) and data.batch_size is None:
        by = (
            f"it batches with batch_sampler={type(data.batch_sampler).__name__}"
            if data.batch_sampler is not None
            else "batch_size=None: each item is a batch"
        )
        raise ValueError(
            f"{who}: eval_data is a Dataset, which ct.run batches by the training loader's batch size, but the "
            f"DataLoader given as data has none ({by}); "
            "give eval_data as a DataLoader too: eval_data=DataLoader(eval_set, batch_size=256)"
        )

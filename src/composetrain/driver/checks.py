"""ct.run's checks that the option values (options.py) build on: the state, flags, and what a
DataLoader given as ``data`` already decides."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from composetrain.core.state import TrainState
from composetrain.core.util import RUN, show

__all__ = ["check_eval_data", "check_flag", "check_state", "dataloader_settings"]


def check_state(state: Any) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(
            f"{RUN}: state must be a ct.TrainState, got {show(state)}; build ct.TrainState(model, optimizer)"
        )


def check_flag(value: Any, name: str, *, optional: bool = False) -> None:
    """True or False (or None, the default, when ``optional``): 1, 'yes' and np.bool_ are refused."""
    if not isinstance(value, bool) and not (value is None and optional):
        raise TypeError(
            f"{RUN}: {name} must be True or False{' (or None: the default)' if optional else ''}, got "
            f"{show(value)}; e.g. {name}=True"
        )


def dataloader_settings(
    data: DataLoader[Any], batch_size: int | None, shuffle: bool | None, drop_last: bool | None
) -> None:
    """For a DataLoader given as is (its own batching and sampler decide): refuse any of batch_size, shuffle
    and drop_last that says otherwise, rather than ignore it."""
    fix = "leave it out (the DataLoader is used as given), or pass the Dataset and let ct.run build the loader"
    if batch_size is not None and batch_size != data.batch_size:
        by = (
            data.batch_size
            if data.batch_size is not None
            else f"its {type(data.batch_sampler).__name__}"
            if data.batch_sampler is not None
            else "none (batch_size=None: each item is a batch)"
        )
        raise ValueError(f"{RUN}: batch_size={batch_size} but the DataLoader given batches by {by}; {fix}")
    if drop_last is not None and drop_last != data.drop_last:
        raise ValueError(f"{RUN}: drop_last={drop_last} but the DataLoader given has drop_last={data.drop_last}; {fix}")
    own = _shuffles(data.sampler)
    if shuffle is not None and own is None:
        raise ValueError(
            f"{RUN}: shuffle={shuffle} but the DataLoader given orders its data by its own "
            f"{type(data.sampler).__name__}, which ct.run cannot change; {fix}"
        )
    if shuffle is not None and shuffle != own:
        raise ValueError(
            f"{RUN}: shuffle={shuffle} but the DataLoader given has a {type(data.sampler).__name__} "
            f"({'shuffled' if own else 'in order'}); {fix}"
        )


def _shuffles(sampler: Any) -> bool | None:
    """Whether a sampler reshuffles its data (None: a sampler of unknown kind)."""
    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    if isinstance(sampler, DistributedSampler):
        return bool(sampler.shuffle)
    return None


def check_eval_data(eval_data: Any, data: Any) -> None:
    """Refuse a Dataset for eval_data that ct.run could not batch: the DataLoader given as data has no batch size."""
    if eval_data is None or isinstance(eval_data, DataLoader):
        return
    if isinstance(data, DataLoader) and data.batch_size is None:
        by = (
            f"it batches with batch_sampler={type(data.batch_sampler).__name__}"
            if data.batch_sampler is not None
            else "batch_size=None: each item is a batch"
        )
        raise ValueError(
            f"{RUN}: eval_data is a Dataset, which ct.run batches by the training loader's batch size, but the "
            f"DataLoader given as data has none ({by}); "
            "give eval_data as a DataLoader too: eval_data=DataLoader(eval_set, batch_size=256)"
        )

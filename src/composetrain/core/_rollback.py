"""Undo for a TrainState load that fails midway (internal).

TrainState checks a checkpoint before writing it, but loading runs code it cannot
foresee (a custom ``load_state_dict``, module hooks): each write first keeps what
it is about to change, and a failure restores it all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from composetrain.core.util import LOAD_STATE

__all__ = ["keep_model", "keep_optimizer", "keep_through_state_dict", "undo_all"]


def undo_all(undo: list[Callable[[], None]], error: BaseException) -> None:
    """Run every undo, newest first, even if one fails: the others still restore their part."""
    failed = []
    for restore in reversed(undo):
        try:
            restore()
        except Exception as e:
            failed.append(repr(e))
    if failed:
        raise RuntimeError(
            f"{LOAD_STATE}: loading failed ({error!r}), and undoing it failed too ({'; '.join(failed)}); "
            "this TrainState is now partly loaded: rebuild it before loading again"
        ) from error


def keep_optimizer(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """Undo for ``Optimizer.load_state_dict``, which replaces ``state`` and ``param_groups`` (never mutates them)."""
    state, groups = optimizer.state, optimizer.param_groups

    def restore() -> None:
        optimizer.state, optimizer.param_groups = state, groups

    return restore


def keep_through_state_dict(obj: Any) -> Callable[[], None]:
    """Undo for a scheduler's or a transform object's ``load_state_dict``: reload a copy of its state."""
    saved = copy.deepcopy(obj.state_dict())
    return lambda: obj.load_state_dict(saved)


def keep_model(model: nn.Module) -> Callable[[], None]:
    """Undo for ``nn.Module.load_state_dict``, which copies into the live tensors entry by entry.

    The one copy of the model a load makes, kept in host memory (a model that fills its
    accelerator has no room for a second copy there); written back directly, not through
    the loading code that failed.
    """
    saved = {
        k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
        for k, v in model.state_dict().items()
    }

    def restore() -> None:
        live = model.state_dict()
        with torch.no_grad():
            for key, value in saved.items():
                if isinstance(value, torch.Tensor):
                    live[key].copy_(value)
                else:  # a module's extra state, under "<module>._extra_state"
                    model.get_submodule(key.rpartition(".")[0]).set_extra_state(value)

    return restore

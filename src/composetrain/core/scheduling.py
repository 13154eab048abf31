"""How a TrainState steps its scheduler: the three kinds it drives, told apart and checked when it is built.

- ``"torch"``: ``step()`` with no argument (torch's ``LRScheduler``s, any scheduler of that form), once per applied
  update, or once per epoch (``scheduler_interval="epoch"``).
- ``"both"``: ``step_update(num_updates)`` after each applied update and ``step(epoch)`` at each epoch's end
  (``step(epoch, metric)`` when a metric is given), with ``num_updates`` the updates applied and ``epoch`` the
  epochs ended so far: timm's ``Scheduler`` as its ``train.py`` steps it, and any object with those two methods.
- ``"metric"``: ``step(metric)`` once per epoch, after the evaluation that gives the metric (torch's
  ``ReduceLROnPlateau``).

Each check raises before the TrainState exists: a scheduler that failed only when first stepped would fail after
``optimizer.step()`` had changed the parameters.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

import torch

from composetrain.core._state_checks import step_needs
from composetrain.core.util import check_real, show

__all__ = ["KINDS", "as_metric", "needs_metric", "scheduler_kind", "takes_metric"]

KINDS = ("torch", "both", "metric")
END_EPOCH = "TrainState.end_epoch"
_FEED = (
    "ct.run(..., eval_step=..., eval_data=..., scheduler_metric='eval.loss') feeds it an evaluation metric after "
    "each epoch's evaluation; a plain loop calls state.end_epoch(metric=value)"
)


def needs_metric(scheduler: Any) -> bool:
    """Whether ``scheduler`` never changes a rate without a metric: torch's ``ReduceLROnPlateau``, or a scheduler
    holding one (timm's ``PlateauLRScheduler``, whose ``step(epoch)`` without a metric silently does nothing)."""
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
    if isinstance(scheduler, plateau):
        return True
    return any(isinstance(v, plateau) for v in getattr(scheduler, "__dict__", {}).values())


def takes_metric(scheduler: Any, kind: str) -> bool:
    """Whether ``scheduler``'s epoch step takes a metric: a metric scheduler's, and one stepping both ways whose
    ``step(epoch, metric)`` binds (timm's all do, and keep it)."""
    return kind == "metric" or (kind == "both" and _binds(scheduler.step, 0, 0.0))


def scheduler_kind(scheduler: Any, interval: str) -> str:
    """The kind of ``scheduler`` (see the module's documentation), or the TypeError or ValueError that says why a
    TrainState cannot drive it, and what to give instead."""
    kind_name = type(scheduler).__name__
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        if interval != "epoch":
            raise TypeError(
                f"TrainState: scheduler {kind_name} steps on a metric (step(metrics)), once per evaluation, so it "
                "cannot step once per update; build the TrainState with scheduler_interval='epoch': " + _FEED
            )
        return "metric"
    if callable(getattr(scheduler, "step_update", None)):
        for method, call, args in (("step_update", "step_update(num_updates)", (0,)), ("step", "step(epoch)", (0,))):
            if not _binds(getattr(scheduler, method, None), *args):
                raise TypeError(
                    f"TrainState: scheduler {kind_name}'s {method}() cannot be called as {call} ("
                    f"{_signature(getattr(scheduler, method, None))}); a scheduler that steps both by update "
                    "and by epoch is stepped as timm's train.py steps it: step_update(num_updates) after each "
                    "applied update, step(epoch) at each epoch's end (step(epoch, metric) with a metric): give it "
                    "those two methods, each with its other arguments optional"
                )
        if interval != "update":
            raise ValueError(
                f"TrainState: scheduler {kind_name} steps both by update and by epoch (step_update(num_updates) "
                "after each applied update, step(epoch) at each epoch's end, as timm's train.py), whatever "
                f"scheduler_interval says, got scheduler_interval={interval!r}; leave scheduler_interval at 'update' "
                "(timm's t_in_epochs=False schedules in updates, True in epochs)"
            )
        return "both"
    needed = step_needs(scheduler)
    if needed:  # refused here: scheduler.step() would raise in the first update, after optimizer.step()
        raise TypeError(
            f"TrainState: scheduler {kind_name}'s step() needs {needed}, but a TrainState steps its scheduler with "
            "step() alone, once per update (or per epoch, scheduler_interval='epoch'), or, for a scheduler that "
            "steps both ways as timm's do, with step_update(num_updates) and step(epoch); use a "
            "torch.optim.lr_scheduler.LRScheduler (StepLR, OneCycleLR, LambdaLR, SequentialLR, ...), any scheduler "
            "whose step() takes no argument, e.g. LambdaLR(optimizer, lambda update: factor(update)), or give yours "
            "a step_update(num_updates)"
        )
    return "torch"


def as_metric(metric: Any, scheduler: Any, kind: str) -> float | None:
    """The metric given to ``TrainState.end_epoch`` as a float (None: none given), checked against the scheduler
    before anything is stepped."""
    kind_name = type(scheduler).__name__ if scheduler is not None else None
    if metric is None:
        if scheduler is not None and needs_metric(scheduler):
            raise TypeError(
                f"{END_EPOCH}: the scheduler {kind_name} steps on a metric, and none was given: without one it "
                "would never decay; " + _FEED
            )
        return None
    value = _nan(metric)
    if value is None:
        value = check_real(
            metric, END_EPOCH, "metric", positive=False, finite=False, example="state.end_epoch(metric=val_loss.item())"
        )
    if scheduler is None or not takes_metric(scheduler, kind):
        which = "there is no scheduler" if scheduler is None else f"the scheduler {kind_name} steps without one"
        raise ValueError(
            f"{END_EPOCH}: metric was given ({show(metric)}), but {which}; it would be dropped: call end_epoch() "
            "without it, or build the TrainState with a scheduler that steps on a metric (ReduceLROnPlateau, with "
            "scheduler_interval='epoch')"
        )
    return value


def _nan(metric: Any) -> float | None:
    """NaN for a NaN number, else None: a metric of NaN (0/0, an epoch that diverged) is taken as torch's
    ``ReduceLROnPlateau`` takes it, no improvement (timm's ``train.py`` feeds it so); refused, a run fed by
    ``scheduler_metric`` could not go on, not even from its checkpoint (which evaluates to NaN again)."""
    if isinstance(metric, numbers.Real) and not isinstance(metric, bool) and math.isnan(metric):
        return math.nan
    return None


def _binds(method: Any, *args: Any) -> bool:
    if not callable(method):
        return False
    try:
        inspect.signature(method).bind(*args)
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: assume it takes them
        return True
    return True


def _signature(method: Any) -> str:
    """How ``method`` is called, for a message."""
    if not callable(method):
        return f"it is {show(method)}"
    return f"its signature is {inspect.signature(method)}"

"""What ct.run does between epochs besides saving and evaluating: the user's hooks (``on_epoch_start``,
``on_epoch_end``), checked when the run starts, and the evaluation metric fed to a scheduler that steps on one
(``scheduler_metric``), checked against the TrainState's scheduler before anything is trained.

The order at an epoch's end (``run.py``): the last update, ``on_epoch_end(state, epoch)``, the epoch scheduler step
(``state.end_epoch()``), the checkpoint, the evaluation; a scheduler fed a metric steps after the evaluation
instead, with it (``state.end_epoch(metric=...)``). Checkpoints come before the evaluation, so one saved at an
epoch's end holds the hook's changes and not yet the metric's step: the resumed run evaluates first
(``Progress.evaluation_missed``) and feeds the metric then, so that each is done once.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from composetrain.core.scheduling import needs_metric, takes_metric
from composetrain.core.state import TrainState
from composetrain.core.util import RUN, show
from composetrain.driver.tracking import deferred_kind

__all__ = ["call_hook", "check_hook", "check_metric_kind", "check_scheduler_metric", "metric_of", "parse_metric"]

_FORM = (
    "'eval.NAME' (NAME a metric of eval_step's) or 'eval_ema.NAME' (the same metric of ct.ema's weights), e.g. "
    "scheduler_metric='eval.loss'"
)


def check_hook(fn: Any, name: str) -> None:
    """``fn`` can be called as ``fn(state, epoch)`` and runs when called (not a generator, not ``async``); the
    refusal says which it is not."""
    usage = f"{name}(state, epoch)"
    if fn is None:
        return
    why, kind = None, deferred_kind(fn) if callable(fn) else None
    if not callable(fn):
        why = "it is not callable"
    elif isinstance(fn, type):
        why = "it is a class: calling it would build one"
    elif kind is not None:
        how, marked = ("await", " (async def)") if kind == "a coroutine" else ("iterate", "")
        why = f"it returns {kind}{marked} that ct.run would not {how}: its body would never run"
    else:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: taken at its word
            signature = None
        try:
            if signature is not None:
                signature.bind(None, 0)
        except TypeError:
            why = f"its signature {signature} cannot be called as fn(state, epoch)"
    if why is not None:
        raise TypeError(
            f"{RUN}: {name} must be a function {usage}, got {show(fn)}; {why}; e.g. {name}=lambda state, epoch: "
            "loader.sampler.set_epoch(epoch + 1)"
        )


def call_hook(fn: Any, name: str, state: TrainState, epoch: int) -> None:
    """``fn(state, epoch)``, refused when it returns having moved the run's count (``state.step``, ``state.epoch``:
    a plain loop's ``state.end_epoch()`` moved into ``on_epoch_end`` steps an epoch scheduler twice an epoch) or
    swapped what the run trains (the state's model, optimizer or scheduler): its checkpoints, its schedule and its
    position in the data would no longer agree. Refused before the epoch's checkpoint, so the last one stands."""
    kept = {k: getattr(state, k) for k in _KEPT}
    fn(state, epoch)
    moved = [k for k in ("step", "epoch") if getattr(state, k) != kept[k]]
    swapped = [k for k in _KEPT if k not in ("step", "epoch") and getattr(state, k) is not kept[k]]
    if moved or swapped:
        said = [f"state.{k} from {kept[k]} to {getattr(state, k)}" for k in moved]
        said += [f"state.{k} (another object)" for k in swapped]
        raise ValueError(
            f"{RUN}: {name} changed {', '.join(said)} in epoch {epoch}; ct.run counts the updates and ends each epoch "
            "itself (on_epoch_end, then state.end_epoch()), and trains the TrainState's own model, optimizer and "
            f"scheduler: leave those to it, and change settings (a Mixup's, a sampler's epoch) or the model's tensors "
            "in place (distribute_bn) in a hook; the run resumes from its last checkpoint"
        )


_KEPT = ("step", "epoch", "model", "optimizer", "scheduler")


def parse_metric(name: Any) -> tuple[str, str] | None:
    """``scheduler_metric`` as (the evaluation record's key, the metric's name), or None (not given)."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"{RUN}: scheduler_metric must be a str {_FORM}, got {show(name)}")
    kind, dot, metric = name.partition(".")
    if not (dot and metric and (kind == "eval" or kind.startswith("eval_"))):
        raise ValueError(
            f"{RUN}: scheduler_metric must name an evaluation metric, {_FORM}; got {show(name)} (a training metric "
            "is not fed: evaluate on part of the training data for one)"
        )
    return kind, metric


def check_scheduler_metric(state: TrainState, name: str | None) -> None:
    """Refuse a scheduler that steps on a metric without ``scheduler_metric``, and ``scheduler_metric`` for a
    scheduler that takes none: the one would never decay, the other's metric would be dropped."""
    scheduler = state.scheduler
    kind_name = type(scheduler).__name__
    if name is None and scheduler is not None and needs_metric(scheduler):
        raise ValueError(
            f"{RUN}: the scheduler {kind_name} steps on a metric, and scheduler_metric is not given: it would never "
            "decay; give eval_step and eval_data and name the metric it steps on, e.g. ct.run(..., "
            "scheduler_metric='eval.loss'): after each epoch's evaluation it steps with that metric"
        )
    if name is not None and (scheduler is None or not takes_metric(scheduler, state.scheduler_kind)):
        which = "the TrainState has no scheduler" if scheduler is None else f"the scheduler {kind_name} takes none"
        raise ValueError(
            f"{RUN}: scheduler_metric={name!r} is given, but {which}: the metric would be dropped; leave "
            "scheduler_metric out, or build the TrainState with a scheduler that steps on a metric "
            "(ReduceLROnPlateau with scheduler_interval='epoch', or timm's)"
        )


def check_metric_kind(name: str | None, kinds: Iterable[str]) -> None:
    """Refuse ``scheduler_metric`` naming the evaluation of weights the composition does not evaluate (``kinds``:
    ``TrainStep.eval_weights``'s names, ``"ema"`` for ``ct.ema``), before the first update: found at the first
    evaluation, it would cost an epoch."""
    parsed = parse_metric(name)
    if parsed is None or parsed[0] == "eval":
        return
    held = ["eval", *(f"eval_{k}" for k in kinds)]
    if parsed[0] not in held:
        raise ValueError(
            f"{RUN}: scheduler_metric={name!r} names the evaluation of weights {parsed[0][5:]!r}, which this "
            f"composition does not evaluate (its evaluations: {held}); name one of those, e.g. 'eval.loss' (the "
            "evaluation of ct.ema's weights is 'eval_ema': compose ct.ema for it)"
        )


def metric_of(entry: dict[str, Any], name: str) -> float:
    """The metric ``scheduler_metric`` names, read from an evaluation's record; a name the record lacks is refused
    with the names it holds (after the epoch's checkpoint: a fixed command resumes there)."""
    parsed = parse_metric(name)
    assert parsed is not None  # for the type checker: called with a scheduler_metric only
    kind, metric = parsed
    # as ct.run keeps an evaluation: the model's metrics beside step and epoch, other weights' under "eval_<kind>"
    own = {k: v for k, v in entry.items() if k not in ("step", "epoch") and not isinstance(v, dict)}
    groups = {"eval": own, **{k: v for k, v in entry.items() if isinstance(v, dict)}}
    if metric in groups.get(kind, {}):
        return float(groups[kind][metric])
    held = {k: sorted(v) for k, v in groups.items()}
    raise ValueError(
        f"{RUN}: scheduler_metric={name!r} names no metric of this evaluation, which holds "
        + ", ".join(f"{k}: {v}" for k, v in held.items())
        + f"; name one of them ({kind}.NAME), and run the same command again: it resumes from the checkpoint of "
        "this epoch's end and steps the scheduler then"
    )

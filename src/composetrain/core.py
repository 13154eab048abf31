"""The core: TrainState, StepOutput, TrainStep, train_step and compose.

How a TrainStep works
---------------------
``train_step(state, batch)`` performs exactly one optimizer update, in two phases
that transforms may wrap:

1. ``grads(state, batch, ctx) -> Pass``: forward and backward, accumulating into
   ``.grad``. A transform that splits the batch (``accumulate``) calls its inner
   step's ``grads`` once per piece.
2. ``update(state, ctx) -> skipped``: apply the optimizer update, or skip it.

Transforms talk to the steps inside them through one explicit channel, the
``Context`` handed down the ``grads`` phase, never by testing each other's types.
The loss has exactly one owner of its normalisation: the innermost pass scales
its mean loss by ``ctx.piece_weight / ctx.total_weight`` before ``backward``, so
the gradients summed over all passes are those of the mean over all units of the
batch, however it was split. The same scaled loss, detached, is the pass's share
of the reported loss: shares add up, with no second weighting.

``__call__`` is the only entry: it validates the state and the batch, builds the
root context, runs both phases and always leaves every gradient ``None``
(``zero_grad(set_to_none=True)``), also when a phase raises, so a failed call
changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeAlias

import torch
from torch import nn

from composetrain.batching import leading_size

__all__ = [
    "Context",
    "Pass",
    "PlainStep",
    "StepOutput",
    "TrainState",
    "TrainStep",
    "Transform",
    "compose",
    "train_step",
]

Metric: TypeAlias = "torch.Tensor | float"
WeightFn: TypeAlias = "Callable[[Any], int | float | torch.Tensor]"


class PlainStep(Protocol):
    """``step(model, batch) -> loss`` or ``-> (loss, metrics)``: forward and loss, nothing else.

    ``loss`` is a scalar tensor, the mean over the batch's units (samples by
    default); ``metrics`` maps names to scalar tensors or numbers, also batch means.
    """

    def __call__(self, model: nn.Module, batch: Any, /) -> Any: ...


class TrainState:
    """All mutable training state: model, optimizer, scheduler and the update count.

    Args:
        model: the module being trained.
        optimizer: a ``torch.optim.Optimizer`` over (some of) the model's parameters.
        scheduler: an optional ``torch.optim.lr_scheduler.LRScheduler`` of that
            optimizer; it steps once per applied optimizer update.

    Attributes:
        step: optimizer updates applied so far (skipped updates do not count).

    Example:
        >>> model = nn.Linear(4, 2)
        >>> state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> out = accumulate(2)(lambda m, b: m(b).pow(2).mean())(state, torch.ones(8, 4))
        >>> state.step
        1
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"TrainState: model must be a torch.nn.Module, got {_show(model)}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"TrainState: optimizer must be a torch.optim.Optimizer, got {_show(optimizer)}; "
                "build one over the model, e.g. torch.optim.SGD(model.parameters(), lr=0.1)"
            )
        if scheduler is not None:
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                raise TypeError(
                    "TrainState: scheduler ReduceLROnPlateau needs a metric at every step, so it "
                    "cannot step once per update; call its step(metric) yourself after evaluation"
                )
            if not (hasattr(scheduler, "step") and hasattr(scheduler, "state_dict")):
                raise TypeError(
                    f"TrainState: scheduler must be a torch.optim.lr_scheduler.LRScheduler or None, "
                    f"got {_show(scheduler)}"
                )
            if getattr(scheduler, "optimizer", optimizer) is not optimizer:
                raise ValueError(
                    "TrainState: scheduler was built for a different optimizer than the one given; "
                    "build it as Scheduler(optimizer, ...) with this state's optimizer"
                )
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: model, optimizer, scheduler and step.

        Like ``nn.Module.state_dict``, tensors are references to the live ones:
        save or deep-copy the result before training on.
        """
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "step": self.step,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what ``state_dict()`` returned; continuing then is bit-identical.

        Everything is checked before anything is written: a checkpoint of another
        model, optimizer or scheduler raises and leaves this state untouched.
        """
        who = "TrainState.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"{who}: state_dict must be a mapping from TrainState.state_dict(), got {_show(state_dict)}"
            )
        missing = {"model", "optimizer", "scheduler", "step"} - set(state_dict)
        if missing:
            raise ValueError(f"{who}: state_dict lacks {sorted(missing)}; pass what TrainState.state_dict() returned")
        _check_model_state(self.model, state_dict["model"], who)
        _check_optimizer_state(self.optimizer, state_dict["optimizer"], who)
        has_sched, saved_sched = self.scheduler is not None, state_dict["scheduler"] is not None
        if has_sched != saved_sched:
            raise ValueError(
                f"{who}: the checkpoint {'has' if saved_sched else 'has no'} scheduler state but this "
                f"TrainState {'has' if has_sched else 'has no'} scheduler; build the state the way it was saved"
            )
        step = state_dict["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"{who}: step must be a non-negative int, got {step!r}")

        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        self.step = step

    def __repr__(self) -> str:
        sched = type(self.scheduler).__name__ if self.scheduler is not None else None
        return (
            f"TrainState(step={self.step}, model={type(self.model).__name__}, "
            f"optimizer={type(self.optimizer).__name__}, scheduler={sched})"
        )


def _check_model_state(model: nn.Module, saved: Any, who: str) -> None:
    if not isinstance(saved, Mapping):
        raise TypeError(f"{who}: state_dict['model'] must be a mapping, got {_show(saved)}")
    own = model.state_dict()
    missing = sorted(own.keys() - saved.keys())
    unexpected = sorted(saved.keys() - own.keys())
    reshaped = [
        f"{k}: {tuple(saved[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in saved and isinstance(saved[k], torch.Tensor) and saved[k].shape != v.shape
    ]
    if missing or unexpected or reshaped:
        raise ValueError(
            f"{who}: the checkpoint's model does not match this model (missing keys {missing[:5]}, "
            f"unexpected keys {unexpected[:5]}, shape mismatches {reshaped[:5]}); "
            "load a checkpoint saved from the same architecture"
        )


def _check_optimizer_state(optimizer: torch.optim.Optimizer, saved: Any, who: str) -> None:
    if not isinstance(saved, Mapping) or "param_groups" not in saved or "state" not in saved:
        raise TypeError(f"{who}: state_dict['optimizer'] must come from Optimizer.state_dict(), got {_show(saved)}")
    own = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [len(g["params"]) for g in saved["param_groups"]]
    if own != theirs:
        raise ValueError(
            f"{who}: the checkpoint's optimizer has parameter groups of sizes {theirs}, this one {own}; "
            "load a checkpoint saved with the same optimizer over the same parameters"
        )


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """What one call of a TrainStep returns. Nothing in it holds an autograd graph.

    Attributes:
        loss: detached scalar tensor, the mean loss over the batch's units, still on
            its device (reading it is the caller's host sync, not the step's).
        metrics: detached scalar tensors, means over the batch's units.
        skipped: bool-like, true when the update was not applied.
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]
    skipped: bool | torch.Tensor = False


class Context(NamedTuple):
    """What a transform tells the steps inside it during the grads phase.

    Transforms pass a modified copy (``ctx._replace(...)``) to their inner step;
    nothing here is mutated.

    Attributes:
        model: the module the plain step is called with.
        total_weight: units (samples, tokens) in the whole batch of this update.
        piece_weight: units in the batch this call sees.
        last_backward: False while further backward passes of this update follow
            (a transform that synchronises or unscales gradients waits for True).
    """

    model: nn.Module
    total_weight: float
    piece_weight: float
    last_backward: bool = True


class Pass(NamedTuple):
    """What a grads phase returns: its share of the update's mean loss and metrics.

    A share is the pass's mean times ``piece_weight / total_weight`` (detached), so
    the shares of all passes of an update add up to the means over the whole batch.
    """

    loss: torch.Tensor
    metrics: dict[str, Metric]


def combine(passes: Sequence[Pass], who: str) -> Pass:
    """The sum of several passes' shares: the loss and metrics of their union."""
    names = passes[0].metrics.keys()
    for i, p in enumerate(passes):
        if p.metrics.keys() != names:
            raise ValueError(
                f"{who}: the step returned metrics {sorted(p.metrics)} for piece {i + 1} but "
                f"{sorted(names)} for piece 1; return the same metric names for every batch"
            )
    loss = _add([p.loss for p in passes])
    return Pass(loss, {k: _add([p.metrics[k] for p in passes]) for k in names})


def _add(values: list[Any]) -> Any:
    """Sum of tensors (two kernel launches, whatever their number) or numbers."""
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack(values).sum(0)
    return sum(values[1:], values[0])


class TrainStep:
    """One optimizer update per call: ``train_step(state, batch) -> StepOutput``.

    Built by ``ct.train_step`` and by the transforms. A transform subclasses
    TrainStep, overrides ``grads`` and/or ``update`` and calls its inner step's
    (see the module documentation for the protocol).

    Args:
        inner: the step this one wraps (None only for the lifted plain step).
        weight: ``weight(batch) -> units`` for the whole chain, or None for the
            batch's leading size; one chain has at most one weight function.
    """

    inner: TrainStep | None
    weight: WeightFn | None

    def __init__(self, inner: TrainStep | None, *, weight: WeightFn | None = None) -> None:
        inherited = inner.weight if inner is not None else None
        if weight is not None and inherited is not None and weight is not inherited:
            raise ValueError(
                f"{self._label()}: the step inside already counts units with "
                f"weight={_name(inherited)}; one composition has one weight function: "
                "give weight= to one accumulate only"
            )
        self.inner = inner
        self.weight = weight if weight is not None else inherited
        wrapped = inner if inner is not None else getattr(self, "step", None)
        if wrapped is not None:
            functools.update_wrapper(self, wrapped, updated=())

    # -- the two phases ----------------------------------------------------------
    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        """Forward and backward of ``batch``, gradients added into ``.grad``."""
        assert self.inner is not None  # only the lifted plain step has no inner; it overrides this
        return self.inner.grads(state, batch, ctx)

    def update(self, state: TrainState, ctx: Context) -> bool | torch.Tensor:
        """Apply the update from ``.grad``; returns whether it was skipped."""
        assert self.inner is not None
        return self.inner.update(state, ctx)

    # -- the entry ---------------------------------------------------------------
    def __call__(self, state: TrainState, batch: Any) -> StepOutput:
        """Run one optimizer update on ``batch``.

        Args:
            state: the TrainState to update in place.
            batch: a nested batch; tensors share their leading (batch) size.

        Returns:
            The StepOutput: detached mean loss and metrics, and whether the update
            was skipped.
        """
        if not isinstance(state, TrainState):
            raise TypeError(
                f"{self!r}: state must be a ct.TrainState, got {_show(state)}; "
                "build one with ct.TrainState(model, optimizer)"
            )
        units = self.units(batch)
        ctx = Context(model=state.model, total_weight=units, piece_weight=units)
        try:
            done = self.grads(state, batch, ctx)
            skipped = self.update(state, ctx)
        except BaseException:
            state.model.zero_grad(set_to_none=True)  # a failed call leaves no gradient behind
            raise
        finally:
            state.optimizer.zero_grad(set_to_none=True)
        metrics = {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in done.metrics.items()}
        return StepOutput(done.loss, metrics, skipped)

    def units(self, batch: Any) -> float:
        """How many units ``batch`` holds under this chain's weight (checked)."""
        if self.weight is None:
            size = leading_size(batch, repr(self))
            if size == 0:
                raise ValueError(
                    f"{self!r}: the batch is empty (leading size 0); skip empty batches "
                    "before the step, e.g. DataLoader(..., drop_last=True)"
                )
            return 1.0 if size is None else float(size)
        return check_weights([self.weight(batch)], f"{self!r}", "the batch")[0]

    # -- identity ----------------------------------------------------------------
    def _config(self) -> tuple[Any, ...]:
        """The configuration that, with the inner step, defines this step."""
        return ()

    def _label(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        inner = self.inner
        shown = _name(inner.step) if isinstance(inner, _Lifted) else repr(inner)
        return f"{self._label()}({shown})"

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return False
        assert isinstance(other, TrainStep)
        return self._config() == other._config() and self.inner == other.inner

    def __hash__(self) -> int:
        return hash((type(self), self._config(), self.inner))


class _Lifted(TrainStep):
    """The plain step lifted: forward, backward, optimizer step, scheduler step."""

    def __init__(self, step: PlainStep) -> None:
        self.step = step
        super().__init__(None)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        loss, metrics = _unpack(self.step(ctx.model, batch), self)
        share = ctx.piece_weight / ctx.total_weight
        if share != 1.0:  # only split batches pay for the scaling; a whole batch stays bit-exact
            loss = loss * share
            metrics = {k: v * share for k, v in metrics.items()}
        loss.backward()
        return Pass(loss.detach(), metrics)

    def update(self, state: TrainState, ctx: Context) -> bool:
        state.optimizer.step()
        if state.scheduler is not None:
            state.scheduler.step()
        state.step += 1
        return False

    def _config(self) -> tuple[Any, ...]:
        return (self.step,)

    def __repr__(self) -> str:
        return f"train_step({_name(self.step)})"


def _unpack(out: Any, who: TrainStep) -> tuple[torch.Tensor, dict[str, Metric]]:
    """Check a plain step's return value; detach the metrics."""
    loss, metrics = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"{who!r}: the step must return a loss tensor or (loss, metrics), got {_show(out)}; "
            "return e.g. F.cross_entropy(model(x), y)"
        )
    if loss.dim() != 0:
        raise ValueError(
            f"{who!r}: the loss must be a scalar (0-dim) tensor, the mean over the batch, got shape "
            f"{tuple(loss.shape)}; reduce it, e.g. F.cross_entropy(..., reduction='mean') or loss.mean()"
        )
    if not loss.requires_grad:
        raise ValueError(
            f"{who!r}: the loss does not require grad (computed under torch.no_grad(), detached, "
            "or from parameters with requires_grad=False); compute it from the model's output"
        )
    if metrics is None:
        return loss, {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{who!r}: metrics must be a mapping of names to scalars, got {_show(metrics)}")
    clean: dict[str, Metric] = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            clean[name] = value.detach().reshape(())
        elif isinstance(value, (int, float)):
            clean[name] = float(value)
        else:
            raise TypeError(
                f"{who!r}: metric {name!r} must be a scalar tensor or a number, got {_show(value)}; "
                "return a batch mean, e.g. (pred == y).float().mean()"
            )
    return loss, clean


def check_weights(values: Sequence[Any], who: str, what: str) -> list[float]:
    """Turn weights (numbers or one-element tensors) into positive finite floats.

    Tensors on an accelerator are read with one host transfer for all of them.
    ``what`` names the batch in messages ("micro-batch", "the batch").
    """
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.numel() == 1]
    if tensors:
        if len({t.device for t in tensors}) == 1:  # one transfer, not one per weight
            read = iter(torch.stack([t.detach().reshape(()).double() for t in tensors]).tolist())
        else:
            read = iter([t.item() for t in tensors])
        values = [next(read) if isinstance(v, torch.Tensor) and v.numel() == 1 else v for v in values]
    out = []
    for i, v in enumerate(values):
        where = f"{what} {i + 1} of {len(values)}" if len(values) > 1 else what
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(
                f"{who}: weight must return a number or a one-element tensor, got {_show(v)} for "
                f"{where}; return the count of units, e.g. (labels != -100).sum()"
            )
        if not math.isfinite(v) or v <= 0:
            raise ValueError(
                f"{who}: weight returned {v} for {where}; every batch must hold a positive, finite "
                "number of units (samples, tokens): use fewer micro-batches, or drop batches "
                "with no units before the step"
            )
        out.append(float(v))
    return out


class Transform:
    """A transform with its configuration bound: ``Transform(step) -> TrainStep``.

    Returned by ``accumulate(n)`` and ``compose(...)``; prints as what it is.
    """

    def __init__(self, label: str, build: Callable[[TrainStep], TrainStep]) -> None:
        self._label = label
        self._build = build

    def __call__(self, step: PlainStep | TrainStep) -> TrainStep:
        return self._build(_lift(step, self._label))

    def __repr__(self) -> str:
        return self._label


def train_step(step: PlainStep | TrainStep) -> TrainStep:
    """Lift a plain step to a TrainStep: the reference every transform is measured against.

    One call runs ``step(model, batch)``, ``loss.backward()``, ``optimizer.step()``,
    ``scheduler.step()`` (if any), then ``optimizer.zero_grad(set_to_none=True)``.
    A TrainStep is returned unchanged.

    Args:
        step: ``step(model, batch) -> loss`` or ``-> (loss, metrics)``.

    Returns:
        The TrainStep.

    Example:
        >>> def step(model, batch):
        ...     x, y = batch
        ...     return F.cross_entropy(model(x), y)
        >>> out = ct.train_step(step)(state, (x, y))       # one update on the whole batch
        >>> out = ct.accumulate(4)(step)(state, (x, y))    # the same update, in 4 micro-batches
    """
    return _lift(step, "train_step")


def _lift(step: PlainStep | TrainStep, who: str) -> TrainStep:
    if isinstance(step, TrainStep):
        return step
    if isinstance(step, (nn.Module, TrainState)) or not callable(step):
        raise TypeError(
            f"{who}: step must be a function step(model, batch) -> loss, got {_show(step)}; "
            "write the forward and the loss in a function of (model, batch)"
        )
    return _Lifted(step)


def compose(*transforms: Callable[[TrainStep], TrainStep]) -> Transform:
    """``compose(f, g, h)(step) == f(g(h(step)))``: the first transform is outermost.

    Args:
        *transforms: transforms such as ``accumulate(4)``; none gives the lift alone.

    Returns:
        A Transform applying them right to left.

    Example:
        >>> both = ct.compose(ct.accumulate(2), ct.accumulate(3))
        >>> both(step)
        accumulate(2)(accumulate(3)(step))
    """
    for i, t in enumerate(transforms):
        if isinstance(t, TrainStep) or not callable(t):
            raise TypeError(
                f"compose: argument {i} must be a transform such as ct.accumulate(4), got {_show(t)}; "
                "pass transforms, then call the result on the step: compose(f, g)(step)"
            )

    def build(step: TrainStep) -> TrainStep:
        for t in reversed(transforms):
            step = _lift(t(step), repr(t))
        return step

    return Transform(f"compose({', '.join(map(repr, transforms))})", build)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def _show(value: Any) -> str:
    """A short description of a value for error messages: repr and type."""
    text = " ".join(repr(value).split())
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"

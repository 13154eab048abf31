"""The plain step lifted to a TrainStep (``train_step``), and ``compose``.

``train_step(step)`` is the reference every transform is measured against: the
textbook update, forward, backward, ``optimizer.step()``, ``scheduler.step()``,
``zero_grad(set_to_none=True)``, run through the phases of ``core.TrainStep``.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from composetrain.core._state_checks import check_schedule_left
from composetrain.core.metric_names import TRAIN_FIELDS, metric_names
from composetrain.core.protocol import Context, Hook, Metric, Pass, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.util import name, show

__all__ = [
    "PlainStep",
    "Transform",
    "checked_output",
    "compose",
    "lift",
    "refuse_step",
    "train_step",
    "transform_factory",
]

F = TypeVar("F", bound=Callable[..., Any])


class PlainStep(Protocol):
    """``step(model, batch) -> loss`` or ``-> (loss, metrics)``: forward and loss, nothing else.

    ``loss`` is a scalar tensor, the mean over the batch's units (samples by
    default); ``metrics`` maps names to scalar tensors or numbers, also batch means.
    """

    def __call__(self, model: nn.Module, batch: Any, /) -> Any: ...


class _Lifted(TrainStep):
    """The plain step lifted: forward, backward, optimizer step, scheduler step."""

    def __init__(self, step: PlainStep) -> None:
        self.step = step
        # the metric names a pass returned that metric_names passed (plain str only): the same names again need
        # no second look (a derived fact, as a module's BatchNorm layers: no training state)
        self.checked_names: tuple[str, ...] | None = None
        super().__init__(None)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        # refused before the forward: scheduler.step() itself would raise after optimizer.step(), and
        # an outer transform's update (the loss scale's) would already have run
        if state.scheduler is not None and state.scheduler_kind == "torch" and state.scheduler_interval == "update":
            check_schedule_left(state.scheduler, state.step, self)
        return ctx

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        if not (ctx.around_pass or ctx.around_forward):  # the common case, without context managers
            return self._pass(batch, ctx)
        with _entered(ctx.around_pass, ctx):
            return self._pass(batch, ctx)

    def _pass(self, batch: Any, ctx: Context) -> Pass:
        call = self.step if ctx.call_step is None else ctx.call_step(self.step)
        if ctx.around_forward:
            with _entered(ctx.around_forward, ctx):
                out = call(ctx.model, batch)
        else:
            out = call(ctx.model, batch)
        loss, metrics = _unpack(out, self)
        share = ctx.piece_weight / ctx.total_weight
        if not (isinstance(share, float) and share == 1.0):  # a whole batch stays bit-exact
            loss = loss * share
            metrics = {k: v * share for k, v in metrics.items()}
        scaled = loss
        for scale in ctx.scale_loss:
            scaled = scale(scaled)
        scaled.backward()
        return Pass(_reported(loss.detach()), metrics)

    def verify(self, state: TrainState, done: Pass, ctx: Context) -> None:
        pass  # the plain step's output was checked in its pass (_unpack)

    def update(self, state: TrainState, ctx: Context) -> Update:
        if ctx.skip_update:
            return Update(True, {})
        state.optimizer.step()
        scheduler, kind = state.scheduler, state.scheduler_kind
        # per epoch (a metric scheduler too): state.end_epoch(); one stepping both ways: step_update(updates applied)
        if scheduler is not None and (kind == "both" or state.scheduler_interval == "update"):
            method = "step_update" if kind == "both" else "step"
            try:
                scheduler.step_update(state.step + 1) if kind == "both" else scheduler.step()
            except BaseException as e:  # after optimizer.step(): the parameters moved, state.step did not
                state.unusable = (
                    f"the scheduler {type(scheduler).__name__}'s {method}() raised ({type(e).__name__}: {e}) after "
                    "optimizer.step() had changed the parameters, which cannot be undone: this TrainState is "
                    "half-updated (its step count and schedule behind its weights); load a checkpoint into a new "
                    f"one, and give a scheduler whose {method}() does not fail there"
                )
                raise
        state.step += 1
        return Update(False, {})

    def _config(self) -> tuple[Any, ...]:
        return (self.step,)

    def __repr__(self) -> str:
        return f"train_step({name(self.step)})"


def _reported(value: Any) -> Any:
    """16-bit losses and metrics are reported (and summed over micro-batches) in float32."""
    if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
        return value.float()
    return value


def _entered(hooks: tuple[Hook, ...], ctx: Context) -> AbstractContextManager[Any]:
    if not hooks:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for hook in hooks:
        stack.enter_context(hook(ctx))
    return stack


def checked_output(out: Any, who: TrainStep) -> tuple[torch.Tensor, dict[str, Metric]]:
    """A plain step's return value, checked: its loss and its detached metrics (for a transform that calls the
    plain step itself, ``ct.pipeline``'s last stage)."""
    return _unpack(out, who)


def _unpack(out: Any, who: TrainStep) -> tuple[torch.Tensor, dict[str, Metric]]:
    """Check a plain step's return value; detach the metrics."""
    if isinstance(out, tuple) and len(out) >= 2 and all(isinstance(v, torch.Tensor) for v in out[:2]):
        raise TypeError(  # (loss, metrics) holds a mapping: these are a model's outputs
            f"{who!r}: the step must return a loss tensor or (loss, metrics), got a tuple of {len(out)} tensors "
            "(a model's output with return_dict=False: loss, logits, ...); return out[0]; metrics go in a "
            'mapping: (loss, {"acc": acc})'
        )
    loss, metrics = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if not isinstance(loss, torch.Tensor):
        if isinstance(loss, Mapping) and isinstance(loss.get("loss"), torch.Tensor):  # a transformers ModelOutput
            raise TypeError(
                f"{who!r}: the step must return the loss tensor, not the mapping that holds it, got {show(loss)}; "
                "return out['loss'] (a transformers output: model(**batch).loss), or (loss, metrics)"
            )
        if isinstance(loss, Mapping):  # a ModelOutput leaves out its None fields: no labels, no 'loss'
            raise TypeError(
                f"{who!r}: the step must return a loss tensor, got a mapping with keys {list(loss)} "
                f"({type(loss).__name__}) and no 'loss'; a transformers model computes .loss only when called "
                "with labels=: return model(**batch).loss with labels in the batch, or compute it from .logits"
            )
        raise TypeError(
            f"{who!r}: the step must return a loss tensor or (loss, metrics), got {show(out)}; "
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
        raise TypeError(
            f"{who!r}: metrics must be a mapping of names to scalars, got {show(metrics)}; "
            'return (loss, {"acc": acc})'
        )
    clean: dict[str, Metric] = {}
    # checked here, before backward and the update: ct.run, which logs them, sees them only after the update;
    # names of the exact type str that passed once pass again (the rule reads the names alone), so a step
    # returning the same names every pass is checked once
    names = tuple(metrics)
    if names == getattr(who, "checked_names", None) and all(type(k) is str for k in names):
        named = metrics
    else:
        named = metric_names(metrics, TRAIN_FIELDS, "the step", who)  # who formatted only for a message
        if isinstance(who, _Lifted) and all(type(k) is str for k in names):  # a plain step's (a pipeline checks each)
            who.checked_names = names
    for key, value in named.items():
        number = None
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            if value.is_complex():  # a log record's float() would keep the real part alone
                raise TypeError(
                    f"{who!r}: the step returns metric {key!r} as a complex tensor; a logged metric is a real "
                    f"number: return {key!r}: z.abs(), or z.real and z.imag as two metrics"
                )
            if value.is_meta:  # reading it at a log point would fail, updates later
                raise TypeError(
                    f"{who!r}: the step returns metric {key!r} on the 'meta' device, which holds no value; compute "
                    "it from the batch's outputs, on their device"
                )
            clean[key] = _reported(value.detach().reshape(()))
            continue
        real = isinstance(value, numbers.Real) or getattr(getattr(value, "dtype", None), "kind", None) in tuple("biuf")
        if real and (not hasattr(value, "__array__") or getattr(value, "size", 0) == 1):
            try:  # Python and NumPy numbers (np.float32 is no float subclass); an int past float's range is none
                item = getattr(value, "item", None) if hasattr(value, "__array__") else None
                number = float(item() if callable(item) else value)  # a 1-element array too
            except (TypeError, ValueError, OverflowError):
                pass
        if number is None:  # a NumPy complex, string or object is no real number: float() cuts or raises bare
            raise TypeError(
                f"{who!r}: metric {key!r} must be a scalar tensor or a number, got {show(value)}; "
                "return a batch mean, e.g. (pred == y).float().mean()"
            )
        clean[key] = number
    return loss, clean


class Transform:
    """A transform with its configuration bound: ``Transform(step) -> TrainStep``.

    Returned by ``accumulate(n)`` and ``compose(...)``; prints as what it is.
    """

    def __init__(self, label: str, build: Callable[[TrainStep], TrainStep]) -> None:
        self._label = label
        self._build = build

    def __call__(self, step: PlainStep | TrainStep) -> TrainStep:
        return self._build(lift(step, self._label))

    def __repr__(self) -> str:
        return self._label


def train_step(step: PlainStep | TrainStep) -> TrainStep:
    """Lift a plain step to a TrainStep: the reference every transform is measured against.

    One call runs ``step(model, batch)``, ``loss.backward()``, ``optimizer.step()``,
    ``scheduler.step()`` (if any), then ``zero_grad(set_to_none=True)``. A TrainStep
    is returned unchanged.

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
    return lift(step, "train_step")


def transform_factory(fn: F) -> F:
    """Mark a function that builds transforms (``ct.accumulate``, ...): passed where a step
    belongs, it is refused when the composition is built, not at its first call."""
    setattr(fn, "__composetrain_factory__", True)  # noqa: B010 (functions take attributes)
    return fn


def lift(step: PlainStep | TrainStep, who: str, arg: str = "step") -> TrainStep:
    if isinstance(step, TrainStep):
        return step
    if isinstance(step, Transform):
        raise TypeError(
            f"{who}: {arg} must be a function step(model, batch) -> loss, got the transform {step!r}; apply it "
            f"to your step first: {step!r}(step)"
        )
    if getattr(step, "__composetrain_factory__", False):
        raise TypeError(
            f"{who}: {arg} must be a function step(model, batch) -> loss, got ct.{name(step)}, which builds "
            f"transforms; apply it to your step first: ct.{name(step)}(...)(step)"
        )
    if isinstance(step, (nn.Module, TrainState, type)) or not callable(step):
        raise TypeError(
            f"{who}: {arg} must be a function step(model, batch) -> loss, got {show(step)}; "
            "write the forward and the loss in a function of (model, batch)"
        )
    return _Lifted(step)


@transform_factory
def compose(*transforms: Callable[[TrainStep], TrainStep]) -> Transform:
    """``compose(f, g, h)(step) == f(g(h(step)))``: the first transform is outermost.

    Args:
        *transforms: transforms such as ``accumulate(4)``; none gives the lift alone.

    Returns:
        A Transform applying them right to left.

    Example:
        >>> ct.compose(ct.accumulate(2), ct.accumulate(3))(step)
        accumulate(2)(accumulate(3)(step))
    """
    for i, t in enumerate(transforms):
        if isinstance(t, TrainStep) or not callable(t) or _required_positionals(t) > 1:
            raise TypeError(
                f"compose: argument {i} must be a transform such as ct.accumulate(4), got {show(t)}; "
                "pass transforms, then call the result on the step: compose(f, g)(step)"
            )

    def build(step: TrainStep) -> TrainStep:
        for t in reversed(transforms):
            step = lift(t(step), repr(t))
        return step

    return Transform(f"compose({', '.join(map(repr, transforms))})", build)


def _required_positionals(fn: Callable[..., Any]) -> int:
    """How many positional arguments ``fn`` requires: a transform takes one (the step), a plain step two."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): give it the benefit of the doubt
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds and p.default is inspect.Parameter.empty for p in parameters)


def refuse_step(value: Any, who: str, arg: str, usage: str) -> None:
    """A transform with a required argument, used bare (``accumulate(step)``): say what to write.

    ``value`` is refused when it is a TrainStep or a function of two positional
    arguments, ``step(model, batch)``; ``usage`` shows the transform with its argument,
    e.g. ``"accumulate(4)"``.
    """
    plain = callable(value) and not isinstance(value, (type, nn.Module, Transform))
    if isinstance(value, TrainStep) or (plain and _required_positionals(value) == 2):
        raise TypeError(
            f"{who}: {arg} is required, got a step instead: {show(value)}; give {arg} first, then the step: "
            f"{usage}(step)"
        )

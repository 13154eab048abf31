"""ema: an exponential moving average of the model's parameters and buffers, kept in the TrainState."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from composetrain.core.protocol import Context, Pass, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import EMA, EMA_MODEL, show
from composetrain.launch.agree import differing
from composetrain.launch.rendezvous import group_world
from composetrain.transforms._averages import Averages, model_tensors
from composetrain.transforms._ema_rule import Rule

__all__ = ["ema", "ema_model"]

KEY = "ema"  # its state in TrainState.transform_state


@transform_factory
def ema(
    decay: float,
    *,
    every: int = 1,
    warmup: int = 0,
    formula: str = "lerp",
    decay_warmup: bool = False,
    warmup_gamma: float = 1.0,
    warmup_power: float = 2 / 3,
    min_decay: float = 0.0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    exclude_buffers: bool = False,
    integers: str = "average",
) -> Transform:
    """Keep an exponential moving average (EMA) of the model's parameters and buffers in the TrainState.

    After an applied update ``n`` (``state.step``, skipped updates not counted) with ``(n - 1) % every == 0``,
    each average ``a`` of a tensor ``w`` becomes ``decay * a + (1 - decay) * w``; the first such update
    copies the weights, as ``torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=
    get_ema_multi_avg_fn(decay), use_buffers=True)`` does. Through update ``warmup`` the average follows
    the weights (it copies them), as torchvision's recipe resets its EMA during the learning-rate warmup
    (and as timm's ``ModelEmaV3(update_after_step=warmup)``).
    Integer buffers (BatchNorm's ``num_batches_tracked``) are averaged and truncated, as torch does
    (``integers="copy"``: copied, as timm does).
    Averages keep their tensor's shape, dtype and layout: float32 under ``mixed_precision``, DTensor
    shards under ``ct.sharded`` (``ct.ema_model`` gathers them), unless ``dtype`` or ``device`` say otherwise.
    Under ``ct.distributed`` the parameters'
    averages are the same on every rank; buffers a forward updates (BatchNorm's running statistics) are each
    rank's own, and so are their averages: a checkpoint keeps rank 0's (``nn.SyncBatchNorm`` makes them
    agree). Every rank must build it alike (``ct.run`` checks). They are checkpointed with the state.
    It runs after the inner update, so it is right in any nesting order; a model changed after the EMA
    began is refused before the update, and averages follow their weights to another device (but with
    ``device``).

    timm's ``ModelEmaV3``, updated as its ``train.py`` does (``model_ema.update(model, step=num_updates)``), is
    ``ct.ema(decay, warmup=update_after_step, decay_warmup=use_warmup, warmup_gamma=..., warmup_power=...,
    min_decay=..., device=..., dtype=..., exclude_buffers=..., integers="copy")``, bit for bit, for
    ``stochastic_rounding=False`` (ct rounds a bf16 average to nearest; keep it in float32 instead).

    Args:
        decay: the weight of the old average, in [0, 1], e.g. 0.999.
        every: average after every this many applied updates (the first included).
        warmup: applied updates during which the average copies the weights (torchvision's recipe:
            ``lr_warmup_epochs * updates_per_epoch``; timm's ``update_after_step``).
        formula: ``"lerp"``: ``torch._foreach_lerp_`` as ``get_ema_multi_avg_fn`` (one fused kernel);
            ``"sum"``: ``decay * a + (1 - decay) * w`` term by term, bit for bit torchvision's
            ``ExponentialMovingAverage``. The two differ in the last bit.
        decay_warmup: timm's ``use_warmup``: the ``k``-th averaging update since the last copy uses
            ``max(min(1 - (1 + k / warmup_gamma) ** -warmup_power, decay), min_decay)``, so the decay ramps up
            to ``decay`` (0.999 after 10K updates with ``warmup_power=3/4``).
        warmup_gamma: the ramp's time scale (timm's default 1.0); with ``decay_warmup`` only.
        warmup_power: the ramp's power (timm's default 2/3); with ``decay_warmup`` only.
        min_decay: the ramp's floor (at most ``decay``); with ``decay_warmup`` only, as in timm.
        device: keep the averages on this device (``"cpu"`` for a large model on an accelerator: timm's
            ``--model-ema-force-cpu``; not ``"meta"``, and one this process has: refused before the first
            update), each weight copied there and averaged tensor by tensor, as
            ``ModelEmaV3(device=...)``; the EMA's evaluation copies them back into the model.
        dtype: keep floating-point averages in this dtype, float32, float64, bfloat16 or float16
            (``torch.float32`` for a bf16 model, whose rounding would lose the small steps of a high decay),
            averaged as ``ModelEmaV3(dtype=...)`` does; evaluated in the model's dtype (the averages rounded to
            it), ``ct.ema_model`` returns a model in ``dtype``.
        exclude_buffers: average the parameters only and copy every buffer, as ``ModelEmaV3(exclude_buffers=True)``.
        integers: ``"average"`` (torch's ``AveragedModel``) or ``"copy"`` (timm's): what becomes of integer buffers.

    Returns:
        A transform: ``ema(0.999)(step) -> TrainStep``.

    Example:
        >>> train = ct.compose(ct.ema(0.998, every=4), ct.mixed_precision, ct.accumulate(2))(step)
        >>> ct.run(train, state, data, eval_step=evaluate, eval_data=val)  # evals "eval" and "eval_ema"
        >>> averaged = ct.ema_model(state)                                  # a copy with the EMA weights
        >>> timm_like = ct.ema(0.9998, decay_warmup=True, integers="copy", dtype=torch.float32)
    """
    refuse_step(decay, EMA, "decay", "ema(0.999)")
    rule = Rule.checked(
        decay,
        every=every,
        warmup=warmup,
        formula=formula,
        decay_warmup=decay_warmup,
        warmup_gamma=warmup_gamma,
        warmup_power=warmup_power,
        min_decay=min_decay,
        device=device,
        dtype=dtype,
        exclude_buffers=exclude_buffers,
        integers=integers,
    )
    return Transform(rule.label(), lambda step: _Ema(step, rule))


class _Ema(TrainStep):
    role = "ema"

    def __init__(self, inner: TrainStep, rule: Rule) -> None:
        self.rule, self.label, self.every = rule, rule.label(), rule.every
        super().__init__(inner)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        ctx = self._inner().prepare(state, batch, ctx)  # the inner steps first: they may shard or place the model
        if state.step % self.every == 0:  # an applied update would average: a changed model is refused first
            self._averages(state).prepared(state.model)
        return ctx

    def verify(self, state: TrainState, done: Pass, ctx: Context) -> None:
        super().verify(state, done, ctx)
        if state.step % self.every == 0:  # the buffers after the forward: refused here, not after optimizer.step()
            self._averages(state).verify(state.model)

    def update(self, state: TrainState, ctx: Context) -> Update:
        before = state.step
        applied = self._inner().update(state, ctx)
        n = state.step
        if n != before and (n - 1) % self.every == 0:  # an applied update: state.step counts those only
            self._averages(state).update(state.model, follow=n <= self.rule.warmup)
        return applied

    def setup(self, state: TrainState) -> None:
        """After the inner steps' (``sharded`` shards the model): the averages exist, laid out as the
        weights, before a checkpoint loads into them."""
        super().setup(state)
        self._averages(state)
        self._agree()

    def _agree(self) -> None:
        """Every rank averages alike, or none starts: each would keep its own average silently (a
        checkpoint rank 0's, an evaluation their mean). ct.run calls ``setup`` on every rank together."""
        group_world(None, self)  # a launch of several processes that never joined is refused
        configs = differing(self.rule)
        if configs is not None and any(c != configs[0] for c in configs):  # -0.0 is 0.0, as the average takes it
            shown = ", ".join(f"rank {r} {config.label()}" for r, config in enumerate(configs))
            raise ValueError(
                f"{self!r}: the ranks' ct.ema differ: {shown}; each would keep its own average (a checkpoint keeps "
                "rank 0's): build it with the same options on every rank"
            )

    def eval_weights(self, state: TrainState) -> dict[str, AbstractContextManager[Any]]:
        averages = self._averages(state)
        return {**super().eval_weights(state), "ema": _swapped(state.model, averages)}

    def _averages(self, state: TrainState) -> Averages:
        """The averages in the state, created with this EMA's settings (a checkpoint's are compared with them)."""
        return state.transform_state(KEY, lambda: Averages.of(state.model, self.rule))

    def _config(self) -> tuple[Any, ...]:
        return (self.rule,)


@contextlib.contextmanager
def _swapped(model: nn.Module, averages: Averages) -> Iterator[None]:
    """``model`` holds the averages inside, its own weights again after (also on an error), bit for bit."""
    live = averages.matched(model)  # checked before the first copy: an error leaves the model whole
    kept = {k: t.clone() for k, t in live.items()}
    buffers = dict(model.named_buffers())  # the registered tensors: a forward may reassign one (a new tensor)
    with torch.no_grad():
        for k, t in live.items():
            t.copy_(averages.tensors[k])
    try:
        yield
    finally:
        with torch.no_grad():
            for k, t in live.items():
                t.copy_(kept[k])
        for k, b in model.named_buffers():
            if k in buffers and b is not buffers[k]:  # the model's own tensor back, not one made from the average
                owner, _, leaf = k.rpartition(".")
                setattr(model.get_submodule(owner), leaf, buffers[k])


def ema_model(state: TrainState, into: nn.Module | None = None) -> nn.Module:
    """The EMA weights of ``ct.ema`` in a module: ``into`` (loaded in place) or a copy of ``state.model``.

    Before the first average (and with no ``ct.ema`` in the composition) the averages are the model's
    own weights. The copy is in the averages' dtype and on their device (``ct.ema(dtype=..., device=...)``).
    Under ``ct.sharded`` the shards are gathered: call it on every rank, with ``into`` a plain (unsharded) model of
    the same architecture. After ``ct.load_checkpoint`` it gives the saved
    averages.

    Args:
        state: the TrainState trained with ``ct.ema``.
        into: a module of the same architecture to load the averages into; default a deep copy.

    Returns:
        The module holding the averaged parameters and buffers.

    Example:
        >>> ct.run(ct.ema(0.999)(ct.mixed_precision(step)), state, data, epochs=10)
        >>> torch.save(ct.ema_model(state).state_dict(), "ema.pt")
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(state, TrainState):
        raise TypeError(f"{EMA_MODEL}: state must be a ct.TrainState, got {show(state)}")
    transforms = state.state_dict()["transforms"]  # read, not created: live, or loaded and not yet claimed
    averages = _saved_averages(transforms[KEY]) if KEY in transforms else model_tensors(state.model)
    sharded = any(isinstance(t, DTensor) for t in averages.values())
    if into is None:
        if sharded:
            raise ValueError(
                f"{EMA_MODEL}: the averages are sharded (ct.sharded); give a plain model of the same architecture "
                "to gather them into: ct.ema_model(state, into=build_model())"
            )
        into = copy.deepcopy(state.model)
        # ct.ema(dtype=..., device=...): the copy in the averages' dtype and on their device, as timm's ema.module
        floating = {(a.dtype, a.device) for a in averages.values() if a.is_floating_point()}
        if len(floating) == 1:
            dtype, device = floating.pop()
            into.to(device=device, dtype=dtype)
    elif not isinstance(into, nn.Module):
        raise TypeError(f"{EMA_MODEL}: into must be a torch.nn.Module, got {show(into)}")
    target = model_tensors(into)
    if target.keys() != averages.keys():
        missing, extra = sorted(averages.keys() - target.keys()), sorted(target.keys() - averages.keys())
        raise ValueError(
            f"{EMA_MODEL}: into ({type(into).__name__}) is not the architecture averaged: it lacks {missing[:5]} and "
            f"has {extra[:5]} besides the averaged parameters and buffers; give a module built as the trained "
            "one: ct.ema_model(state, into=build_model())"
        )
    for k, t in target.items():  # before the first copy: a refusal leaves into as it was
        a = averages[k]
        if t.shape != a.shape or t.dtype != a.dtype:  # copy_ would cast silently, losing the averages' digits
            raise ValueError(
                f"{EMA_MODEL}: into's {k!r} is {tuple(t.shape)} {t.dtype}, its average {tuple(a.shape)} {a.dtype}; "
                "give into in the averages' shape and dtype (a model built as the trained one), and cast the "
                "result if you want another dtype: ct.ema_model(state, into=build_model()).half()"
            )
    whole = {k: a.full_tensor() if isinstance(a, DTensor) else a for k, a in averages.items()}
    with torch.no_grad():
        for k, t in target.items():
            t.copy_(whole[k])
    return into


def _saved_averages(saved: Any) -> Mapping[str, torch.Tensor]:
    """The averages of ct.ema's state_dict; one loaded from a checkpoint is checked in full when ct.ema claims it."""
    found = saved.get("averages") if isinstance(saved, Mapping) else None
    if not (isinstance(found, Mapping) and all(isinstance(t, torch.Tensor) for t in found.values())):
        raise TypeError(
            f"{EMA_MODEL}: the state's EMA (loaded from a checkpoint) is not ct.ema's: {show(saved)}; load a "
            "checkpoint saved by a run with ct.ema"
        )
    return found

"""skip_spikes: skip an update whose loss (or gradient norm) spikes, decided by every process together."""

from __future__ import annotations

import math
from typing import Any

import torch

from composetrain.core.protocol import Context, Pass, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.steps import PlainStep, Transform, transform_factory
from composetrain.core.util import SKIP_SPIKES, check_int, check_real, show
from composetrain.launch.agree import differing
from composetrain.launch.rendezvous import group_world
from composetrain.transforms.clip import clipped

__all__ = ["SpikeStatistics", "skip_spikes"]

_WATCH = {"loss": ("loss",), "grad_norm": ("grad_norm",), "both": ("loss", "grad_norm")}


@transform_factory
def skip_spikes(
    step: PlainStep | TrainStep | None = None,
    *,
    sigmas: float = 6.0,
    decay: float = 0.99,
    warmup: int = 20,
    max_consecutive: int = 10,
    watch: str = "loss",
) -> Any:
    """Skip an update whose loss (or gradient norm) is not finite, or spikes far above its running mean.

    After the passes, the update's value is judged: the loss, the mean over every process's (under
    ``distributed`` or ``sharded``: each process's loss gathered in one small all-gather per update, so that
    every process judges the same global loss and skips the same updates; a skip decided on one process
    would let the others' spikes into the gradient all-reduce, pitfall 46), or the global norm of the
    synchronised, unscaled gradients (before any clipping, whatever the nesting order). A value that is not
    finite is skipped always; after ``warmup`` accepted updates, one above ``mean + sigmas * std`` is skipped
    too, where mean and variance are exponential moving averages (``decay``) of the accepted values (the
    variance corrected for the averages' start, as Adam's moments are: a young guard errs towards applying). A skipped
    update leaves parameters, optimizer state, scheduler and ``state.step`` as they were and sets
    ``out.skipped`` (``ct.run`` counts it in its records' ``skipped``; the batch is consumed: the data moves
    on); a spike does not enter the averages. After ``max_consecutive`` skips in a row it raises
    ``FloatingPointError``: the run has diverged, and skipping on would only consume the data.

    The averages and counters live in the TrainState (``state.transform_state("skip_spikes", ...)``), so a
    checkpoint carries them and a resumed run judges exactly as the uninterrupted one. Judging costs one host
    sync per update (reading the loss), and under several processes one all-gather of a few numbers; off
    unless composed. Every rank must build it alike (``ct.run`` checks).

    Args:
        step: the step to wrap; omit it to get a transform.
        sigmas: how many standard deviations above the running mean a value must be to be a spike.
        decay: the moving averages' decay per accepted update (0.99: about the last 100 updates).
        warmup: accepted updates before spikes are judged (only non-finite values are skipped before); at least 2,
            for a spread to judge by.
        max_consecutive: raise after this many skipped updates in a row.
        watch: ``"loss"``, ``"grad_norm"`` or ``"both"``: what is judged.

    Returns:
        The wrapped TrainStep, or a transform when ``step`` is omitted.

    Example:
        >>> train = ct.distributed(ct.skip_spikes(ct.clip_grad_norm(1.0)(ct.accumulate(4)(step))))
        >>> train = ct.skip_spikes(sigmas=4.0, watch="both")(ct.mixed_precision(step))
    """
    sigmas = check_real(sigmas, SKIP_SPIKES, "sigmas", example="skip_spikes(sigmas=6.0)")
    decay = check_real(decay, SKIP_SPIKES, "decay", example="skip_spikes(decay=0.99)")
    if not decay < 1:
        raise ValueError(
            f"{SKIP_SPIKES}: decay must be below 1 (the weight the averages keep per update), got {show(decay)}; "
            "e.g. skip_spikes(decay=0.99)"
        )
    warmup = check_int(warmup, SKIP_SPIKES, "warmup", minimum=2, example="skip_spikes(warmup=20)")
    consecutive = check_int(max_consecutive, SKIP_SPIKES, "max_consecutive", example="skip_spikes(max_consecutive=10)")
    if not isinstance(watch, str) or watch not in _WATCH:
        raise (TypeError if not isinstance(watch, str) else ValueError)(
            f"{SKIP_SPIKES}: watch must be 'loss', 'grad_norm' or 'both', got {show(watch)}; e.g. "
            "skip_spikes(watch='loss')"
        )
    settings = (sigmas, decay, warmup, consecutive, watch)
    label = _label(*settings)
    transform = Transform(label, lambda inner: _SkipSpikes(inner, label, settings))
    return transform if step is None else transform(step)


def _label(sigmas: float, decay: float, warmup: int, consecutive: int, watch: str) -> str:
    defaults = (6.0, 0.99, 20, 10, "loss")
    names = ("sigmas", "decay", "warmup", "max_consecutive", "watch")
    given = [
        f"{n}={v!r}"
        for n, v, d in zip(names, (sigmas, decay, warmup, consecutive, watch), defaults, strict=True)
        if v != d
    ]
    return f"{SKIP_SPIKES}({', '.join(given)})" if given else SKIP_SPIKES


class SpikeStatistics:
    """What ``skip_spikes`` keeps in the TrainState: the moving averages of the accepted values, how many were
    accepted, the skips in a row and in all. Checkpointed through ``state_dict``; the values judged in the
    update being made (``pending``) are not: they are a call's own."""

    def __init__(self) -> None:
        self.accepted = 0
        self.mean: list[float] = []
        self.var: list[float] = []
        self.consecutive = 0
        self.skipped = 0
        self.pending: list[torch.Tensor] = []

    def judge(self, values: list[float], sigmas: float, decay: float, warmup: int) -> bool:
        """Whether ``values`` (one per watched quantity) make a spike."""
        if not all(math.isfinite(v) for v in values):
            return True
        if self.accepted < warmup:
            return False
        return any(v > m + sigmas * s for v, m, s in zip(values, self.mean, self.stds(decay), strict=True))

    def stds(self, decay: float) -> list[float]:
        """The standard deviations, corrected for the averages' start at the first value (a variance of 0 weighed
        in as ``decay ** (accepted - 1)``): early on they overestimate (the mean still moves), so a young guard
        skips less, never more."""
        weight = 1 - decay ** (self.accepted - 1)
        return [math.sqrt(v / weight) if weight > 0 else 0.0 for v in self.var]

    def accept(self, values: list[float], decay: float) -> None:
        """Fold accepted values into the averages (West's exponentially weighted mean and variance)."""
        if self.accepted == 0:
            self.mean, self.var = list(values), [0.0] * len(values)
        else:
            for i, v in enumerate(values):
                delta = v - self.mean[i]
                self.mean[i] += (1 - decay) * delta
                self.var[i] = decay * (self.var[i] + (1 - decay) * delta * delta)
        self.accepted += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "mean": list(self.mean),
            "var": list(self.var),
            "consecutive": self.consecutive,
            "skipped": self.skipped,
        }

    def load_state_dict(self, saved: Any) -> None:
        keys = {"accepted", "mean", "var", "consecutive", "skipped"}
        ok = isinstance(saved, dict) and set(saved) == keys
        ok = ok and all(type(saved[k]) is int and saved[k] >= 0 for k in ("accepted", "consecutive", "skipped"))
        ok = ok and all(isinstance(saved[k], list) and all(type(v) is float for v in saved[k]) for k in ("mean", "var"))
        ok = ok and len(saved["mean"]) == len(saved["var"]) and (saved["accepted"] == 0) == (not saved["mean"])
        if not ok:
            raise ValueError(
                f"{SKIP_SPIKES}: the checkpoint's spike statistics are not skip_spikes': {show(saved)}; resume a "
                "checkpoint saved by a run with ct.skip_spikes"
            )
        self.accepted, self.consecutive, self.skipped = saved["accepted"], saved["consecutive"], saved["skipped"]
        self.mean, self.var = list(saved["mean"]), list(saved["var"])


class _SkipSpikes(TrainStep):
    role = "skip_spikes"
    changes_update = True  # ct.check keeps it in the plain step it compares with

    def __init__(self, inner: TrainStep, label: str, settings: tuple[float, float, int, int, str]) -> None:
        self.label = label
        self.sigmas, self.decay, self.warmup, self.max_consecutive, self.watch = settings
        self.watched = _WATCH[self.watch]
        super().__init__(inner)

    def verify(self, state: TrainState, done: Pass, ctx: Context) -> None:
        """The update's values, kept on the device for the update phase (after every process passed its checks,
        so every process reaches the gathering): the whole update's loss, the gradients' global norm."""
        super().verify(state, done, ctx)
        values = []
        for name in self.watched:
            if name == "loss":
                values.append(done.loss.detach().reshape(()))
            else:
                grads = [p.grad for p in clipped(state) if p.grad is not None]
                norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
                if hasattr(norm, "full_tensor"):  # a DTensor (ct.sharded): the global norm
                    norm = norm.full_tensor()
                values.append(norm.to(values[0].device) if values else norm)
        self._statistics(state).pending = values

    def update(self, state: TrainState, ctx: Context) -> Update:
        stats = self._statistics(state)
        mine = torch.stack([v.to(torch.float64) for v in stats.pending]).tolist()  # the one host sync
        stats.pending = []
        everyone = ctx.gather(mine) if ctx.gather is not None else [mine]  # every process judges the same numbers
        values = []
        for i, name in enumerate(self.watched):
            column = [theirs[i] for theirs in everyone]
            # the global loss: the mean of every process's share (ct.distributed's out.loss); the norm is global
            # already, and the same on every process
            values.append(sum(column) / len(column) if name == "loss" else max(column))
        spike = stats.judge(values, self.sigmas, self.decay, self.warmup)
        applied = self._inner().update(state, ctx._replace(skip_update=True) if spike else ctx)
        if spike:
            stats.consecutive += 1
            stats.skipped += 1
        else:
            stats.consecutive = 0
            stats.accept(values, self.decay)
        if stats.consecutive >= self.max_consecutive:
            shown = ", ".join(f"{n} {v:.6g}" for n, v in zip(self.watched, values, strict=True))
            averages = (
                ", ".join(  # none before the first accepted update: no averages yet
                    f"{n} mean {m:.6g} (std {s:.3g})"
                    for n, m, s in zip(self.watched, stats.mean, stats.stds(self.decay), strict=True)
                )
                if stats.mean
                else ""
            )
            raise FloatingPointError(
                f"{self!r}: {stats.consecutive} updates in a row were skipped as spikes (the last: {shown}; "
                f"accepted so far: {averages or 'none'}); the run has diverged or the data changed: lower the "
                "learning rate, check the data at these steps, resume from an earlier checkpoint, or raise "
                "sigmas or max_consecutive"
            )
        return Update(True, applied.metrics) if spike else applied

    def setup(self, state: TrainState) -> None:
        """Every rank judges alike, or none starts (each would skip other updates: the models would part)."""
        super().setup(state)
        group_world(None, self)  # a launch of several processes that never joined is refused
        settings = (self.sigmas, self.decay, self.warmup, self.max_consecutive, self.watch)
        everyone = differing(settings)
        if everyone is not None and any(s != everyone[0] for s in everyone):
            shown = ", ".join(f"rank {r} {_label(*s)}" for r, s in enumerate(everyone))
            raise ValueError(
                f"{SKIP_SPIKES}: the ranks' ct.skip_spikes differ: {shown}; each would skip other updates and the "
                "models would part: build it with the same settings on every rank"
            )

    def _statistics(self, state: TrainState) -> SpikeStatistics:
        return state.transform_state(self.role, SpikeStatistics)

    def _config(self) -> tuple[Any, ...]:
        return (self.sigmas, self.decay, self.warmup, self.max_consecutive, self.watch)

"""What ``ct.check`` reports (internal to ``composetrain.checking``, which exports it): the largest difference
of one quantity (``Gap``) and the whole finding (``CheckResult``), as it prints."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch


class Gap(NamedTuple):
    """The largest absolute difference of one quantity (``largest``), where it is (a parameter's name, or
    "loss"), and the reference's largest magnitude in that tensor (``scale``: its tolerance is relative to it;
    each tensor is judged by its own, and the one furthest past its tolerance is reported)."""

    largest: float
    where: str
    scale: float

    @property
    def relative(self) -> float:
        return self.largest / self.scale if self.scale > 0 else (0.0 if self.largest == 0 else math.inf)

    def __repr__(self) -> str:
        return f"{self.largest:.3g} (relative {self.relative:.3g}, at {self.where!r})"


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What ``ct.check`` found; true when the composition's update is the plain step's within the tolerance.

    Attributes:
        ok: every tensor's gap within ``atol + rtol * (the reference's largest magnitude in that tensor)``.
        step: the composition, as it prints; ``reference``: what it was compared with.
        dtype: the precision of the copies; ``rtol``, ``atol``: the tolerance.
        loss, grads, params: the largest differences (``Gap``) in the reported loss, in the gradients the update
            phase receives, and in the parameters after the update.
        buffers: the largest difference in the model's buffers after the update (BatchNorm's running statistics
            and count: a composition that runs the forward once too often shows only here); None: it has none.
        diverges_at: the first layer, from the inside out, whose update differs from its reference (None: none).
        layers: each peeled composition checked and whether it agreed, innermost first (only when one diverges).
        reason: why no layer is to blame, when the plain step differs from itself (None: it does not).
        lowest: the lowest precision involved, which the default tolerance follows: the copies', the loss's
            where the step computes it lower (transformers' float32 ``.loss``), mixed_precision's autocast.
        update: where ``lowest`` is below the copies' precision, the largest difference of the parameters from
            the plain step's update phase given the composition's own gradients, judged at the copies' tolerance
            (``update_tolerance``: rtol, atol): a wrong update phase that moves a parameter by less than the
            lowest precision's tolerance of its size shows here (None: not compared, nothing rounds lower).
    """

    ok: bool
    step: str
    reference: str
    dtype: torch.dtype
    rtol: float
    atol: float
    loss: Gap
    grads: Gap
    params: Gap
    buffers: Gap | None = None
    diverges_at: str | None = None
    layers: tuple[tuple[str, bool], ...] = ()
    reason: str | None = None
    lowest: torch.dtype | None = None
    update: Gap | None = None
    update_tolerance: tuple[float, float] | None = None

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        verdict = "agrees with" if self.ok else "DIFFERS from"
        low = "" if self.lowest in (None, self.dtype) else f", the lowest precision involved: {_name(self.lowest)}"
        lines = [
            f"check: {self.step} {verdict} {self.reference} in {_name(self.dtype)} "
            f"(rtol={self.rtol:g}, atol={self.atol:g}{low})",
            f"  loss:       {self.loss!r}",
            f"  gradients:  {self.grads!r}",
            f"  parameters: {self.params!r}",
        ]
        if self.buffers is not None:
            lines.append(f"  buffers:    {self.buffers!r}")
        if self.update is not None and self.update_tolerance is not None:
            rtol, atol = self.update_tolerance
            lines.append(f"  update phase, given the same gradients: {self.update!r} (rtol={rtol:g}, atol={atol:g})")
        if self.diverges_at is not None:
            lines.append(f"  first diverging layer: {self.diverges_at}")
            lines += [f"    {'ok  ' if agreed else 'DIFF'} {printed}" for printed, agreed in self.layers]
        if self.reason is not None:
            lines.append(f"  {self.reason}")
        return "\n".join(lines)


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


# both are composetrain.checking's public names: they print and pickle as its own, as before this module was split off
Gap.__module__ = CheckResult.__module__ = "composetrain.checking"

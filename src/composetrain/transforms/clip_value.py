"""clip_grad_value: clamp every gradient element to [-clip_value, clip_value] before the update."""

from __future__ import annotations

from typing import Any

import torch

from composetrain.core.protocol import Context, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import CLIP_GRAD_VALUE, check_real, show
from composetrain.transforms.clip import clipped

__all__ = ["clip_grad_value"]


@transform_factory
def clip_grad_value(clip_value: float, *, foreach: bool | None = None) -> Transform:
    """Clamp each gradient element to ``[-clip_value, clip_value]``: ``torch.nn.utils.clip_grad_value_``, timm's
    ``--clip-mode value`` (``dispatch_clip_grad(parameters, value, mode="value")``), bit for bit.

    As ``clip_grad_norm``, it clips in the update phase: after ``mixed_precision`` has unscaled the gradients and
    ``distributed`` has synchronised them, so it sees the true gradients of the whole batch in any nesting order;
    an update ``mixed_precision`` skips (its gradients not finite, found before any clipping) stays skipped. The
    gradients clamped are those ``clip_grad_norm`` sums over: the model's parameters that have one, then any
    tensor the optimizer updates outside the model.

    Args:
        clip_value: the largest absolute value a gradient element keeps, a positive number.
        foreach: as ``clip_grad_value_``'s: None picks the foreach kernels where the device has them.

    Returns:
        A transform: ``clip_grad_value(0.5)(step) -> TrainStep``.

    Example:
        >>> train = ct.compose(ct.clip_grad_value(0.5), ct.mixed_precision, ct.accumulate(micro_batch=64))(step)
    """
    refuse_step(clip_value, CLIP_GRAD_VALUE, "clip_value", "clip_grad_value(0.5)")
    clip_value = check_real(clip_value, CLIP_GRAD_VALUE, "clip_value", example="clip_grad_value(0.5)")
    if foreach is not None and not isinstance(foreach, bool):
        raise TypeError(
            f"{CLIP_GRAD_VALUE}: foreach must be True, False or None, got {show(foreach)}; e.g. foreach=None"
        )
    label = f"{CLIP_GRAD_VALUE}({clip_value}{'' if foreach is None else f', foreach={foreach}'})"
    return Transform(label, lambda step: _ClipGradValue(step, label, clip_value, foreach))


class _ClipGradValue(TrainStep):
    role = "clip_grad_value"
    changes_update = True

    def __init__(self, inner: TrainStep, label: str, clip_value: float, foreach: bool | None) -> None:
        self.label, self.clip_value, self.foreach = label, clip_value, foreach
        super().__init__(inner)

    def update(self, state: TrainState, ctx: Context) -> Update:
        with torch.no_grad():
            torch.nn.utils.clip_grad_value_(clipped(state), self.clip_value, foreach=self.foreach)
        return self._inner().update(state, ctx)

    def _config(self) -> tuple[Any, ...]:
        return (self.clip_value, self.foreach)

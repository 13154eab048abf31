"""clip_grad_norm: clip the global gradient norm before the update, report it."""

from __future__ import annotations

from typing import Any

import torch

from composetrain.core.protocol import Context, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import check_real

__all__ = ["clip_grad_norm"]


@transform_factory
def clip_grad_norm(max_norm: float, *, norm_type: float = 2.0) -> Transform:
    """Scale the gradients so that their global norm is at most ``max_norm``, like optax's
    ``clip_by_global_norm``; the norm before clipping is reported as ``out.metrics["grad_norm"]``.

    Clipping happens in the update phase, after ``mixed_precision`` has unscaled the
    gradients (it does so once, after the last backward) and after ``distributed``
    has synchronised them, so it always sees the true gradients of the whole batch,
    in any nesting order. On an update that ``mixed_precision`` skips, the reported
    norm is not finite. It is ``torch.nn.utils.clip_grad_norm_`` over the
    optimizer's parameters; reading the norm is left to whoever logs it (no host sync).

    Args:
        max_norm: the largest global norm allowed, a positive number.
        norm_type: the norm's order (2.0, or ``inf`` for the largest absolute value).

    Returns:
        A transform: ``clip_grad_norm(1.0)(step) -> TrainStep``.

    Example:
        >>> train = ct.compose(ct.clip_grad_norm(1.0), ct.mixed_precision, ct.accumulate(4))(step)
        >>> train(state, batch).metrics["grad_norm"]
    """
    refuse_step(max_norm, "clip_grad_norm", "max_norm", "clip_grad_norm(1.0)")
    max_norm = check_real(max_norm, "clip_grad_norm", "max_norm", example="1.0")
    norm_type = check_real(norm_type, "clip_grad_norm", "norm_type", finite=False, example="2.0, or float('inf')")
    label = f"clip_grad_norm({max_norm})" if norm_type == 2.0 else f"clip_grad_norm({max_norm}, norm_type={norm_type})"
    return Transform(label, lambda step: _ClipGradNorm(step, label, float(max_norm), float(norm_type)))


class _ClipGradNorm(TrainStep):
    role = "clip_grad_norm"
    reports = frozenset({"grad_norm"})

    def __init__(self, inner: TrainStep, label: str, max_norm: float, norm_type: float) -> None:
        self.label = label
        self.max_norm = max_norm
        self.norm_type = norm_type
        super().__init__(inner)

    def update(self, state: TrainState, ctx: Context) -> Update:
        params = [p for group in state.optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_norm, norm_type=self.norm_type)
        if hasattr(norm, "full_tensor"):  # a DTensor (gradients sharded by ct.sharded): already the global norm
            norm = norm.full_tensor()
        applied = self._inner().update(state, ctx)
        return Update(applied.skipped, {**applied.metrics, "grad_norm": norm})

    def _config(self) -> tuple[Any, ...]:
        return (self.max_norm, self.norm_type)

"""clip_grad_norm: clip the global gradient norm before the update, report it."""

from __future__ import annotations

from typing import Any

import torch

from composetrain.core.protocol import Context, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import CLIP_GRAD_NORM, check_real, show

__all__ = ["clip_grad_norm"]


@transform_factory
def clip_grad_norm(max_norm: float, *, norm_type: float = 2.0, foreach: bool | None = None) -> Transform:
    """Scale the gradients so that their global norm is at most ``max_norm``, like optax's
    ``clip_by_global_norm``; the norm before clipping is reported as ``out.metrics["grad_norm"]``.

    Clipping happens in the update phase, after ``mixed_precision`` has unscaled the
    gradients (it does so once, after the last backward) and after ``distributed``
    has synchronised them, so it always sees the true gradients of the whole batch,
    in any nesting order. On an update that ``mixed_precision`` skips, the reported
    norm is not finite. Reading the norm is left to whoever logs it (no host sync).

    It is ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``, summed in the same order:
    the model's parameters that have a gradient, in ``model.parameters()`` order (frozen ones have none;
    one the optimizer does not update counts, as in the plain loop), then any tensor the optimizer
    updates outside the model, in its groups' order. A port of a loop that clips
    ``model.parameters()`` is bit-identical whatever the optimizer's groups (a no-decay group first
    changes the last bit of a norm summed in group order, and a chaotic run carries that to percents).
    Under ``ct.sharded`` the norm is the global one, over every rank's shards. torch's
    ``error_if_nonfinite`` has its equivalent in ``mixed_precision``, which skips an update whose
    gradients are not finite (and raises after ``max_consecutive_skips``).

    Args:
        max_norm: the largest global norm allowed, a positive number.
        norm_type: the norm's order (2.0, or ``inf`` for the largest absolute value).
        foreach: as ``clip_grad_norm_``'s: None picks the foreach kernels where the device has them
            (CUDA), True insists on them, False never uses them.

    Returns:
        A transform: ``clip_grad_norm(1.0)(step) -> TrainStep``.

    Example:
        >>> train = ct.compose(ct.clip_grad_norm(1.0), ct.mixed_precision, ct.accumulate(4))(step)
        >>> train(state, batch).metrics["grad_norm"]
    """
    refuse_step(max_norm, CLIP_GRAD_NORM, "max_norm", "clip_grad_norm(1.0)")
    max_norm = check_real(max_norm, CLIP_GRAD_NORM, "max_norm", example="1.0")
    norm_type = check_real(norm_type, CLIP_GRAD_NORM, "norm_type", finite=False, example="2.0, or float('inf')")
    if foreach is not None and not isinstance(foreach, bool):
        raise TypeError(
            f"{CLIP_GRAD_NORM}: foreach must be True, False or None, got {show(foreach)}; e.g. foreach=None"
        )
    options = [str(max_norm)]
    if norm_type != 2.0:
        options.append(f"norm_type={norm_type}")
    if foreach is not None:
        options.append(f"foreach={foreach}")
    label = f"{CLIP_GRAD_NORM}({', '.join(options)})"
    return Transform(label, lambda step: _ClipGradNorm(step, label, float(max_norm), float(norm_type), foreach))


class _ClipGradNorm(TrainStep):
    role = "clip_grad_norm"
    reports = frozenset({"grad_norm"})
    changes_update = True

    def __init__(self, inner: TrainStep, label: str, max_norm: float, norm_type: float, foreach: bool | None) -> None:
        self.label = label
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.foreach = foreach
        super().__init__(inner)

    def update(self, state: TrainState, ctx: Context) -> Update:
        norm = torch.nn.utils.clip_grad_norm_(
            clipped(state), self.max_norm, norm_type=self.norm_type, foreach=self.foreach
        )
        if hasattr(norm, "full_tensor"):  # a DTensor (gradients sharded by ct.sharded): already the global norm
            norm = norm.full_tensor()
        applied = self._inner().update(state, ctx)
        return Update(applied.skipped, {**applied.metrics, "grad_norm": norm})

    def _config(self) -> tuple[Any, ...]:
        return (self.max_norm, self.norm_type, self.foreach)


def clipped(state: TrainState) -> list[torch.Tensor]:
    """The tensors whose gradients the norm is over, in the order its sum takes them: the model's parameters
    with a gradient in ``model.parameters()`` order (the plain loop's ``clip_grad_norm_(model.parameters())``:
    the order of a floating-point sum is part of the result), then the optimizer's others, in group order."""
    model = list(state.model.parameters())
    inside = {id(p) for p in model}
    outside = [p for group in state.optimizer.param_groups for p in group["params"] if id(p) not in inside]
    return [p for p in (*model, *outside) if p.grad is not None]

"""adaptive_clip_grad: adaptive gradient clipping (NFNets' AGC), unit by unit, before the update."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from composetrain.core.protocol import Context, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import ADAPTIVE_CLIP_GRAD, check_real, name, show
from composetrain.transforms.clip import clipped

__all__ = ["adaptive_clip_grad"]

Exclude = Callable[[str], bool] | Iterable[str] | None


@transform_factory
def adaptive_clip_grad(
    clip_factor: float, *, eps: float = 1e-3, norm_type: float = 2.0, exclude: Exclude = None
) -> Transform:
    """Adaptive gradient clipping (Brock et al. 2021, NFNets): each unit's gradient (a row of a weight: its norm
    over every dimension but the first; a whole bias) is scaled down to at most ``clip_factor`` times the unit's
    weight norm (at least ``eps``). Bit for bit timm's ``adaptive_clip_grad``, ``--clip-mode agc``.

    As ``clip_grad_norm``, it clips in the update phase, on the unscaled gradients of the whole batch, in any
    nesting order. timm's ``train.py`` leaves the classifier out (``model_parameters(model, exclude_head=True)``:
    the model's last two parameters): give their names to ``exclude``, e.g.
    ``exclude=[n for n, _ in model.named_parameters()][-2:]``, or a predicate of the name. A name the model lacks
    is refused before the first update.

    Args:
        clip_factor: the largest ratio of a unit's gradient norm to its weight norm, a positive number (timm's
            ``--clip-grad``, 0.01 for NFNets).
        eps: the smallest weight norm a unit counts with (a zero-initialised unit may still move).
        norm_type: the norm's order.
        exclude: parameter names to leave unclipped, or a function of a name that says so; None: none.

    Returns:
        A transform: ``adaptive_clip_grad(0.01)(step) -> TrainStep``.

    Example:
        >>> head = [n for n, _ in model.named_parameters()][-2:]
        >>> train = ct.adaptive_clip_grad(0.01, exclude=head)(ct.mixed_precision(step))
    """
    refuse_step(clip_factor, ADAPTIVE_CLIP_GRAD, "clip_factor", "adaptive_clip_grad(0.01)")
    clip_factor = check_real(clip_factor, ADAPTIVE_CLIP_GRAD, "clip_factor", example="adaptive_clip_grad(0.01)")
    eps = check_real(eps, ADAPTIVE_CLIP_GRAD, "eps", example="eps=1e-3")
    norm_type = check_real(norm_type, ADAPTIVE_CLIP_GRAD, "norm_type", finite=False, example="norm_type=2.0")
    excluded: Callable[[str], bool] | tuple[str, ...] = ()
    if callable(exclude):
        excluded = exclude
    elif exclude is not None:
        names = tuple(exclude) if isinstance(exclude, Iterable) and not isinstance(exclude, (str, bytes)) else None
        if names is None or not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"{ADAPTIVE_CLIP_GRAD}: exclude must be parameter names (a list of str), a function of a name, or "
                f"None, got {show(exclude)}; e.g. exclude=['fc.weight', 'fc.bias'] (timm leaves the head out)"
            )
        excluded = names
    options = [repr(clip_factor)]
    for key, value, default in (("eps", eps, 1e-3), ("norm_type", norm_type, 2.0)):
        if value != default:
            options.append(f"{key}={value!r}")
    if excluded:
        options.append(f"exclude={name(excluded) if callable(excluded) else list(excluded)!r}")
    label = f"{ADAPTIVE_CLIP_GRAD}({', '.join(options)})"
    return Transform(label, lambda step: _AdaptiveClipGrad(step, label, clip_factor, eps, norm_type, excluded))


class _AdaptiveClipGrad(TrainStep):
    role = "adaptive_clip_grad"
    changes_update = True

    def __init__(
        self,
        inner: TrainStep,
        label: str,
        clip_factor: float,
        eps: float,
        norm_type: float,
        excluded: Callable[[str], bool] | tuple[str, ...],
    ) -> None:
        self.label, self.clip_factor, self.eps, self.norm_type = label, clip_factor, eps, norm_type
        self.excluded = excluded
        super().__init__(inner)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        ctx = self._inner().prepare(state, batch, ctx)  # the inner steps first: they may shard or place the model
        if isinstance(self.excluded, tuple):
            names = [n for n, _ in state.model.named_parameters()]
            missing = [n for n in self.excluded if n not in names]
            if missing:  # refused before the forward: nothing has changed yet
                raise ValueError(
                    f"{self!r}: exclude names {missing}, which are not parameters of the model (its parameters: "
                    f"{names[:8]}{' ...' if len(names) > 8 else ''}); give their names as model.named_parameters() "
                    "has them"
                )
        if any(type(p).__name__ == "DTensor" for p in state.model.parameters()):
            raise ValueError(
                f"{self!r}: the model is sharded (ct.sharded): a unit's norm would be reduced over the ranks' shards, "
                "which is not measured against one process here; use ct.distributed with it"
            )
        return ctx

    def update(self, state: TrainState, ctx: Context) -> Update:
        skip = self._skipped(state)
        with torch.no_grad():
            for p in clipped(state):
                if id(p) not in skip:
                    self._clip(p)
        return self._inner().update(state, ctx)

    def _skipped(self, state: TrainState) -> set[int]:
        named = state.model.named_parameters()
        if callable(self.excluded):
            return {id(p) for n, p in named if self.excluded(n)}
        return {id(p) for n, p in named if n in self.excluded}

    def _clip(self, p: torch.Tensor) -> None:
        """One tensor's units, in the ops of timm's ``adaptive_clip_grad`` (the same ops give the same bits)."""
        assert p.grad is not None  # for the type checker: clipped() holds the tensors with a gradient
        weights, grads = p.detach(), p.grad.detach()
        max_norm = _unit_norms(weights, self.norm_type).clamp_(min=self.eps).mul_(self.clip_factor)
        norm = _unit_norms(grads, self.norm_type)
        scaled = grads * (max_norm / norm.clamp(min=1e-6))
        p.grad.detach().copy_(torch.where(norm < max_norm, grads, scaled))

    def _config(self) -> tuple[Any, ...]:
        return (self.clip_factor, self.eps, self.norm_type, self.excluded)


def _unit_norms(x: torch.Tensor, norm_type: float) -> torch.Tensor:
    """The norm of each unit: of a 0- or 1-dim tensor whole, else of each slice along the first dimension (a
    linear or convolution layer's output unit), kept broadcastable to ``x``."""
    if x.ndim <= 1:
        return x.norm(norm_type)
    return x.norm(norm_type, dim=tuple(range(1, x.ndim)), keepdim=True)

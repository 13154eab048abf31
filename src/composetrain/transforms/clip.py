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
    Under ``ct.sharded`` the norm is the global one, over every rank's shards; under ``ct.tensor_parallel``
    (gradients on several meshes, which torch's function cannot add up) it adds each mesh's norm, every piece
    once, and under ``ct.pipeline`` every stage's (a weight tied across stages once). torch's
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
        tensors = clipped(state)
        if ctx.model_parts is None and len({_layout(p.grad) for p in tensors}) <= 1:
            # plain gradients, or DTensors of one mesh (sharded, HSDP): torch's own, bit for bit
            norm = torch.nn.utils.clip_grad_norm_(
                tensors, self.max_norm, norm_type=self.norm_type, foreach=self.foreach
            )
            if hasattr(norm, "full_tensor"):  # a DTensor (gradients sharded by ct.sharded): already the global norm
                norm = norm.full_tensor()
        else:
            norm = global_norm(tensors, self.norm_type, self.foreach, ctx.model_parts)
            _scale(tensors, self.max_norm, norm, self.foreach)
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


def _layout(t: Any) -> Any:
    """The mesh a DTensor lies on (its identity), or None for a plain tensor."""
    mesh = getattr(t, "device_mesh", None)
    return None if mesh is None else id(mesh)


def global_norm(tensors: list[torch.Tensor], norm_type: float, foreach: bool | None, parts: Any) -> torch.Tensor:
    """The norm of every gradient of the model, on every process alike: each mesh's gradients by torch's
    ``get_total_norm`` (a DTensor's gathered over its mesh, once per mesh), the meshes' norms combined, and with
    ``parts`` (a model split across processes) every part's, a weight held by several parts counted once."""
    counted = tensors if parts is None else parts.counted(tensors)
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for p in counted:
        assert p.grad is not None  # clipped() gives those with a gradient
        by_mesh.setdefault(_layout(p.grad), []).append(p.grad)
    first = tensors[0].grad if tensors else None
    device = first.device if first is not None else torch.device("cpu")
    norms = []
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type, foreach=foreach)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    dtype = first.dtype if first is not None else torch.float32
    total = (
        torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
        if norms
        else torch.zeros((), dtype=dtype, device=device)
    )
    if parts is not None:
        total = parts.combined(total, norm_type)
    return total


def _scale(tensors: list[torch.Tensor], max_norm: float, norm: torch.Tensor, foreach: bool | None) -> None:
    """``clip_grads_with_norm_`` (the same coefficient, ``max_norm / (norm + 1e-6)`` capped at 1), one mesh's
    gradients at a time: torch's scales them all in one call, which DTensors of different meshes refuse."""
    from torch.distributed.tensor.experimental import implicit_replication

    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for p in tensors:
        by_mesh.setdefault(_layout(p.grad), []).append(p)
    with implicit_replication():  # the coefficient, a plain tensor, scales DTensor gradients alike everywhere
        for params in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=foreach)

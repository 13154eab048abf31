"""``ct.check``'s comparison (internal to ``composetrain.checking``): a composition peeled into its layers, the
reference built from the plain step and the layers that change the update, and both run on fresh copies with
the gradients the update phase receives kept, compared as the largest differences (``Gap``)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from composetrain.checking._copies import copy_state, dense
from composetrain.checking._result import Gap
from composetrain.core.protocol import Context, TrainStep, Update
from composetrain.core.rng import capture_rng, restore_rng
from composetrain.core.state import TrainState


def peel(step: TrainStep) -> tuple[list[TrainStep], TrainStep]:
    """The layers of a composition, outermost first, and the lifted plain step inside them."""
    layers = []
    while step.inner is not None:
        layers.append(step)
        step = step.inner
    return layers, step


def reference_step(layers: list[TrainStep], plain: TrainStep) -> TrainStep:
    """The plain step with the layers that change the update itself around it, in their order."""
    step = plain
    for layer in reversed(layers):
        if layer.changes_update:
            step = _rewrapped(layer, step)
    return step


def _rewrapped(layer: TrainStep, inner: TrainStep) -> TrainStep:
    """``layer`` around another inner step: a copy of its configuration (closures and attributes hold only
    that; its state lives in the TrainState), its identity rebuilt by TrainStep around ``inner``."""
    own_weight = layer.weight if layer.inner is None or layer.weight is not layer.inner.weight else None
    new = copy.copy(layer)
    TrainStep.__init__(new, inner, weight=own_weight)
    return new


class _Probe(TrainStep):
    """Outermost: keeps the gradients the update phase receives (after every pass, before any update), and
    hands it ``given`` ones instead where asked (the plain update phase of another step's gradients)."""

    def __init__(
        self,
        inner: TrainStep,
        kept: dict[str, torch.Tensor | None],
        given: Mapping[str, torch.Tensor | None] | None = None,
    ) -> None:
        self.kept, self.given = kept, given
        super().__init__(inner)

    def update(self, state: TrainState, ctx: Context) -> Update:
        for name, p in state.model.named_parameters():
            self.kept[name] = None if p.grad is None else dense(p.grad.detach()).to("cpu", copy=True)
            if self.given is not None:
                g, sparse = self.given.get(name), p.grad is not None and p.grad.is_sparse
                p.grad = None if g is None else g.to(p.device, p.dtype, copy=True)
                if sparse and p.grad is not None:  # as the optimizer expects it (SparseAdam)
                    p.grad = p.grad.to_sparse()
        return self._inner().update(state, ctx)

    def __repr__(self) -> str:  # what an error of the step inside names: check, and the step it runs
        return f"check: {self.inner!r}"


# the gaps of one comparison, per tensor: loss, gradients, parameters, buffers (None: the model has none), and
# the parameters against the plain update phase of the composition's own gradients (None: not compared)
Gaps = tuple[list[Gap], list[Gap], list[Gap], list[Gap] | None, list[Gap] | None]


def compare(
    step: TrainStep,
    reference: TrainStep,
    state: TrainState,
    batch: Any,
    dtype: torch.dtype | None,
    update: bool = False,
) -> tuple[Gaps, torch.dtype, torch.dtype]:
    """Both steps on fresh copies: the gaps in loss, gradients, parameters and buffers, per tensor; the copies'
    dtype; and the lowest precision involved (the copies', or the loss's where the step computes it lower:
    transformers' float32 ``.loss`` of a float64 model). The reference runs first: a model that refuses
    ``dtype`` fails there, before the composition changes anything.

    Where the gradients round lower than the copies (that loss, an autocast), they are judged at that precision,
    and so would be the parameters, relative to their own size: a wrong update phase that moves them by less
    would pass. So the reference runs a third time with the composition's gradients handed to its update phase,
    and the composition's parameters are compared with those too (at the copies' precision, by the caller);
    ``update``: always (a layer peeled from a composition that needed it: the autocast may be outside it)."""
    used = _dtype_of(state, dtype)
    runs: list[tuple[torch.Tensor, dict[str, torch.Tensor | None], dict[str, torch.Tensor], dict[str, torch.Tensor]]]
    runs, rng, losses = [], capture_rng(), list[torch.dtype]()
    for s in (reference, step, reference):
        if len(runs) == 2:
            low = coarsest([used, *losses])
            lower = "mixed_precision" in step.roles and used is not torch.float64  # autocast leaves float64 alone
            if not (update or lower or torch.finfo(low).eps > torch.finfo(used).eps):
                break
        restore_rng(rng)  # both draw the same random numbers (dropout): the user's generators, left as they were
        copied, data = copy_state(state, batch, dtype)
        grads: dict[str, torch.Tensor | None] = {}
        with warnings.catch_warnings():
            # a copied optimizer's step() lost the wrapper its scheduler counts calls with (Optimizer pickles
            # without it), so the scheduler's first step() would warn of a wrong call order that is not there
            warnings.filterwarnings("ignore", message=r"Seems like `optimizer.step\(\)` has been overridden")
            try:
                out = _Probe(s, grads, runs[1][1] if len(runs) == 2 else None)(copied, data)
            except torch.OutOfMemoryError as e:
                if s is not reference or runs:
                    raise
                raise torch.OutOfMemoryError(
                    f"check: the plain step {reference!r} runs out of memory on this batch ({e}): check compares "
                    "your composition with the plain step's update of the whole batch in one pass (accumulate's "
                    "pieces too), so that must fit; check on a smaller batch"
                ) from e
        losses.append(out.loss.dtype)
        if not runs and not _finite(out.loss, grads):
            raise ValueError(
                f"check: the plain step's own update on this batch ({reference!r}) is not finite (loss "
                f"{float(out.loss):g}, or a gradient): every layer would differ from it, none is to blame; check "
                "on a batch the plain step trains on"
            )
        params = {n: p.detach().to("cpu", copy=True) for n, p in copied.model.named_parameters()}
        buffers = {n: b.detach().to("cpu", copy=True) for n, b in copied.model.named_buffers()}
        runs.append((out.loss.detach().to("cpu", torch.float64), grads, params, buffers))
    restore_rng(rng)
    (ref_loss, ref_grads, ref_params, ref_buffers), (loss, grads, params, buffers) = runs[:2]
    loss_gap = float((loss - ref_loss).abs())
    gaps = (
        [Gap(loss_gap, "loss", float(ref_loss.abs()))],
        _per_tensor(grads, ref_grads),
        _per_tensor(params, ref_params),
        _per_tensor(buffers, ref_buffers) if ref_buffers else None,
        _per_tensor(params, runs[2][2]) if len(runs) == 3 else None,
    )
    return gaps, used, coarsest([used, *losses[:2]])


def _finite(loss: torch.Tensor, grads: Mapping[str, torch.Tensor | None]) -> bool:
    return bool(loss.isfinite().all()) and all(g is None or bool(g.isfinite().all()) for g in grads.values())


def _per_tensor(got: Mapping[str, torch.Tensor | None], want: Mapping[str, torch.Tensor | None]) -> list[Gap]:
    """Each tensor's largest element-wise difference and the reference's largest magnitude in it (a small
    tensor's tolerance is its own, not the largest tensor's); a tensor on one side only (a gradient that is
    None on the other) differs by its magnitude. NaN is the largest."""
    gaps = []
    for name in want:
        a, b = got.get(name), want[name]
        if a is None and b is None:
            continue
        ref = _wide(b if b is not None else torch.zeros_like(a))  # type: ignore[arg-type]
        mine = _wide(a if a is not None else torch.zeros_like(ref))
        if ref.numel():
            gaps.append(Gap(float((mine - ref).abs().max()), name, float(ref.abs().max())))
    return gaps


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64, or complex128 (``.double()`` would drop an imaginary part)."""
    return t.to(torch.complex128) if t.is_complex() else t.double()


def _dtype_of(state: TrainState, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    floats = [p.dtype for p in state.model.parameters() if p.is_floating_point()]
    return coarsest(floats) if floats else torch.float32


def coarsest(dtypes: list[torch.dtype]) -> torch.dtype:
    """The lowest precision among floating dtypes (the largest machine epsilon); others are ignored."""
    return max((d for d in dtypes if d.is_floating_point), key=lambda d: torch.finfo(d).eps)

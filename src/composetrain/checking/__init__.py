"""ct.check: a composition's update compared with the plain step's, on copies, and the first layer that diverges.

The library's equivalence properties (DESIGN 2.1), made a tool for a user's own setup: their step, model,
optimizer and batch, through their composition and through ``ct.train_step`` alone, on deep copies (in
float64 where the model allows), compared in loss, gradients (as the update phase receives them: after
accumulation, unscaling and synchronisation, before clipping) and parameters and buffers after the update. When they
differ, the composition is peeled from the inside out (``TrainStep.inner``): each layer around the plain step,
then the next around that, until the first whose update differs from its reference: that layer diverges.

Here: the arguments, the order of the comparisons and the tolerance. Beside it in this folder, internal: ``_result``
(``Gap``, ``CheckResult`` and its printout), ``_copies`` (the float64 or complex128 copies, the user's own
tensors put back), ``_peeling`` (the layers, the reference, one comparison of two steps).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
import torch.distributed as dist

from composetrain.checking._copies import Untouched
from composetrain.checking._peeling import Gaps, coarsest, compare, peel, reference_step
from composetrain.checking._result import CheckResult, Gap
from composetrain.core.protocol import TrainStep
from composetrain.core.rng import capture_rng, restore_rng
from composetrain.core.state import TrainState
from composetrain.core.steps import PlainStep, lift
from composetrain.core.util import show

__all__ = ["CheckResult", "Gap", "check"]


# (rtol, atol) of each tensor's comparison, by the lowest precision the update computes in
TOLERANCES = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-6),
    torch.bfloat16: (5e-2, 1e-3),
    torch.float16: (1e-2, 1e-4),
}


def check(
    train_step: PlainStep | TrainStep,
    state: TrainState,
    batch: Any,
    *,
    dtype: torch.dtype | None = torch.float64,
    rtol: float | None = None,
    atol: float | None = None,
) -> CheckResult:
    """Compare one update of ``train_step`` with ``ct.train_step`` of its plain step, on copies of ``state``
    and ``batch`` (yours are left untouched), and name the first layer that diverges.

    The plain step is the composition's innermost; transforms that change the update itself (their class
    sets ``changes_update``: ``clip_grad_norm``) are kept around it in the reference. A composition that
    synchronises several processes (``distributed``, ``sharded`` under a process group of more than one) is
    refused: check it in one process, where they are the plain step, or check the part inside them.

    Args:
        train_step: your composition (or a plain step: it is then compared with itself).
        state: your TrainState, copied (model, optimizer, scheduler, step and transform state).
        batch: one batch, copied (floating tensors cast to ``dtype``).
        dtype: the precision of the copies, float64 by default (where the model allows: if the plain step fails
            in float64 they keep their own); None keeps the model's. ``mixed_precision``'s autocast leaves
            float64 alone: its rounding is checked with ``dtype=None`` (then with the 16-bit tolerance).
        rtol: the relative tolerance of each tensor (relative to its own largest magnitude), by default by the
            lowest precision involved: the copies', or the loss's where the step computes it lower (transformers'
            float32 ``.loss`` of a float64 model), or mixed_precision's (float64: 1e-9).
        atol: the absolute tolerance of each tensor, chosen with ``rtol`` (float64: 1e-12).

    Returns:
        The CheckResult (true when it agrees); print it for the numbers. When they differ because the plain step
        differs from itself (it draws from a generator of its own), no layer is named and ``reason`` says so.

    Raises:
        torch.OutOfMemoryError: the plain step does not fit the whole batch in memory (check on a smaller one).

    Example:
        >>> result = ct.check(ct.accumulate(4)(ct.clip_grad_norm(1.0)(step)), state, batch)
        >>> assert result, result
    """
    step = lift(train_step, "check", "train_step")
    if not isinstance(state, TrainState):
        raise TypeError(f"check: state must be a ct.TrainState, got {show(state)}; ct.TrainState(model, optimizer)")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"check: dtype must be a floating torch.dtype or None, got {show(dtype)}; e.g. torch.float64")
    if state.unusable is not None:
        raise RuntimeError(f"check: {state.unusable}")
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world > 1 and step.capabilities.syncs_processes:
        raise ValueError(
            f"check: {step!r} synchronises the {world} processes of the running process group, and check compares "
            "one process's update with the plain step on the same batch; run check in one process (no process "
            "group: distributed and sharded are then the plain step), or check the composition inside them"
        )
    rtol, atol = _tolerance(rtol, "rtol"), _tolerance(atol, "atol")
    layers, plain = peel(step)
    reference = reference_step(layers, plain)
    rng, own = capture_rng(), Untouched(state)
    try:
        try:
            gaps, used, low = compare(step, reference, state, batch, dtype)
        except Exception:  # the model refuses float64 (a kernel, a dtype-checked input): in its own precision
            if dtype is None:
                raise
            dtype = None
            gaps, used, low = compare(step, reference, state, batch, None)
        low = _lowest(low, step)
        # the update phase, given the same gradients, rounds as the copies do: at their tolerance (yours if given)
        tol: Tolerance = (_default(rtol, atol, low), _default(rtol, atol, used))
        rtol, atol = tol[0]
        ok, found, seen, reason = _agree(gaps, tol), None, [], None
        updates = gaps[4] is not None  # the peeled layers too: the autocast that needed it may be outside them
        if not ok:  # the plain step against itself first: one that is not deterministic differs from anything
            # copies as the first's, not in `used`
            again = compare(reference, reference, state, batch, dtype, updates)[0]
            if not _agree(again, tol):
                every = [g for quantity in again[:4] if quantity is not None for g in quantity]
                reason = _not_deterministic(reference, _worst(every, rtol, atol))
        if not ok and reason is None:
            for i in range(len(layers) - 1, -1, -1):  # innermost first: layers[i] around what is inside it
                inner = compare(layers[i], reference_step(layers[i:], plain), state, batch, dtype, updates)[0]
                agreed = _agree(inner, tol)
                seen.append((repr(layers[i]), agreed))
                if not agreed:
                    found = getattr(layers[i], "label", type(layers[i]).__name__)
                    break
    finally:  # the user's generators and tensors as they were, whatever failed
        restore_rng(rng)
        changed = own.restore()
        if changed is not None:  # from finally: the cause of any error on the way, which it replaces
            raise ValueError(
                f"check: the step changed your own model and optimizer ({changed}), not check's copies: it reaches "
                "them another way than its model argument (a global, a closure, a bound method), so check would "
                "compare copies that never trained; check put them back. Write step(model, batch) with the model "
                "it is given, and keep trained tensors inside the model"
            )
    loss, grads, params = (_worst(g, rtol, atol) for g in gaps[:3])
    buffers = None if gaps[3] is None else _worst(gaps[3], rtol, atol)
    update = None if gaps[4] is None else _worst(gaps[4], *tol[1])
    return CheckResult(
        ok,
        repr(step),
        repr(reference),
        used,
        rtol,
        atol,
        loss,
        grads,
        params,
        buffers,
        diverges_at=found,
        layers=tuple(seen),
        reason=reason,
        lowest=low,
        update=update,
        update_tolerance=tol[1],
    )


def _tolerance(value: Any, name: str) -> float | None:
    """A tolerance given (None: the dtype's), refused unless a non-negative, finite real number."""
    if value is None:
        return None
    problem = isinstance(value, bool) or not isinstance(value, numbers.Real)
    if problem or not (math.isfinite(float(value)) and float(value) >= 0):
        raise (TypeError if problem else ValueError)(
            f"check: {name} must be a non-negative, finite number, got {show(value)}; e.g. {name}=1e-6, or None "
            "(by the lowest precision involved)"
        )
    return float(value)


# (rtol, atol) of the loss, gradients, parameters and buffers; then of the update phase given the same gradients
Tolerance = tuple[tuple[float, float], tuple[float, float]]


def _default(rtol: float | None, atol: float | None, dtype: torch.dtype) -> tuple[float, float]:
    """The tolerance given, or ``dtype``'s where not."""
    own = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    return (own[0] if rtol is None else rtol), (own[1] if atol is None else atol)


def _within(gap: Gap, rtol: float, atol: float) -> bool:
    return gap.largest <= atol + rtol * gap.scale  # False for NaN; <=: equal is within a tolerance of zero


def _agree(gaps: Gaps, tol: Tolerance) -> bool:
    """Every tensor within its own tolerance (relative to its own largest magnitude); the update phase given the
    composition's own gradients at the copies' precision, the rest at the lowest."""
    (rtol, atol), (update_rtol, update_atol) = tol
    if gaps[4] is not None and not all(_within(g, update_rtol, update_atol) for g in gaps[4]):
        return False
    return all(_within(g, rtol, atol) for quantity in gaps[:4] if quantity is not None for g in quantity)


def _worst(gaps: list[Gap], rtol: float, atol: float) -> Gap:
    """The tensor furthest past its tolerance (or nearest to it, when all are within): the one reported."""

    def used(g: Gap) -> tuple[float, float]:  # the share of its tolerance a gap takes; NaN first
        bound = atol + rtol * g.scale
        share = g.largest / bound if bound > 0 else (math.inf if g.largest != 0 else 0.0)
        return (math.inf if math.isnan(g.largest) else share), (math.inf if math.isnan(g.largest) else g.largest)

    return max(gaps, key=used, default=Gap(0.0, "-", 0.0))


def _not_deterministic(reference: TrainStep, gap: Gap) -> str:
    if math.isnan(gap.largest):  # NaN differs from NaN: the plain update itself is not finite, however deterministic
        return (
            f"{reference!r}'s own update is not finite at {gap.where!r} (its gradients were): no layer is to blame; "
            "in a 16-bit model an optimizer's constant can round to 0 (Adam's eps=1e-8 in float16, which divides "
            "0 by 0): check in float64 (the default dtype), or keep the parameters in float32 under "
            "ct.mixed_precision"
        )
    return (
        f"{reference!r} is not deterministic: run twice on the same copies, with your generators replayed for "
        f"each, its own update differs ({gap!r}), so no layer is to blame; it draws from a generator of its own "
        "(a torch.Generator, numpy, random) or runs a nondeterministic kernel: draw from torch's default "
        "generator (check replays it), or set torch.use_deterministic_algorithms(True)"
    )


def _lowest(low: torch.dtype, step: TrainStep) -> torch.dtype:
    """The lowest precision the update computes in: the copies' or the loss's, or mixed_precision's autocast
    below it (autocast leaves float64 alone; "fp32" enters none; "auto", unresolved here, taken as bf16, the
    coarser of its two)."""
    if low is torch.float64 or "mixed_precision" not in step.roles:
        return low
    auto = next((getattr(s, "dtype", None) for s in peel(step)[0] if s.role == "mixed_precision"), None)
    # mixed_precision("fp32") is a no-op: its float32 lowers nothing below the copies' own
    return coarsest([low, auto if isinstance(auto, torch.dtype) else torch.bfloat16])

"""ct.check: a composition's update compared with the plain step's, on copies, and the first layer that diverges.

The library's equivalence properties (DESIGN 2.1), made a tool for a user's own setup: their step, model,
optimizer and batch, through their composition and through ``ct.train_step`` alone, on deep copies (in
float64 where the model allows), compared in loss, gradients (as the update phase receives them: after
accumulation, unscaling and synchronisation, before clipping) and parameters and buffers after the update. When they
differ, the composition is peeled from the inside out (``TrainStep.inner``): each layer around the plain step,
then the next around that, until the first whose update differs from its reference: that layer diverges.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from composetrain.core.batching import map_tensors
from composetrain.core.protocol import Context, TrainStep, Update
from composetrain.core.rng import capture_rng, restore_rng
from composetrain.core.state import TrainState
from composetrain.core.steps import PlainStep, lift
from composetrain.core.util import show

__all__ = ["CheckResult", "Gap", "check"]

# (rtol, atol) of a norm-wise comparison, by the lowest precision the update computes in
TOLERANCES = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-6),
    torch.bfloat16: (5e-2, 1e-3),
    torch.float16: (1e-2, 1e-4),
}


class Gap(NamedTuple):
    """The largest absolute difference of one quantity (``largest``), where it is (a parameter's name, or
    "loss"), and the reference's largest magnitude there (``scale``: the tolerance is relative to it)."""

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
        ok: every gap within ``atol + rtol * (the reference's largest magnitude)``.
        step: the composition, as it prints; ``reference``: what it was compared with.
        dtype: the precision of the copies; ``rtol``, ``atol``: the tolerance.
        loss, grads, params: the largest differences (``Gap``) in the reported loss, in the gradients the update
            phase receives, and in the parameters after the update.
        buffers: the largest difference in the model's buffers after the update (BatchNorm's running statistics
            and count: a composition that runs the forward once too often shows only here); None: it has none.
        diverges_at: the first layer, from the inside out, whose update differs from its reference (None: none).
        layers: each peeled composition checked and whether it agreed, innermost first (only when one diverges).
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

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        verdict = "agrees with" if self.ok else "DIFFERS from"
        lines = [
            f"check: {self.step} {verdict} {self.reference} in {str(self.dtype).removeprefix('torch.')} "
            f"(rtol={self.rtol:g}, atol={self.atol:g})",
            f"  loss:       {self.loss!r}",
            f"  gradients:  {self.grads!r}",
            f"  parameters: {self.params!r}",
        ]
        if self.buffers is not None:
            lines.append(f"  buffers:    {self.buffers!r}")
        if self.diverges_at is not None:
            lines.append(f"  first diverging layer: {self.diverges_at}")
            lines += [f"    {'ok  ' if agreed else 'DIFF'} {printed}" for printed, agreed in self.layers]
        return "\n".join(lines)


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
        rtol, atol: the tolerance, by default by the lowest precision involved (float64: 1e-9, 1e-12).

    Returns:
        The CheckResult (true when it agrees); print it for the numbers.

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
    layers, plain = _peel(step)
    rng, own = capture_rng(), _Untouched(state)
    try:
        try:
            gaps, used = _compare(step, _reference(layers, plain), state, batch, dtype)
        except Exception:  # the model refuses float64 (a kernel, a dtype-checked input): in its own precision
            if dtype is None:
                raise
            gaps, used = _compare(step, _reference(layers, plain), state, batch, None)
        low = _lowest(used, step)
        rtol = TOLERANCES.get(low, TOLERANCES[torch.float32])[0] if rtol is None else rtol
        atol = TOLERANCES.get(low, TOLERANCES[torch.float32])[1] if atol is None else atol
        ok = all(_within(g, rtol, atol) for g in gaps if g is not None)
        found, seen = None, []
        if not ok:
            for i in range(len(layers) - 1, -1, -1):  # innermost first: layers[i] around what is inside it
                inner = _compare(layers[i], _reference(layers[i:], plain), state, batch, used)[0]
                agreed = all(_within(g, rtol, atol) for g in inner if g is not None)
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
    ref = repr(_reference(layers, plain))
    return CheckResult(ok, repr(step), ref, used, rtol, atol, *gaps, diverges_at=found, layers=tuple(seen))


class _Untouched:
    """The user's own tensors (the model's parameters and buffers, the optimizer's parameters, their gradients),
    kept to find and undo a step that reaches them past its model argument (BatchNorm's kernels update running
    statistics in place without a version bump: values are compared)."""

    def __init__(self, state: TrainState) -> None:
        named: dict[int, tuple[str, torch.Tensor]] = {id(p): (f"{n!r}", p) for n, p in state.model.named_parameters()}
        for group in state.optimizer.param_groups:
            for p in group["params"]:
                named.setdefault(id(p), ("an optimizer parameter outside the model", p))
        named.update({id(b): (f"{n!r}", b) for n, b in state.model.named_buffers()})
        self.kept = [(name, t, t.detach().clone(), _grad_copy(t)) for name, t in named.values()]

    def restore(self) -> str | None:
        """Put back what changed; what it was (None: nothing)."""
        changed = []
        for name, t, value, grad in self.kept:
            if not _same(t.detach(), value):
                changed.append(name)
                with torch.no_grad():
                    t.copy_(value)
            if not (t.grad is None if grad is None else t.grad is not None and _same(t.grad, grad)):
                where = "the optimizer's parameter outside the model" if name.startswith("an ") else name
                changed.append(f"the gradient of {where}")
                t.grad = grad
        return None if not changed else ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")


def _grad_copy(t: torch.Tensor) -> torch.Tensor | None:
    return None if t.grad is None else t.grad.detach().clone()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN was (a user's NaN is not a change)."""
    a, b = _dense(a), _dense(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(
        torch.equal(a, b)
        or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    )


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A sparse gradient (``nn.Embedding(sparse=True)``) as the dense one it stands for: compared by value."""
    return t.to_dense() if t.is_sparse else t


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


def _peel(step: TrainStep) -> tuple[list[TrainStep], TrainStep]:
    """The layers of a composition, outermost first, and the lifted plain step inside them."""
    layers = []
    while step.inner is not None:
        layers.append(step)
        step = step.inner
    return layers, step


def _reference(layers: list[TrainStep], plain: TrainStep) -> TrainStep:
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
    """Outermost: keeps the gradients the update phase receives (after every pass, before any update)."""

    def __init__(self, inner: TrainStep, kept: dict[str, torch.Tensor | None]) -> None:
        self.kept = kept
        super().__init__(inner)

    def update(self, state: TrainState, ctx: Context) -> Update:
        for name, p in state.model.named_parameters():
            self.kept[name] = None if p.grad is None else _dense(p.grad.detach()).to("cpu", copy=True)
        return self._inner().update(state, ctx)


def _compare(
    step: TrainStep, reference: TrainStep, state: TrainState, batch: Any, dtype: torch.dtype | None
) -> tuple[tuple[Gap, Gap, Gap, Gap | None], torch.dtype]:
    """Both steps on fresh copies: the gaps in loss, gradients, parameters and buffers (None: the model has
    none), and the copies' dtype (the
    reference first: a model that refuses ``dtype`` fails there, before the composition changes anything)."""
    runs, rng = [], capture_rng()
    for s in (reference, step):
        restore_rng(rng)  # both draw the same random numbers (dropout): the user's generators, left as they were
        copied, data = _copy(state, batch, dtype)
        grads: dict[str, torch.Tensor | None] = {}
        with warnings.catch_warnings():
            # a copied optimizer's step() lost the wrapper its scheduler counts calls with (Optimizer pickles
            # without it), so the scheduler's first step() would warn of a wrong call order that is not there
            warnings.filterwarnings("ignore", message=r"Seems like `optimizer.step\(\)` has been overridden")
            out = _Probe(s, grads)(copied, data)
        if s is reference and not _finite(out.loss, grads):
            raise ValueError(
                f"check: the plain step's own update on this batch ({reference!r}) is not finite (loss "
                f"{float(out.loss):g}, or a gradient): every layer would differ from it, none is to blame; check "
                "on a batch the plain step trains on"
            )
        params = {n: p.detach().to("cpu", copy=True) for n, p in copied.model.named_parameters()}
        buffers = {n: b.detach().to("cpu", copy=True) for n, b in copied.model.named_buffers()}
        runs.append((out.loss.detach().to("cpu", torch.float64), grads, params, buffers))
    restore_rng(rng)
    (ref_loss, ref_grads, ref_params, ref_buffers), (loss, grads, params, buffers) = runs
    loss_gap = float((loss - ref_loss).abs())
    gaps = (
        Gap(loss_gap, "loss", float(ref_loss.abs())),
        _largest(grads, ref_grads),
        _largest(params, ref_params),
        _largest(buffers, ref_buffers) if ref_buffers else None,
    )
    used = _dtype_of(state, dtype)
    return gaps, used


def _finite(loss: torch.Tensor, grads: Mapping[str, torch.Tensor | None]) -> bool:
    return bool(loss.isfinite().all()) and all(g is None or bool(g.isfinite().all()) for g in grads.values())


def _copy(state: TrainState, batch: Any, dtype: torch.dtype | None) -> tuple[TrainState, Any]:
    """Independent copies of the state (through its own ``state_dict`` round trip, which checkpoints trust) and
    of the batch, in ``dtype`` (None: as they are)."""
    model, optimizer, scheduler = copy.deepcopy((state.model, state.optimizer, state.scheduler))
    copied = TrainState(model, optimizer, scheduler, scheduler_interval=state.scheduler_interval)
    saved = copy.deepcopy(state.state_dict())
    if dtype is not None:  # transform state that mirrors the model (ct.ema's averages) in the copies' precision
        saved["transforms"] = map_tensors(saved["transforms"], lambda t: _cast(t, dtype))
    copied.load_state_dict(saved)
    if dtype is not None:
        # in place: the optimizer keeps the same Parameter objects; not model.to(dtype), which casts a complex
        # tensor to real (its imaginary part dropped: another model): complex ones go to dtype's complex
        model._apply(lambda t: _cast(t, dtype))
        for entries in optimizer.state.values():
            for key, value in entries.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    entries[key] = _cast(value, dtype)
    data = map_tensors(copy.deepcopy(batch), lambda t: _cast(t, dtype) if dtype else t)
    return copied, data


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` if floating, in its complex counterpart if complex; any other tensor as it is."""
    if t.is_floating_point():
        return t.to(dtype)
    if t.is_complex():
        return t.to(torch.complex128 if dtype is torch.float64 else torch.complex64)
    return t


def _largest(got: Mapping[str, torch.Tensor | None], want: Mapping[str, torch.Tensor | None]) -> Gap:
    """The largest element-wise difference over all tensors, and the reference's largest magnitude; a tensor on
    one side only (a gradient that is None on the other) differs by its magnitude. NaN is the largest."""
    worst, where, scale = 0.0, "-", 0.0
    for name in want:
        a, b = got.get(name), want[name]
        if a is None and b is None:
            continue
        ref = _wide(b if b is not None else torch.zeros_like(a))  # type: ignore[arg-type]
        mine = _wide(a if a is not None else torch.zeros_like(ref))
        if not ref.numel():
            continue
        scale = max(scale, float(ref.abs().max()))
        diff = float((mine - ref).abs().max())
        if math.isnan(diff):
            return Gap(diff, name, scale)
        if diff > worst:
            worst, where = diff, name
    return Gap(worst, where, scale)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64, or complex128 (``.double()`` would drop an imaginary part)."""
    return t.to(torch.complex128) if t.is_complex() else t.double()


def _within(gap: Gap, rtol: float, atol: float) -> bool:
    return gap.largest <= atol + rtol * gap.scale  # False for NaN


def _dtype_of(state: TrainState, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    floats = [p.dtype for p in state.model.parameters() if p.is_floating_point()]
    return max(floats, key=lambda d: torch.finfo(d).eps) if floats else torch.float32


def _lowest(used: torch.dtype, step: TrainStep) -> torch.dtype:
    """The lowest precision the update computes in: the copies', or mixed_precision's autocast below it."""
    if used is torch.float64 or "mixed_precision" not in step.roles:
        return used
    low = next((getattr(s, "dtype", None) for s in _peel(step)[0] if s.role == "mixed_precision"), None)
    return low if isinstance(low, torch.dtype) and low is not torch.float32 else torch.bfloat16

"""mixed_precision: 16-bit autocast forward, fp32 weights, loss scaling, clean skips."""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from typing import Any

import torch

from composetrain._util import show
from composetrain.core import Context, Pass, PlainStep, TrainStep, Transform, Update
from composetrain.state import TrainState

__all__ = ["mixed_precision"]

_DTYPES: dict[Any, torch.dtype | str] = {
    "auto": "auto",
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    torch.bfloat16: torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    torch.float16: torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    torch.float32: torch.float32,
}
_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DYNAMIC: dict[str, Any] = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


def mixed_precision(
    step: PlainStep | TrainStep | None = None,
    *,
    dtype: str | torch.dtype = "auto",
    loss_scale: str | float = "dynamic",
    max_consecutive_skips: int = 100,
    check_finite: bool = True,
) -> Any:
    """Run each forward under ``torch.autocast``; keep weights, gradients and optimizer state fp32.

    Autocast is entered around each forward only, never around backward or the
    optimizer (PyTorch issue 65766). With fp16, the loss is scaled for backward by
    a ``torch.amp.GradScaler`` kept in the TrainState (so checkpoints carry it):
    dynamic by default (start 2**16, halve on overflow, double after 2000 clean
    updates) or fixed. The gradients are unscaled exactly once per update, after
    the last backward, so every transform's update phase (``clip_grad_norm``) sees
    true gradients, whatever the nesting order. If they are not finite (fp16 or
    bf16), the update is skipped: parameters, optimizer state, scheduler and
    ``state.step`` stay exactly as they were and ``out.skipped`` is true. Deciding
    that costs one pass over the gradients and one host sync per update, the ones
    ``GradScaler`` makes too; bf16 can opt out with ``check_finite=False``.

    Args:
        step: the step to wrap; omit it to get a transform (``mixed_precision(dtype="fp16")``).
        dtype: ``"bf16"``, ``"fp16"``, ``"auto"`` (bf16 where the device supports it,
            else fp16 on CUDA) or ``"fp32"`` (no-op); torch dtypes work too.
        loss_scale: ``"dynamic"`` or a fixed positive number (fp16 only: bf16 has
            fp32's range and needs none).
        max_consecutive_skips: after this many skipped updates in a row, raise: the
            loss itself is then almost surely NaN or infinite.
        check_finite: bf16 only: False trusts the gradients, saving the pass over
            them and the host sync (about 3% of a CPU update here); fp16 always checks.

    Returns:
        The wrapped TrainStep, or a transform when ``step`` is omitted.

    Example:
        >>> train = ct.mixed_precision(ct.accumulate(4)(step))          # bf16 on this CPU
        >>> train = ct.compose(ct.clip_grad_norm(1.0), ct.mixed_precision(dtype="fp16"))(step)
    """
    if dtype not in _DTYPES or isinstance(dtype, bool):
        raise ValueError(f"mixed_precision: dtype must be one of 'bf16', 'fp16', 'auto' or 'fp32', got {show(dtype)}")
    resolved = _DTYPES[dtype]
    if loss_scale != "dynamic":
        if isinstance(loss_scale, bool) or not isinstance(loss_scale, numbers.Real):
            raise TypeError(
                f"mixed_precision: loss_scale must be 'dynamic' or a positive number, got {show(loss_scale)}"
            )
        if not math.isfinite(loss_scale) or loss_scale <= 0:
            raise ValueError(
                f"mixed_precision: loss_scale must be a positive, finite number, got {loss_scale}; "
                "e.g. loss_scale=1024.0, or 'dynamic'"
            )
        if resolved in (torch.bfloat16, torch.float32):
            raise ValueError(
                f"mixed_precision: loss_scale={loss_scale} applies to fp16 only, got dtype={dtype!r}; "
                "bf16 and fp32 need no loss scaling: drop loss_scale, or use dtype='fp16'"
            )
    if isinstance(max_consecutive_skips, bool) or not hasattr(max_consecutive_skips, "__index__"):
        raise TypeError(
            f"mixed_precision: max_consecutive_skips must be a positive int, got {show(max_consecutive_skips)}"
        )
    if operator.index(max_consecutive_skips) < 1:
        raise ValueError(f"mixed_precision: max_consecutive_skips must be a positive int, got {max_consecutive_skips}")
    if not isinstance(check_finite, bool):
        raise TypeError(f"mixed_precision: check_finite must be True or False, got {show(check_finite)}")
    if not check_finite and resolved is torch.float16:
        raise ValueError(
            "mixed_precision: check_finite=False is for bf16; fp16's loss scaling must see overflows: "
            "drop check_finite, or use dtype='bf16'"
        )

    options = []
    if dtype != "auto":
        options.append(f"dtype={_SHORT[resolved] if isinstance(resolved, torch.dtype) else resolved!r}")
    if loss_scale != "dynamic":
        options.append(f"loss_scale={loss_scale}")
    if max_consecutive_skips != 100:
        options.append(f"max_consecutive_skips={max_consecutive_skips}")
    if not check_finite:
        options.append("check_finite=False")
    label = f"mixed_precision({', '.join(options)})" if options else "mixed_precision"
    skips = operator.index(max_consecutive_skips)
    transform = Transform(label, lambda inner: _MixedPrecision(inner, label, resolved, loss_scale, skips, check_finite))
    if step is None:
        return transform
    if isinstance(step, (str, torch.dtype)):
        raise TypeError(
            f"mixed_precision: step must be a function step(model, batch), got {show(step)}; "
            f"pass options by keyword: mixed_precision(dtype={step!r})"
        )
    return transform(step)


class _Scaling:
    """The mixed-precision state kept in the TrainState: a GradScaler and the skip streak.

    ``mode`` says what the scaler was set up for (dtype, scale, device); a step or a
    checkpoint for another mode starts afresh, with a warning, rather than reusing
    a loss scale that belongs to another configuration.
    """

    def __init__(self) -> None:
        self.mode: str | None = None
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)  # replaced by configure()
        self.fixed: float | None = None  # the constant scale, or None for dynamic scaling
        self.consecutive_skips = 0
        self.unscaled = False  # unscale_ ran and update() has not yet: the scaler's own stage
        self._saved: dict[str, Any] | None = None  # loaded, applied by configure()

    def configure(self, mode: str, device: str, fixed: float | None, who: str) -> None:
        if mode == self.mode:
            return
        if self.mode is not None:
            warnings.warn(
                f"{who}: the TrainState's loss scaling was set up for {self.mode}, this step runs {mode}; "
                "starting afresh",
                stacklevel=5,
            )
        settings = _DYNAMIC if fixed is None else {**_DYNAMIC, "init_scale": fixed}
        self.mode, self.fixed = mode, fixed
        self.scaler = torch.amp.GradScaler(device, **settings)
        self.consecutive_skips, self.unscaled = 0, False
        saved, self._saved = self._saved, None
        if saved is not None and saved["mode"] == mode:
            self.scaler.load_state_dict(saved["scaler"])
            self.consecutive_skips = saved["consecutive_skips"]
        elif saved is not None:
            warnings.warn(
                f"{who}: the checkpoint's loss scaling is for {saved['mode']}, this step runs {mode}; starting afresh",
                stacklevel=5,
            )

    def state_dict(self) -> dict[str, Any] | None:
        if self.mode is None:
            return self._saved
        return {"mode": self.mode, "scaler": self.scaler.state_dict(), "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        self.mode, self._saved = None, saved  # the next update's configure() applies it


class _MixedPrecision(TrainStep):
    role = "mixed_precision"

    def __init__(
        self,
        inner: TrainStep,
        label: str,
        dtype: torch.dtype | str,
        loss_scale: str | float,
        max_skips: int,
        check_finite: bool,
    ) -> None:
        self.label = label
        self.dtype = dtype
        self.loss_scale = loss_scale
        self.max_skips = max_skips
        self.check_finite = check_finite
        super().__init__(inner)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        if self.dtype is torch.float32:  # what does not apply is a no-op
            return self._inner().prepare(state, batch, ctx)
        devices = sorted({p.device.type for p in state.model.parameters()}) or ["cpu"]
        dtype = self._resolve(devices)
        autocasts = tuple(lambda c, d=d: torch.autocast(d, dtype=dtype) for d in devices)
        ctx = ctx._replace(around_forward=(*ctx.around_forward, *autocasts))
        scales = dtype is torch.float16 or self.check_finite
        ctx = ctx._replace(notes={**ctx.notes, self.role: scales})
        if not scales:  # bf16 trusting its gradients: autocast only, no scaler, no host sync
            return self._inner().prepare(state, batch, ctx)
        # fp16 scales dynamically unless told a fixed scale; bf16 keeps scale 1 (the scaler then
        # only checks that the gradients are finite)
        fixed = 1.0 if dtype is torch.bfloat16 else None if self.loss_scale == "dynamic" else float(self.loss_scale)
        scaling = state.transform_state(self.role, _Scaling)
        if dtype is torch.bfloat16:
            mode = f"bf16 on {devices[0]}"
        else:
            mode = f"fp16 ({'dynamic loss scale' if fixed is None else f'loss scale {fixed:g}'}) on {devices[0]}"
        scaling.configure(mode, devices[0], fixed, repr(self))
        if scaling.unscaled:  # a previous call failed between unscale and update: reset the stage only
            scaling.scaler.update(new_scale=scaling.scaler.get_scale())
            scaling.unscaled = False
        ctx = ctx._replace(scale_loss=(*ctx.scale_loss, scaling.scaler.scale))
        return self._inner().prepare(state, batch, ctx)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        done = self._inner().grads(state, batch, ctx)
        if ctx.last_backward and ctx.notes.get(self.role):
            scaling = state.transform_state(self.role, _Scaling)
            scaling.scaler.unscale_(state.optimizer)  # exactly once per update, before any update phase
            scaling.unscaled = True
        return done

    def update(self, state: TrainState, ctx: Context) -> Update:
        if not ctx.notes.get(self.role):  # fp32, or bf16 with check_finite=False
            return self._inner().update(state, ctx)
        scaling = state.transform_state(self.role, _Scaling)
        scaler = scaling.scaler
        # GradScaler has no public way to say whether step() skipped (pytorch issue 55585),
        # so we read the inf checks unscale_ recorded and skip ourselves: the same one host sync.
        infs = scaler._found_inf_per_device(state.optimizer)
        found_inf = bool(sum(v.item() for v in infs.values()))
        try:
            applied = self._inner().update(state, ctx._replace(skip_update=ctx.skip_update or found_inf))
        finally:
            if scaling.fixed is not None:
                scaler.update(new_scale=scaling.fixed)
            elif infs:
                scaler.update()  # back off on inf, grow after growth_interval clean updates
            else:  # no parameter had a gradient: nothing to learn about the scale
                scaler.update(new_scale=scaler.get_scale())
            scaling.unscaled = False
        scaling.consecutive_skips = scaling.consecutive_skips + 1 if found_inf else 0
        if scaling.consecutive_skips >= self.max_skips:
            raise FloatingPointError(
                f"{self!r}: {scaling.consecutive_skips} updates in a row were skipped because the "
                f"gradients were not finite (loss scale now {scaler.get_scale():g}); the loss itself is "
                "probably NaN or infinite: check the step's loss for log(0), division by zero or bad "
                "input, or raise max_consecutive_skips"
            )
        return applied

    def _resolve(self, devices: list[str]) -> torch.dtype:
        for device in devices:
            if not torch.amp.is_autocast_available(device):
                raise RuntimeError(
                    f"{self!r}: torch.autocast is not available on device {device!r}; "
                    "train on cpu or cuda, or drop mixed_precision"
                )
        if self.dtype != "auto":
            assert isinstance(self.dtype, torch.dtype)
            if self.dtype is torch.bfloat16 and "cuda" in devices and not torch.cuda.is_bf16_supported():
                raise RuntimeError(
                    f"{self!r}: this GPU does not support bf16; use dtype='fp16' (with loss scaling) or 'auto'"
                )
            return self.dtype
        if "cuda" in devices and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16

    def _config(self) -> tuple[Any, ...]:
        return (self.dtype, self.loss_scale, self.max_skips, self.check_finite)

    def _label(self) -> str:
        return self.label

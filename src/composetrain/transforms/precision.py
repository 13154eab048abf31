"""mixed_precision: 16-bit autocast forward, fp32 weights, loss scaling, clean skips."""

from __future__ import annotations

from typing import Any

import torch

from composetrain.core.protocol import Context, Hook, Pass, TrainStep, Update
from composetrain.core.state import TrainState
from composetrain.core.steps import PlainStep, Transform, transform_factory
from composetrain.core.util import MIXED_PRECISION, check_bool, check_int, check_real, show
from composetrain.launch.agree import largest
from composetrain.transforms._scaling import LossScaling

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


@transform_factory
def mixed_precision(
    step: PlainStep | TrainStep | str | torch.dtype | None = None,
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
        step: the step to wrap; omit it, or give the dtype in its place
            (``mixed_precision("fp16")``), to get a transform.
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
        >>> train = ct.compose(ct.clip_grad_norm(1.0), ct.mixed_precision("fp16"))(step)
    """
    if isinstance(step, (str, torch.dtype)):  # mixed_precision("bf16"): the dtype, in the step's place
        if not (isinstance(dtype, str) and dtype == "auto"):
            raise TypeError(
                f"{MIXED_PRECISION}: the dtype is given twice, {step!r} and dtype={dtype!r}; give it once, "
                f"e.g. mixed_precision({step!r})"
            )
        dtype = step
        step = None
    if not isinstance(dtype, (str, torch.dtype)):
        raise TypeError(
            f"{MIXED_PRECISION}: dtype must be a string such as 'bf16' or a torch dtype, got {show(dtype)}; "
            "e.g. mixed_precision(dtype='bf16')"
        )
    if dtype not in _DTYPES:
        raise ValueError(f"{MIXED_PRECISION}: dtype must be one of 'bf16', 'fp16', 'auto' or 'fp32', got {show(dtype)}")
    resolved = _DTYPES[dtype]
    if not (isinstance(loss_scale, str) and loss_scale == "dynamic"):
        if isinstance(loss_scale, str):
            raise TypeError(
                f"{MIXED_PRECISION}: loss_scale must be 'dynamic' or a positive number, got {show(loss_scale)}"
            )
        loss_scale = check_real(loss_scale, MIXED_PRECISION, "loss_scale", example="loss_scale=1024.0, or 'dynamic'")
        if resolved in (torch.bfloat16, torch.float32):
            raise ValueError(
                f"{MIXED_PRECISION}: loss_scale={loss_scale} applies to fp16 only, got dtype={dtype!r}; "
                "bf16 and fp32 need no loss scaling: drop loss_scale, or use dtype='fp16'"
            )
    skips = check_int(max_consecutive_skips, MIXED_PRECISION, "max_consecutive_skips", example="100")
    check_bool(check_finite, MIXED_PRECISION, "check_finite", example="check_finite=False (bf16 only)")
    if not check_finite and resolved is torch.float16:
        raise ValueError(
            f"{MIXED_PRECISION}: check_finite=False is for bf16; fp16's loss scaling must see overflows: "
            "drop check_finite, or use dtype='bf16'"
        )

    options = []
    if dtype != "auto":
        options.append(f"dtype={_SHORT[resolved] if isinstance(resolved, torch.dtype) else resolved!r}")
    if loss_scale != "dynamic":
        options.append(f"loss_scale={loss_scale}")
    if skips != 100:
        options.append(f"max_consecutive_skips={skips}")
    if not check_finite:
        options.append("check_finite=False")
    label = f"{MIXED_PRECISION}({', '.join(options)})" if options else MIXED_PRECISION
    transform = Transform(label, lambda inner: _MixedPrecision(inner, label, resolved, loss_scale, skips, check_finite))
    return transform if step is None else transform(step)


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
        # devices -> (dtype, device types, autocast hooks): derived from the configuration and the devices
        self._plans: dict[frozenset[torch.device], tuple[torch.dtype, list[str], tuple[Hook, ...]]] = {}
        super().__init__(inner)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        if self.dtype is torch.float32:  # what does not apply is a no-op
            return self._inner().prepare(state, batch, ctx)
        # the optimizer's parameters and the model's others, as TrainState found them: walking the module
        # tree (model.parameters()) every update would cost more than the rest of this transform
        params = [p for group in state.optimizer.param_groups for p in group["params"]] + state._unheld
        devices = frozenset(p.device for p in params) or frozenset({torch.device("cpu")})
        plan = self._plans.get(devices)
        if plan is None:  # what the devices imply is found once, not per update
            plan = self._plans[devices] = self._plan(devices)
        dtype, kinds, autocasts = plan
        scales = dtype is torch.float16 or self.check_finite
        ctx = ctx._replace(around_forward=(*ctx.around_forward, *autocasts), notes={**ctx.notes, self.role: scales})
        if not scales:  # bf16 trusting its gradients: autocast only, no scaler, no host sync
            return self._inner().prepare(state, batch, ctx)
        # fp16 scales dynamically unless told a fixed scale; bf16 keeps scale 1, where the scaler
        # only checks that the gradients are finite
        fixed = 1.0 if dtype is torch.bfloat16 else None if self.loss_scale == "dynamic" else float(self.loss_scale)
        scaling = state.transform_state(self.role, LossScaling)
        if scaling.device is None:  # first use: GradScaler cannot unscale fp16 gradients
            _refuse_fp16_weights(state.optimizer, self)
        scaling.configure((_SHORT[dtype], fixed), kinds[0], self)
        if scaling.unscaled:  # a previous call failed between unscale and update: reset the stage only
            scaling.scaler.update(new_scale=scaling.scaler.get_scale())
            scaling.unscaled = False
        if fixed != 1.0:  # bf16's scale 1 is left out: multiplying by it costs kernels in every pass, for nothing
            ctx = ctx._replace(scale_loss=(*ctx.scale_loss, scaling.scaler.scale))
        ctx = self._inner().prepare(state, batch, ctx)
        if fixed is None and ctx.model_parts is not None:  # before any pass
            raise ValueError(
                f"{self!r}: fp16 with a dynamic loss scale over a model split across processes (ct.pipeline's "
                "stages): each stage's GradScaler would grow or back off its own scale, and the stages' gradients "
                "would be unscaled by different factors; use dtype='bf16', or a fixed loss_scale (a number)"
            )
        return ctx

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        done = self._inner().grads(state, batch, ctx)
        if ctx.last_backward and ctx.notes.get(self.role):
            scaling = state.transform_state(self.role, LossScaling)
            scaling.unscale(state.optimizer)  # exactly once per update, before any update phase
        return done

    def verify(self, state: TrainState, done: Pass, ctx: Context) -> None:
        super().verify(state, done, ctx)
        if ctx.notes.get(self.role) and not state.transform_state(self.role, LossScaling).unscaled:
            raise RuntimeError(
                f"{self!r}: the gradients were never unscaled: no pass inside it was marked as the last "
                "backward of the update (Context.last_backward); a transform inside it must pass "
                "last_backward=True to its final backward"
            )

    def update(self, state: TrainState, ctx: Context) -> Update:
        if not ctx.notes.get(self.role):  # fp32, or bf16 with check_finite=False
            return self._inner().update(state, ctx)
        scaling = state.transform_state(self.role, LossScaling)
        scaler = scaling.scaler
        found_inf = scaling.found_inf(state.optimizer)  # the one host sync, as in GradScaler.step
        if ctx.model_parts is not None:  # each process sees its part's gradients: skip on all if any overflowed
            found_inf = bool(largest([float(bool(found_inf))], group=ctx.model_parts.group)[0])
        try:
            applied = self._inner().update(state, ctx._replace(skip_update=ctx.skip_update or bool(found_inf)))
        finally:
            if scaling.fixed == 1.0:  # only checked (LossScaling.unscale): the scale stays 1
                pass
            elif scaling.fixed is not None:
                scaler.update(new_scale=scaling.fixed)
            elif found_inf is not None:
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

    def _plan(self, devices: frozenset[torch.device]) -> tuple[torch.dtype, list[str], tuple[Hook, ...]]:
        dtype = self._resolve(devices)
        kinds = sorted({d.type for d in devices})
        return dtype, kinds, tuple(lambda c, d=d: torch.autocast(d, dtype=dtype) for d in kinds)

    def _resolve(self, devices: frozenset[torch.device]) -> torch.dtype:
        for device in devices:
            if not torch.amp.is_autocast_available(device.type):
                raise RuntimeError(
                    f"{self!r}: torch.autocast is not available on device {device.type!r}; "
                    "train on cpu or cuda, or drop mixed_precision"
                )
        # native bf16 on CUDA is Ampere (compute capability 8.0) and later; older GPUs only emulate it
        old_gpus = sorted(str(d) for d in devices if d.type == "cuda" and torch.cuda.get_device_capability(d) < (8, 0))
        if self.dtype == "auto":
            dtype = torch.float16 if old_gpus else torch.bfloat16
            if dtype is torch.bfloat16 and self.loss_scale != "dynamic":
                raise ValueError(
                    f"{self!r}: loss_scale={self.loss_scale} applies to fp16, but dtype='auto' chose bf16 on "
                    f"{sorted(d.type for d in devices)}; pass dtype='fp16', or drop loss_scale"
                )
            return dtype
        assert isinstance(self.dtype, torch.dtype)
        if self.dtype is torch.bfloat16 and old_gpus:
            raise RuntimeError(
                f"{self!r}: {old_gpus} do not support bf16 natively (compute capability below 8.0); "
                "use dtype='fp16' (with loss scaling) or 'auto'"
            )
        return self.dtype

    def _config(self) -> tuple[Any, ...]:
        return (self.dtype, self.loss_scale, self.max_skips, self.check_finite)


def _refuse_fp16_weights(optimizer: torch.optim.Optimizer, who: object) -> None:
    if any(p.dtype is torch.float16 for group in optimizer.param_groups for p in group["params"]):
        raise TypeError(
            f"{who!r}: the optimizer holds float16 parameters (model.half()); mixed precision keeps the "
            "weights, gradients and optimizer state in float32 and runs only the forward in 16 bits: keep "
            "the model in float32 (drop .half())"
        )

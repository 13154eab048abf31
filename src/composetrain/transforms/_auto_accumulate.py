"""accumulate("auto"): the batch is the optimisation batch; the micro-batch adapts to memory."""

from __future__ import annotations

import gc
import math
from typing import Any

import torch

from composetrain.core.batching import leading_size, split_weighted, warn_if_batchnorm
from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep, Update, WeightFn, combine
from composetrain.core.rng import Generators
from composetrain.core.state import TrainState
from composetrain.core.steps import Transform
from composetrain.core.util import ACCUMULATE, name, show

__all__ = ["auto_transform"]


def auto_transform(weight: WeightFn | None) -> Transform:
    """``accumulate("auto", weight=...)``; documented there."""
    label = f"{ACCUMULATE}('auto')" if weight is None else f"{ACCUMULATE}('auto', weight={name(weight)})"
    return Transform(label, lambda step: _AutoAccumulate(step, label, weight))


class MicroBatchMemory:
    """The micro-batch size that fits, kept in the TrainState (and so in checkpoints).

    ``micro_batch`` is None until some update ran out of memory: whole batches fit so
    far. It only ever shrinks: a size that failed is never tried again.
    """

    def __init__(self) -> None:
        self.micro_batch: int | None = None
        self.used = 0  # the largest micro-batch of the last update, for out.metrics (not checkpointed)
        # the size this update's passes found, kept by its update phase only: a call refused after them
        # leaves the state's size as it was (not checkpointed)
        self.found: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"micro_batch": self.micro_batch}

    def load_state_dict(self, saved: Any) -> None:
        size = saved.get("micro_batch", "missing") if isinstance(saved, dict) else "missing"
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(
                f"{ACCUMULATE}('auto'): the checkpoint's micro-batch size must be a positive int or None, got "
                f"{show(saved)}; load a checkpoint that TrainState.state_dict() wrote"
            )
        self.micro_batch = size


class _AutoAccumulate(TrainStep):
    role = "accumulate_auto"
    reports = frozenset({"micro_batch"})
    refuses_inside = refused_inside(role)

    def __init__(self, inner: TrainStep, label: str, weight: WeightFn | None) -> None:
        self.label = label
        self.own_weight = weight
        super().__init__(inner, weight=weight)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        memory = state.transform_state(self.role, MicroBatchMemory)
        size = leading_size(batch, self) or 1
        sync = ctx.deferred_sync if ctx.last_backward else None
        before = memory.micro_batch
        undo = _Undo(state)  # what a failed attempt must not leave behind
        try:
            if sync is not None:
                sync.begin()
            while True:
                n = 1 if memory.micro_batch is None else math.ceil(size / memory.micro_batch)
                largest = math.ceil(size / n)  # tensor_split's first piece
                done, oom, error = None, "", None
                try:
                    done = self._passes(state, batch, ctx, n, deferred=sync is not None)
                except Exception as raised:
                    if _is_oom(raised):
                        oom = f"{type(raised).__name__}: {str(raised).splitlines()[0] if str(raised) else ''}"
                    else:
                        error = raised  # the attempt's tensors go with the exception, once handled
                # one agreement per attempt: ran out of memory, no smaller size left, the size to try, other error
                wanted = math.ceil(largest / 2) if oom else math.inf
                flags = [float(bool(oom)), float(bool(oom) and largest == 1), -wanted, float(error is not None)]
                agreed = sync.agree(flags) if sync is not None else flags
                if error is not None:
                    raise error
                if agreed[3]:
                    raise RuntimeError(f"{self!r}: another process failed in this update (see its error)")
                if not agreed[0]:
                    if sync is not None:
                        sync.finish()
                    memory.used = largest
                    memory.found, memory.micro_batch = memory.micro_batch, before  # kept by the update phase
                    assert done is not None  # for the type checker: no error, no OOM
                    return done
                done = None
                undo.retry()
                if agreed[1]:
                    where = f"here ({oom})" if oom else "on another process"
                    raise torch.OutOfMemoryError(
                        f"{self!r}: one sample per micro-batch does not fit in memory {where}; nothing was applied. "
                        "Make the model's activations smaller (checkpoint_activations, mixed_precision), shorten "
                        "the samples, or train on a device with more memory"
                    )
                memory.micro_batch = int(-agreed[2])
        except BaseException:
            memory.micro_batch = before
            raise

    def check_batch_size(self, state: TrainState, size: int) -> None:
        pass  # its pieces are checked at the update (see TrainStep.check_batch_size)

    def forward_size(self, state: TrainState, size: int) -> int:
        found = state.transform_state(self.role, MicroBatchMemory).micro_batch  # None: whole batches fit so far
        n = 1 if found is None else math.ceil(size / found)
        return self._inner().forward_size(state, math.ceil(size / n))

    def _passes(self, state: TrainState, batch: Any, ctx: Context, n: int, deferred: bool) -> Pass:
        inner = self._inner()
        who = self  # formatted only if an error needs it
        micros, weights = split_weighted(batch, n, ctx, who, "micro-batch")
        last_backward = ctx.last_backward and not deferred  # deferred: the sync comes after every pass fitted
        if len(micros) == 1:
            return inner.grads(state, batch, ctx._replace(last_backward=last_backward))
        warn_if_batchnorm(state.model, who)
        last = len(micros) - 1
        passes = [
            inner.grads(state, micro, ctx._replace(piece_weight=w, last_backward=last_backward and i == last))
            for i, (micro, w) in enumerate(zip(micros, weights, strict=True))
        ]
        return combine(passes, who)

    def update(self, state: TrainState, ctx: Context) -> Update:
        memory = state.transform_state(self.role, MicroBatchMemory)
        memory.micro_batch = memory.found  # every refusal is behind: the size the passes found is kept
        applied = self._inner().update(state, ctx)
        return Update(applied.skipped, {**applied.metrics, "micro_batch": float(memory.used)})  # float64 in core

    def _config(self) -> tuple[Any, ...]:
        return ("auto", self.own_weight)


class _Undo:
    """What an attempt that ran out of memory must not leave: its gradients (those from before the call
    are put back), the random numbers it drew (torch's CPU and CUDA generators, Python's ``random``,
    NumPy's global generator), every buffer of the model (changed in place or rebound); and its memory.

    Each buffer is copied once per update, since an attempt may fail anywhere; buffers are small beside
    the parameters (running statistics, counters, masks).
    """

    def __init__(self, state: TrainState) -> None:
        self.state = state
        model = state.model
        # gradients from before the call: a copy, since backward may add into them in place
        # (of the model's parameters and of those the optimizer holds outside it: state.zero_grad() clears both)
        held = [p for group in state.optimizer.param_groups for p in group["params"]]
        params = {id(p): p for p in (*model.parameters(), *held)}.values()
        self.grads = [(p, p.grad.clone()) for p in params if p.grad is not None]
        self.generators = Generators()
        # every module's buffer table (a forward may rebind a buffer, not only write into it, or register one on
        # a module that had none: so the empty tables too), and the values
        self.tables = [(m, dict(m._buffers)) for m in model.modules()]
        self.buffers = [b for _, table in self.tables for b in table.values() if b is not None]
        with torch.no_grad():
            self.values = [b.clone() for b in self.buffers]

    def retry(self) -> None:
        self.state.zero_grad()
        for p, grad in self.grads:
            p.grad = grad.clone()
        self.generators.restore()
        for module, table in self.tables:
            module._buffers.clear()
            module._buffers.update(table)
        if self.buffers:
            with torch.no_grad():
                torch._foreach_copy_(self.buffers, self.values)
        gc.collect()  # the failed attempt's activations, held in reference cycles of its frames
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def _is_oom(error: BaseException) -> bool:
    """torch's out-of-memory error on any device, or an allocator's (MPS, CPU) RuntimeError saying so."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)

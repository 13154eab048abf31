"""``ct.check``'s copies and the user's own state (internal to ``composetrain.checking``): the state and batch
copied through the state's own ``state_dict`` and cast to the check's precision (complex tensors to the matching
complex dtype), and the user's tensors watched and put back when a step reaches them past its model argument."""

from __future__ import annotations

import copy
from typing import Any

import torch

from composetrain.core.batching import map_tensors
from composetrain.core.state import TrainState


def copy_state(state: TrainState, batch: Any, dtype: torch.dtype | None) -> tuple[TrainState, Any]:
    """Independent copies of the state (through its own ``state_dict`` round trip, which checkpoints trust) and
    of the batch, in ``dtype`` (None: as they are)."""
    try:
        model, optimizer, scheduler = copy.deepcopy((state.model, state.optimizer, state.scheduler))
    except Exception as e:  # a lock, an open file, a generator object held by the model
        raise TypeError(
            f"check: cannot copy your model, optimizer or scheduler ({type(e).__name__}: {e}): check runs on deep "
            "copies of them (yours are left untouched); keep what copy.deepcopy cannot copy (locks, open files) "
            "outside the model"
        ) from e
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
    try:
        data = copy.deepcopy(batch)
    except Exception as e:  # a generator, a tensor inside an autograd graph
        raise TypeError(
            f"check: cannot copy the batch ({type(e).__name__}: {e}): check runs on a deep copy (yours is left "
            "untouched); give one batch of tensors in lists, tuples or dicts, tensors detached (tensor.detach())"
        ) from e
    data = map_tensors(data, lambda t: _cast(t, dtype) if dtype else t)
    return copied, data


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` if floating, in its complex counterpart if complex; any other tensor as it is."""
    if t.is_floating_point():
        return t.to(dtype)
    if t.is_complex():
        return t.to(torch.complex128 if dtype is torch.float64 else torch.complex64)
    return t


class Untouched:
    """The user's own tensors (the model's parameters and buffers, the optimizer's parameters, their gradients)
    and the optimizer's settings, the scheduler's state and the step count, kept to find and undo a step that
    reaches them past its model argument (BatchNorm's kernels update running statistics in place without a
    version bump: values are compared)."""

    def __init__(self, state: TrainState) -> None:
        named: dict[int, tuple[str, torch.Tensor]] = {id(p): (f"{n!r}", p) for n, p in state.model.named_parameters()}
        for group in state.optimizer.param_groups:
            for p in group["params"]:
                named.setdefault(id(p), ("an optimizer parameter outside the model", p))
        named.update({id(b): (f"{n!r}", b) for n, b in state.model.named_buffers()})
        self.kept = [(name, t, t.detach().clone(), _grad_copy(t)) for name, t in named.values()]
        # and what a step can change besides tensors: the optimizer's settings (a warm-up written into the step),
        # the scheduler's state, the step count (small: kept whole)
        self.state, self.settings, (self.scheduled, self.step) = state, _settings(state), _scheduled(state)

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
        state = self.state
        if not _equal(_settings(state), self.settings):
            changed.append("the optimizer's param_groups (lr, ...)")
            for group, kept in zip(state.optimizer.param_groups, self.settings, strict=True):
                group.update(copy.deepcopy(kept))
        if state.scheduler is not None and not _equal(_scheduled(state)[0], self.scheduled):
            changed.append("the scheduler's state")
            state.scheduler.load_state_dict(copy.deepcopy(self.scheduled))
        if state.step != self.step:
            changed.append("state.step")
            state.step = self.step
        return None if not changed else ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")


def _settings(state: TrainState) -> list[dict[str, Any]]:
    return [copy.deepcopy({k: v for k, v in g.items() if k != "params"}) for g in state.optimizer.param_groups]


def _scheduled(state: TrainState) -> tuple[Any, int]:
    return (None if state.scheduler is None else copy.deepcopy(state.scheduler.state_dict())), state.step


def _equal(a: Any, b: Any) -> bool:
    """Nested settings equal, tensors among them by value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _same(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (a != a and b != b)  # NaN settings equal to themselves


def _grad_copy(t: torch.Tensor) -> torch.Tensor | None:
    return None if t.grad is None else t.grad.detach().clone()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN was (a user's NaN is not a change)."""
    a, b = dense(a), dense(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(
        torch.equal(a, b)
        or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    )


def dense(t: torch.Tensor) -> torch.Tensor:
    """A sparse gradient (``nn.Embedding(sparse=True)``) as the dense one it stands for: compared by value."""
    return t.to_dense() if t.is_sparse else t

"""Undo for a TrainState load that fails midway, and for a TrainStep call refused after its forward (internal).

TrainState checks a checkpoint before writing it, but loading runs code it cannot
foresee (a custom ``load_state_dict``, module hooks): each write first keeps what
it is about to change, and a failure restores it all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from composetrain.core.rng import Generators
from composetrain.core.util import LOAD_STATE

__all__ = ["CallUndo", "keep_model", "keep_optimizer", "keep_through_state_dict", "undo_all"]


def undo_all(undo: list[Callable[[], None]], error: BaseException) -> None:
    """Run every undo, newest first, even if one fails: the others still restore their part."""
    failed = []
    for restore in reversed(undo):
        try:
            restore()
        except Exception as e:
            failed.append(repr(e))
    if failed:
        raise RuntimeError(
            f"{LOAD_STATE}: loading failed ({error!r}), and undoing it failed too ({'; '.join(failed)}); "
            "this TrainState is now partly loaded: rebuild it before loading again"
        ) from error


def keep_optimizer(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """Undo for ``Optimizer.load_state_dict``, which replaces ``state`` and ``param_groups`` (never mutates them)."""
    state, groups = optimizer.state, optimizer.param_groups

    def restore() -> None:
        optimizer.state, optimizer.param_groups = state, groups

    return restore


def keep_through_state_dict(obj: Any) -> Callable[[], None]:
    """Undo for a scheduler's or a transform object's ``load_state_dict``: reload a copy of its state."""
    saved = copy.deepcopy(obj.state_dict())
    return lambda: obj.load_state_dict(saved)


def keep_model(model: nn.Module) -> Callable[[], None]:
    """Undo for ``nn.Module.load_state_dict``, which copies into the live tensors entry by entry.

    The one copy of the model a load makes, kept in host memory (a model that fills its
    accelerator has no room for a second copy there); written back directly, not through
    the loading code that failed.
    """
    saved = {
        k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
        for k, v in model.state_dict().items()
    }

    def restore() -> None:
        live = model.state_dict()
        with torch.no_grad():
            for key, value in saved.items():
                if isinstance(value, torch.Tensor):
                    live[key].copy_(value)
                else:  # a module's extra state, under "<module>._extra_state"
                    model.get_submodule(key.rpartition(".")[0]).set_extra_state(value)

    return restore


class CallUndo:
    """What one TrainStep call changes before its update, kept so that a refusal can put it back.

    Taken when the call starts: the gradients set before it (backward adds into them) and the generators a
    forward draws from (dropout; Python's and NumPy's in the step). After ``prepare`` (which only checks, and
    places or wraps the model once), before the first forward, ``keep_buffers``: every buffer (BatchNorm's
    running statistics change in place; a forward may rebind, cast or register one). ``restore`` puts all of
    it back, so that a call refused after its forward (a metric name, a buffer ``ct.ema`` cannot average)
    changed nothing. Buffers are copied once per update: they are small beside the parameters. The one
    parameter a torch module changes in its forward, the rows an embedding with ``max_norm`` renormalises, is
    kept row by row as it is looked up.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.generators = Generators()
        self.grads = [(p, p.grad.clone()) for p in params if p.grad is not None]  # copies: backward adds in place
        self.tables: list[tuple[nn.Module, dict[str, torch.Tensor | None]]] = []
        self.buffers: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (weight, indices, their rows)
        self.hooks: list[Any] = []

    def keep_buffers(self, model: nn.Module) -> None:
        # every module's buffer table, the empty ones too (a forward may register a buffer anywhere)
        self.tables = [(m, dict(m._buffers)) for m in model.modules()]
        self.buffers = [b for _, table in self.tables for b in table.values() if b is not None]
        with torch.no_grad():
            self.values = [b.clone() for b in self.buffers]
        # an embedding with max_norm renormalises the rows it looks up in its weight, in place, in its forward:
        # those rows are kept as each forward is about to change them (the weight itself is too large to copy)
        for m, _ in self.tables:
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None:
                self.hooks.append(m.register_forward_pre_hook(self._keep_rows, with_kwargs=True))

    def _keep_rows(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        indices = args[0] if args else kwargs.get("input")
        weight = module.weight
        if isinstance(indices, torch.Tensor) and isinstance(weight, torch.Tensor):
            with torch.no_grad():
                rows = indices.detach().reshape(-1).to(weight.device).unique()
                self.rows.append((weight, rows, weight[rows].clone()))

    def close(self) -> None:
        """Remove the hooks ``keep_buffers`` set, at the call's end, whatever happened."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def restore(self) -> None:
        """Put back the buffers (tables and values), the gradients and the generators; the call's own
        gradients must already be cleared (``TrainState.zero_grad``)."""
        for module, table in self.tables:
            module._buffers.clear()
            module._buffers.update(table)
        with torch.no_grad():
            for b, v in zip(self.buffers, self.values, strict=True):
                b.copy_(v)
            for weight, rows, values in reversed(self.rows):  # the first forward's rows last: as before the call
                weight.index_copy_(0, rows, values)
        for p, g in self.grads:
            p.grad = g
        self.generators.restore()

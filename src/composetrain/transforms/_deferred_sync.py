"""Synchronising DDP's gradients after the passes, not during the last one (``Context.deferred_sync``).

``accumulate("auto")`` retries an update when a process runs out of memory. Were
that to happen in a backward that DDP synchronises, the other processes would wait
in its all-reduce for ever. So, under it, every pass runs without synchronisation
(``no_sync``), and DDP's collectives happen only at three points every process
reaches, out of memory or not:

- ``begin()``: DDP's per-update collectives (broadcasting buffers, rebuilding
  buckets once), run by a forward that computes nothing, so that none happens
  inside the passes that follow;
- ``agree(values)``: the elementwise maximum of a few numbers over the processes
  (whether any ran out of memory; the micro-batch size all adopt);
- ``finish()``: DDP's own gradient reduction (its buckets, its communication hook,
  averaging) of what the passes accumulated in ``.grad``, triggered by a forward and
  backward of a zero loss that keeps no activations and adds exactly zero.

One synchronisation per update still: the reduction is not overlapped with the last
backward, which is the price of never leaving a process inside a collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from composetrain.launch.agree import largest

__all__ = ["DDPDeferredSync", "LastSync", "grads_telling_the_others"]


class DDPDeferredSync:
    """``Context.deferred_sync`` for a DDP-wrapped model (see the module documentation)."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        group: Any,
        who: object,
        timed: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda fn: fn,
    ) -> None:
        self.ddp = ddp
        self.group = group
        self.who = who
        # each of the three points, timed by ``distributed`` as waits for the other processes (TrainStep.waited);
        # wrapped at each call, not kept wrapped: bound methods kept on the object would hold it (and its DDP
        # wrapper, and the process group) in a reference cycle past the update
        self.timed = timed

    def begin(self) -> None:
        self.timed(self._begin)()

    def agree(self, values: list[float]) -> list[float]:
        result: list[float] = self.timed(self._agree)(values)
        return result

    def finish(self) -> None:
        self.timed(self._finish)()

    def _begin(self) -> None:
        """DDP's per-update collectives, now: none then happens inside the passes."""
        if self.ddp.static_graph:
            raise ValueError(
                f"{self.who!r}: DDP's static_graph=True expects every iteration to be the same graph, but "
                "accumulate('auto') synchronises gradients in a pass of its own; drop static_graph"
            )
        with self.ddp.no_sync(), _forward_returning(self.ddp.module, lambda: torch.zeros(())):
            self.ddp()

    def _agree(self, values: list[float]) -> list[float]:
        """The elementwise maximum of ``values`` over the processes: one small all-reduce."""
        return largest(values, self.group)

    def _finish(self) -> None:
        """All-reduce the gradients accumulated under ``no_sync``, through DDP."""
        params = [p for p in self.ddp.module.parameters() if p.requires_grad and p.grad is not None]
        if not params:
            raise RuntimeError(f"{self.who!r}: no parameter received a gradient in this update; nothing to synchronise")
        first = params[0].device

        def zero() -> torch.Tensor:
            # d(sum(p) * 0)/dp is an expanded zero: nothing is allocated, and grad + 0 == grad
            return torch.stack([p.sum().to(first, torch.float64) for p in params]).sum() * 0.0

        with _forward_returning(self.ddp.module, zero):
            loss = self.ddp()
        loss.backward()


class LastSync:
    """Whether this process has passed its update's last gradient synchronisation, for a transform that makes
    processes agree: an error of its passes after it (accumulate's check of the metric names, after the last
    backward) is told to the others through ``Context.agree``, which they reach too, and they refuse with it.
    Before it the others wait in the synchronisation itself, and nothing can be told (DDP cannot leave it)."""

    def __init__(self) -> None:
        self.passed = False

    @contextlib.contextmanager
    def around(self, sync: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
        """Around the last backward's pass, inside the transform's own context ``sync``."""
        with sync:
            yield
        self.passed = True  # the pass ended normally: its gradient all-reduce completed

    def refuse_with(self, agree: Callable[[list[float]], list[float]] | None) -> None:
        """An error of this process's passes: tell the others, if they are past the synchronisation too."""
        if self.passed and agree is not None:
            agree([1.0])


def grads_telling_the_others(inner: Any, role: str, state: Any, batch: Any, ctx: Any) -> Any:
    """``inner.grads(state, batch, ctx)`` for ``distributed``/``sharded`` (``role``): an error of the passes after
    this process's last gradient synchronisation (its ``LastSync`` in ``ctx.notes``) is told to the others."""
    try:
        return inner.grads(state, batch, ctx)
    except Exception:
        last = ctx.notes.get(role)
        if last is not None:  # several processes
            last.refuse_with(ctx.agree)
        raise


@contextlib.contextmanager
def _forward_returning(module: nn.Module, fn: Callable[[], torch.Tensor]) -> Iterator[None]:
    own = module.__dict__.get("forward")
    module.forward = lambda *args, **kwargs: fn()
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own

"""What a recomputation under activation checkpointing must give back (internal): the random numbers
the original forward drew from Python's and NumPy's global generators, and the buffers it found (a
BatchNorm's running statistics, a counter, an average it changes in place). torch's own generators are
replayed by torch.utils.checkpoint (preserve_rng_state=True)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from composetrain.core.rng import HOST, Generators
from composetrain.core.util import CHECKPOINT_ACTIVATIONS

__all__ = ["Replay", "refuse_cache", "refuse_checkpointed_twice"]


class Replay:
    """Python's and NumPy's random streams, and the chosen module's buffers, for one checkpointed call;
    torch's own generators are stashed and replayed by checkpoint itself (preserve_rng_state=True).

    ``original()`` goes around the original forward and remembers where the streams start, and the
    values of the buffers that forward changes in place (each buffer is copied before it, and the
    copies of those it left unchanged are dropped after it; a change is seen by the tensor's version
    counter, which torch's batch_norm kernels do not bump, so normalisation layers' buffers count as
    changed). The object itself goes around each
    recomputation (re-enterable: a graph kept with retain_graph is recomputed at every backward): the
    streams draw the forward's numbers again, then come out where they went in, so the recomputation
    consumes nothing (as fork_rng does for torch's generators); the buffers the forward changed are
    replaced, for the recomputation only, by fresh copies of their values at its start, so it computes
    with the values the forward saw and the live buffers stay as the forward left them. (Copied back in
    place instead, a value the recomputed graph saved for backward would change under it.)
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.start = Generators(())  # none: taken by original()
        self.changed: list[tuple[nn.Module, str, int, torch.Tensor]] = []  # owner, name, which tensor, start
        self.exits: list[contextlib.ExitStack] = []

    @contextlib.contextmanager
    def original(self) -> Iterator[None]:
        self.start = Generators(HOST)
        found = [(m, n, b, b._version) for m in self.module.modules() for n, b in m._buffers.items() if b is not None]
        with torch.no_grad():
            starts = [b.clone() for _, _, b, _ in found]
        yield
        self.changed = [
            (m, n, id(b), s)
            for (m, n, b, v), s in zip(found, starts, strict=True)
            if b._version != v or isinstance(m, _NormBase)  # batch_norm updates its statistics unversioned
        ]

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        stack.callback(Generators(HOST).restore)
        self.start.restore()
        stack.callback(_rebind, [(m, n, m._buffers[n]) for m, n, _, _ in self.changed])
        fresh: dict[int, torch.Tensor] = {}  # one copy per tensor: a buffer registered twice stays one
        with torch.no_grad():
            for m, n, which, start in self.changed:
                m._buffers[n] = fresh[which] if which in fresh else fresh.setdefault(which, start.clone())
        self.exits.append(stack)

    def __exit__(self, *exc: Any) -> bool:
        return bool(self.exits.pop().__exit__(*exc))


def _rebind(live: list[tuple[nn.Module, str, torch.Tensor | None]]) -> None:
    for module, name, tensor in live:
        module._buffers[name] = tensor


def refuse_checkpointed_twice(modules: list[nn.Module], who: object) -> None:
    """Refuse chosen submodules that Hugging Face transformers checkpoints already (its
    ``gradient_checkpointing_enable()`` flags each layer): each would be recomputed twice, for no memory saved."""
    for module in modules:
        flagged = [m for m in module.modules() if getattr(m, "gradient_checkpointing", False) is True]
        if flagged:
            raise ValueError(
                f"{who!r}: {type(flagged[0]).__name__} is checkpointed by transformers already "
                "(model.gradient_checkpointing_enable() or activation_checkpointing_enable()), and would be "
                "recomputed twice in backward; use one: model.gradient_checkpointing_disable() "
                "(activation_checkpointing_disable() from transformers 5), or leave out checkpoint_activations"
            )


def refuse_cache(module: nn.Module, values: Iterable[Any]) -> None:
    """Refuse a key/value cache passed into a checkpointed submodule: the forward writes it, and the
    recomputation in backward would write it again (attending to twice the keys: a shape error at best)."""
    for value in values:
        kinds = type(value).__mro__
        if any(k.__name__ == "Cache" and k.__module__.startswith("transformers") for k in kinds):
            raise ValueError(
                f"{CHECKPOINT_ACTIVATIONS}: {type(module).__name__} was called with a key/value cache "
                f"({type(value).__name__}), which its recomputation in backward would fill a second time; "
                "train without it: model(**batch, use_cache=False), or model.config.use_cache = False"
            )

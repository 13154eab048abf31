"""What a recomputation under activation checkpointing must give back (internal): the random numbers
the original forward drew from Python's and NumPy's global generators, and BatchNorm's running
statistics. torch's own generators are replayed by torch.utils.checkpoint (preserve_rng_state=True)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

try:  # NumPy's global stream is replayed when NumPy is there; torch does not require it
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with every usual torch install
    np = None  # type: ignore[assignment]

__all__ = ["Replay", "keep_running_stats", "running_stats"]


class Replay:
    """Python's and NumPy's random streams for one checkpointed call; torch's own generators are stashed
    and replayed by checkpoint itself (preserve_rng_state=True).

    ``original()`` goes around the original forward and remembers where the streams start. The object
    itself goes around each recomputation (re-enterable: a graph kept with retain_graph is recomputed at
    every backward): the streams draw the forward's numbers again, then come out where they went in, so
    the recomputation consumes nothing (as fork_rng does for torch's generators), and BatchNorm's running
    statistics come out as they went in.
    """

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.stats = stats
        self.start: tuple[Any, Any] = (None, None)
        self.exits: list[contextlib.ExitStack] = []

    @contextlib.contextmanager
    def original(self) -> Iterator[None]:
        self.start = _python_and_numpy_states()
        yield

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        stack.callback(_set_python_and_numpy_states, _python_and_numpy_states())
        _set_python_and_numpy_states(self.start)
        stack.enter_context(self.stats())
        self.exits.append(stack)

    def __exit__(self, *exc: Any) -> bool:
        return bool(self.exits.pop().__exit__(*exc))


def _python_and_numpy_states() -> tuple[Any, Any]:
    return random.getstate(), None if np is None else np.random.get_state()


def _set_python_and_numpy_states(states: tuple[Any, Any]) -> None:
    python, numpy = states
    random.setstate(python)
    if np is not None:
        np.random.set_state(numpy)


def running_stats(module: nn.Module) -> list[torch.Tensor]:
    return [
        buffer
        for m in module.modules()
        if isinstance(m, _NormBase) and m.track_running_stats
        for buffer in m.buffers(recurse=False)
    ]


@contextlib.contextmanager
def keep_running_stats(buffers: list[torch.Tensor]) -> Iterator[None]:
    """Around a recomputation: BatchNorm's running statistics come out as they went in."""
    if not buffers:
        yield
        return
    with torch.no_grad():
        saved = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(buffers, saved)

"""Batches onto the training device for ct.run: on CUDA the next batch is copied on a side stream
(from pinned memory, without blocking) while the current step runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from composetrain.core.batching import leaves, map_tensors, to_device

__all__ = ["device_batches"]

_END = object()


def device_batches(
    batches: Iterator[Any], device: torch.device, count: int, *, ahead: bool | None = None
) -> Iterator[tuple[Any, float]]:
    """At most ``count`` batches of ``batches`` on ``device``, each with the seconds the loop waited for it.

    Args:
        batches: the loader's iterator; at most ``count`` batches are read from it, never the read
            that would find it exhausted.
        device: where the step runs.
        count: batches wanted.
        ahead: read (and on CUDA, start copying) the next batch before the current one is used;
            default: on CUDA only. On the CPU nothing is read ahead, so a run stopped after a batch
            has read no further and its random state is the uninterrupted run's.

    Example:
        >>> for batch, waited in device_batches(iter(loader), torch.device("cuda"), len(loader)):
        ...     step(state, batch)  # the next batch is on its way to the GPU meanwhile
    """
    copy = _SideStream(device) if device.type == "cuda" else None
    if not (copy is not None if ahead is None else ahead):
        for _ in range(count):
            tick = time.perf_counter()
            batch = next(batches, _END)
            if batch is _END:
                return
            yield to_device(batch, device), time.perf_counter() - tick
        return

    def start(batch: Any) -> Any:
        return batch if batch is _END else copy.start(batch) if copy is not None else to_device(batch, device)

    tick = time.perf_counter()
    pending: Any = start(next(batches, _END)) if count > 0 else _END
    for read in range(1, count + 1):
        current = pending
        if current is _END:
            return
        pending = start(next(batches, _END)) if read < count else _END
        batch = copy.ready(current) if copy is not None else current
        yield batch, time.perf_counter() - tick
        tick = time.perf_counter()


class _SideStream:
    """Copies to one CUDA device on a stream of their own; ``ready`` makes the current stream wait for
    one batch's copies and tells the caching allocator that the current stream uses their memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def start(self, batch: Any) -> tuple[Any, torch.cuda.Event]:
        """Start copying ``batch``; the event marks the end of its copies (and of nothing after them).

        The side stream does not wait for the current one: memory it reuses is safe by ``record_stream``
        in ``ready``, so the copy of batch k+1 overlaps step k."""
        with torch.cuda.stream(self.stream):
            moved = map_tensors(batch, self._copy)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        return moved, copied

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.device:
            return t
        if t.device.type == "cpu" and not t.is_pinned():
            t = t.pin_memory()  # a pageable source would make the copy synchronous
        return t.to(self.device, non_blocking=True)

    def ready(self, started: tuple[Any, torch.cuda.Event]) -> Any:
        batch, copied = started
        current = torch.cuda.current_stream(self.device)
        current.wait_event(copied)  # this batch's copies only: the next one's may still be running
        for t in leaves(batch):
            if t.device == self.device:
                t.record_stream(current)  # not reused before the current stream's work on it is done
        return batch

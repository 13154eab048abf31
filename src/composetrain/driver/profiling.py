"""What ct.run does around each update besides the update: the profiler window, the FLOP count, the OOM snapshot.

``Watch`` is the one object the loop asks, and it costs nothing where nothing is due: outside the profiler's window
no profiler object exists and no ``record_function`` is called (each would cost a dispatcher call per phase per
update); the FLOP counter runs on the first update only; the allocator's history is recorded only when asked for
(``oom_snapshot``, on CUDA).

The window (``ct.run(profile=...)``): after ``wait`` updates of the call, ``torch.profiler`` starts, warms up over
``warmup`` updates, records ``active`` updates and writes their trace; ``repeat`` times, ``wait`` updates apart.
Each trace is one file per rank, ``<folder>/rank<r>-updates<first>-<last>.<time>.pt.trace.json`` (written by
``torch.profiler.tensorboard_trace_handler``): Chrome's trace format, which chrome://tracing and Perfetto open, in
the layout TensorBoard's profiler plugin reads (``tensorboard --logdir <folder>``). Inside, each update is marked
``update <n>``, and its phases ``data``, ``forward/backward``, ``optimizer`` (``TrainStep.__call__`` names those
two while a profiler records), ``logging``, ``checkpoint`` and ``evaluation``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch.autograd import profiler as torch_profiler
from torch.autograd.profiler import record_function

from composetrain.core.util import RUN
from composetrain.driver.options import ProfileOptions, WatchOptions
from composetrain.driver.throughput import FlopCount

__all__ = ["Watch"]

_NOTHING = contextlib.nullcontext()
_UNCOUNTED = frozenset({"compile", "pipeline", "data_parallel"})  # compositions FlopCounterMode cannot count
_END = object()


class Watch:
    """The profiler window, the FLOP count on the first update and the OOM snapshot, for one ``ct.run`` call."""

    def __init__(
        self, options: WatchOptions, rank: int, device: torch.device, state: Any = None, step: Any = None
    ) -> None:
        self.flops = FlopCount()
        self.state, self.step = state, step  # whose FLOPs: a count kept from an earlier call is taken for them
        self.window = _Window(options.profile, rank, device) if options.profile is not None else None
        self.snapshots: Path | None = None
        if options.oom_snapshot and device.type == "cuda" and options.folder is not None:
            self.snapshots = options.folder / "memory"
            self.rank = rank
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._around = _AroundUpdate(self)

    def update(self, number: int, batch: Any = None) -> contextlib.AbstractContextManager[Any]:
        """Around update ``number`` (``state.step`` once it applies) of ``batch``: nothing, unless something is
        due."""
        if self.window is not None:
            self.window.before(number)  # a window starts here: the profiler starts
        recording = self.window is not None and self.window.profiler is not None
        if self.flops.done and not recording and self.snapshots is None:
            return _NOTHING  # the common case: a few attribute tests, no context of its own
        self._around.number, self._around.batch = number, batch
        return self._around

    def mark(self, phase: str) -> contextlib.AbstractContextManager[Any]:
        """``record_function(phase)`` while a profiler records, else nothing."""
        return record_function(phase) if torch_profiler._is_profiler_enabled else _NOTHING

    def batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, each wait for the next marked ``data`` when a window is set (the iterator as is otherwise)."""
        if self.window is None:
            return batches
        return self._marked(batches)

    def _marked(self, batches: Iterator[Any]) -> Iterator[Any]:
        while True:
            with self.mark("data"):
                got = next(batches, _END)
            if got is _END:
                return
            yield got

    def missed(self, step: int) -> str | None:
        """Why the run that ended at update ``step`` wrote fewer traces than its window asks for, or None."""
        return self.window.missed(step) if self.window is not None else None

    def close(self) -> None:
        """Stop what is running (a window cut short in warm-up writes no trace, one cut short while recording
        what it recorded); whatever happened."""
        if self.window is not None:
            self.window.close()
        if self.snapshots is not None:
            torch.cuda.memory._record_memory_history(enabled=None)

    def _snapshot(self, number: int) -> None:
        assert self.snapshots is not None  # for the type checker: called only when set
        self.snapshots.mkdir(parents=True, exist_ok=True)
        path = self.snapshots / f"oom-rank{self.rank}-update{number}.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        self.snapshot_written = path


class _AroundUpdate:
    """The context ``Watch.update`` returns when something is due: one object, reused for every update."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.number = 0
        self.batch: Any = None
        self.stack: contextlib.ExitStack | None = None

    def __enter__(self) -> None:
        watch = self.watch
        stack = contextlib.ExitStack()
        if not watch.flops.done and _UNCOUNTED & set(getattr(watch.step, "roles", ())):
            # FlopCounterMode's dispatch mode keeps torch.compile from compiling the update it watches (it would
            # run eagerly and compile one update later), hangs a multi-process pipeline's first update (its
            # stages' sends and receives under the mode), and is not seen by data_parallel's replicas (they run in
            # threads of their own, and the mode is the calling thread's: it would count 0): none is counted
            # (docs/limits/driver.md)
            watch.flops.done = True
        if not watch.flops.done:  # the first update of the call: its FLOPs, counted once (or kept from before)
            model = watch.state.model if watch.state is not None else None
            stack.enter_context(watch.flops.counting(model, watch.step, self.batch))
        self.batch = None  # not kept past its update
        stack.enter_context(watch.mark(f"update {self.number}"))
        self.stack = stack.__enter__()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        assert self.stack is not None  # for the type checker: entered
        try:
            self.stack.__exit__(kind, error, tb)
        finally:
            self.stack = None
            if isinstance(error, torch.OutOfMemoryError) and self.watch.snapshots is not None:
                self.watch._snapshot(self.number)  # what held the memory: torch.cuda.memory._snapshot's viewer
            elif error is None and self.watch.window is not None:
                self.watch.window.after()


class _Window:
    """torch.profiler over the chosen updates only: created at each window's start, stopped at its end."""

    def __init__(self, options: ProfileOptions, rank: int, device: torch.device) -> None:
        self.options = options
        self.rank = rank
        self.cuda = device.type == "cuda"
        self.calls = 0  # updates of this ct.run call begun so far
        self.profiler: Any = None
        self.left = 0  # updates the running profiler has still to see
        self.span = (0, 0)  # the updates the running profiler records
        self.traces = 0  # windows whose trace was written
        self.cut = False  # whether close() stopped a window before its end

    def before(self, number: int) -> None:
        """Before each update of the call: start the profiler where a window begins."""
        o = self.options
        cycle = o.wait + o.warmup + o.active
        calls, self.calls = self.calls, self.calls + 1
        if self.profiler is not None or calls // cycle >= o.repeat or calls % cycle != o.wait:
            return
        first = number + o.warmup
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        assert o.folder is not None  # resolved by ProfileOptions
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=o.warmup, active=o.active, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                str(o.folder), worker_name=f"rank{self.rank}-updates{first}-{first + o.active - 1}"
            ),
            record_shapes=o.record_shapes,
            profile_memory=o.profile_memory,
            with_stack=o.with_stack,
        )
        self.profiler.start()
        self.left = o.warmup + o.active
        self.span = (first, first + o.active - 1)

    def after(self) -> None:
        """After each update the profiler saw."""
        if self.profiler is None:
            return
        self.profiler.step()  # the last active update's step writes the trace
        self.left -= 1
        if self.left == 0:
            self.profiler.stop()
            self.profiler = None
            self.traces += 1

    def missed(self, step: int) -> str | None:
        """A window the run ended inside, or none begun: no trace for it (said, rather than left to be found)."""
        o = self.options
        fix = f"start it earlier (profile's wait={o.wait}, warmup={o.warmup}) or run longer"
        if self.profiler is not None or self.cut:
            first, last = self.span
            written = (  # torch.profiler writes what it recorded when stopped while recording, none in warm-up
                f"its trace (named for updates {first}-{last}) holds updates {first}-{step} only"
                if step >= first
                else "no trace was written for it"
            )
            inside = f"inside the profiler's window over updates {first}-{last}"
            return f"{RUN}: the run ended after update {step}, {inside}: {written}; {fix}"
        if self.traces == 0:
            return (
                f"{RUN}: the run ended after {self.calls} update(s) of this call, before the profiler's window "
                f"(after {o.wait} update(s), {o.warmup} of warm-up and {o.active} recorded) was complete: no trace "
                f"was written; {fix}"
            )
        return None

    def close(self) -> None:
        if self.profiler is not None:
            self.cut = True  # a window cut short: said at the run's end (Watch.missed)
            self.profiler.stop()
            self.profiler = None

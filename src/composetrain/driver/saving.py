"""When ct.run saves beyond its schedule, and what its saves cost the training.

``Saves`` owns the run's side of ``Checkpoints``: a save written in the background (``checkpoint_async``) is
published at the first update boundary where every rank's writes are over, and its error (a full disk) is raised
there, on every rank; a wall-clock interval (``checkpoint_every="30min"``) is read on rank 0's clock alone. Both
ride on the agreement the ranks make after every update anyway (``StopSignal.check``): no collective of their own.
It counts the seconds the training thread spent in saves (their checks and staging, waiting for a save still in
flight, publishing), which ``explain`` names when they limit the run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from composetrain.checkpoint.files import Checkpoints
from composetrain.driver.options import CheckpointOptions

__all__ = ["Saves"]


class Saves:
    """The saves of one call of ``ct.run`` (``checkpoints`` None: it saves nothing)."""

    def __init__(
        self, checkpoints: Checkpoints | None, options: CheckpointOptions, is_main: bool, tracked: bool = False
    ) -> None:
        self.checkpoints, self.is_main, self.tracked = checkpoints, is_main, tracked  # tracked: on_record given
        self.background = bool(options.checkpoint_async)
        self.seconds = options.every_seconds
        self.since = time.monotonic()  # rank 0's clock: when the last save began (or this call)
        self.blocked = 0.0  # seconds the training thread spent in saves (but the run's last: it ends the run)
        self.count = 0
        self.waits, self.waited = 0, 0.0  # saves that found the previous one still being written, and how long
        self.deferred, self.late = 0, False  # clock saves that came due while one was being written; this one
        self.skipped: list[int] = []  # clock saves given up at a step where the user's folder is in the way
        self.resumed = False  # this call resumed from a checkpoint (set by the driver)

    @property
    def newest(self) -> Path | str | None:
        """The last checkpoint this call published (in object storage: its URL)."""
        newest = None if self.checkpoints is None else self.checkpoints.newest
        return newest if newest is None or isinstance(newest, Path) else str(newest)

    def flags(self) -> list[float]:
        """This rank's share of the agreement after an update (each agreed as the largest over the ranks): whether
        its writes are still in flight, and on rank 0 whether its clock says a save is due."""
        if self.checkpoints is None:
            return []
        due = self.is_main and self.seconds is not None and time.monotonic() - self.since >= self.seconds
        return [float(self.checkpoints.in_flight), float(due)]

    def agreed(self, shared: list[float], step: int) -> bool:
        """After the agreement: publish a save whose writes are over on every rank (or raise its error on every
        rank); whether a save is due by rank 0's clock at ``step``."""
        if self.checkpoints is None:
            return False
        busy, due = shared
        if not busy and self.checkpoints.pending is not None:
            started = time.perf_counter()
            self.checkpoints.finish()
            self.blocked += time.perf_counter() - started
        if due and busy:  # a clock save never waits for the one in flight: it comes at the first update after it
            self.deferred += not self.late
            self.late = True
            return False
        if due and self.checkpoints.taken(step):  # another clock save, at the next update
            self.skipped.append(step)
            return False
        return bool(due)

    def save(self, step: int, shared: dict[str, Any], local: dict[str, Any], nonfinite: str | None, last: bool) -> None:
        """Save ``step``: in the background unless it is the run's ``last`` (the run ends with it written) or the
        first checkpoint of a tracked run, once the save still in flight, if any, is published (at most one in
        flight: this waits for it).

        With ``on_record``, the first checkpoint is written in the foreground: until one exists a kill starts the
        run afresh, which sends the tracker again every record the killed run sent; written in the background, the
        records made while it is written would be among them (a synchronous save has none). From the first
        checkpoint on, a kill that loses a save in flight resumes from the one before, and the metrics file says
        which of the records made since were sent."""
        assert self.checkpoints is not None
        started = time.perf_counter()
        self.since, self.late = time.monotonic(), False
        if self.checkpoints.pending is not None:  # still written on some rank (agreed): this one waits for it
            self.checkpoints.finish()
            if not last:
                self.waits += 1
                self.waited += time.perf_counter() - started
        if self.background and not last and (not self.tracked or self.resumed or self.checkpoints.newest is not None):
            self.checkpoints.save_async(step, shared, local, nonfinite=nonfinite)
        else:
            self.checkpoints.save(step, shared, local, nonfinite=nonfinite)
        if not last:  # the run's last save ends it, however often it saves: no stall of its throughput to name
            self.count += 1
            self.blocked += time.perf_counter() - started

    def finish(self) -> None:
        """The save still in flight written and published (the run returns once its last save is durable)."""
        if self.checkpoints is not None and self.checkpoints.pending is not None:
            started = time.perf_counter()
            self.checkpoints.finish()
            self.blocked += time.perf_counter() - started

    def explain(self, bottleneck: str, loop_seconds: float) -> str:
        """``bottleneck`` with the saves named first when they took a fifth of the loop or more, or when a save
        had to wait for the previous one (saves more frequent than the disk can write)."""
        total = loop_seconds + self.blocked
        share = self.blocked / total if total > 0 else 0.0
        said = ""
        if self.count and share >= 0.2:
            mean = self.blocked / self.count
            fix = (
                "checkpoint_async=True writes them in the background"
                if not self.background
                else "save less often (checkpoint_every) or to a faster disk"
            )
            said += (
                f"checkpoint saves blocked training for {share:.0%} of the loop ({self.count} save(s), {mean:.2f} s "
                f"each on average): {fix}; "
            )
        if self.waits:
            said += (
                f"{self.waits} save(s) waited {self.waited:.1f} s in all for the previous one to be written: the "
                "interval between saves is shorter than a save takes, so each waits (at most one is in flight); "
                "lengthen checkpoint_every or write to a faster disk; "
            )
        if self.deferred:
            said += (
                f"{self.deferred} save(s) by the clock came due while the previous one was still being written, and "
                "waited for it (the interval is shorter than a save takes): lengthen checkpoint_every or write to a "
                "faster disk; "
            )
        if self.skipped:
            said += (
                f"the clock's save at step(s) {self.skipped[:5]} moved on to the next update: something that is no "
                "checkpoint sits at its name in checkpoint_dir; "
            )
        return said + bottleneck

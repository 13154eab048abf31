"""Which rank the others wait for: ct.run's straggler report, from each rank's timings at its log points.

Under data parallelism every rank's update lasts as long as the slowest rank's (the gradient all-reduce waits for
it), so a rank's time in the step does not tell a slow rank from the ranks waiting for it. What does: its data
wait (its own, before the step) and its time in the step *less* the time it waited there for the others (which
``TrainStep.waited`` measures: ``ct.distributed``'s all-reduces). A rank whose own time, data wait plus step less
waits, is more than ``threshold`` times the median of the other ranks' is named, with what it was slow at: the
larger of its excess in data wait and in computing.
"""

from __future__ import annotations

import statistics
from typing import Any, NamedTuple

__all__ = ["DEFAULT_THRESHOLD", "RankTimes", "Stragglers", "find_stragglers"]

DEFAULT_THRESHOLD = 1.2  # ct.run's straggler_threshold
# A rank is named only if it costs the others this share of the window at least: microseconds of difference in a
# step dwarfed by the driver's own work are noise, not a straggler
_SMALLEST_SHARE = 0.05


class RankTimes(NamedTuple):
    """One rank's seconds in a logging window: in the step, waiting there for the others, waiting for data."""

    step: float
    waited: float
    data: float

    @property
    def compute(self) -> float:
        """The time the rank spent in the step on its own work (never below 0: clocks round)."""
        return max(self.step - self.waited, 0.0)

    @property
    def own(self) -> float:
        return self.compute + self.data


def find_stragglers(times: list[RankTimes], hosts: list[str], threshold: float, elapsed: float) -> list[dict[str, Any]]:
    """The ranks slower than the median of the others by more than ``threshold`` (and by a twentieth of the window's
    ``elapsed`` seconds at least), each as ``{"rank", "host", "cause", "slower"}``: cause ``"data"`` or
    ``"compute"``, whichever of its excess is larger; slower, its own time over the others' median."""
    found = []
    for rank, mine in enumerate(times):
        others = [t for r, t in enumerate(times) if r != rank]
        if not others:
            continue
        median = statistics.median(t.own for t in others)
        if not (mine.own > threshold * median and mine.own - median > _SMALLEST_SHARE * elapsed):
            continue
        data = mine.data - statistics.median(t.data for t in others)
        compute = mine.compute - statistics.median(t.compute for t in others)
        slower = mine.own / median if median > 0 else float("inf")
        found.append(
            {
                "rank": rank,
                "host": hosts[rank],
                "cause": "data" if data >= compute else "compute",
                "slower": round(slower, 3),
            }
        )
    return found


class Stragglers:
    """The stragglers named over a run, for ``RunResult.bottleneck``: per rank, in how many windows, and why."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.windows = 0
        self.named: dict[int, dict[str, Any]] = {}

    def see(self, times: list[RankTimes], hosts: list[str], elapsed: float) -> list[dict[str, Any]]:
        """This window's stragglers, kept for the sentence at the end."""
        self.windows += 1
        found = find_stragglers(times, hosts, self.threshold, elapsed)
        for s in found:
            seen = self.named.setdefault(s["rank"], {"host": s["host"], "windows": 0, "data": 0, "compute": 0})
            seen["windows"] += 1
            seen[s["cause"]] += 1
            seen["slower"] = s["slower"]
        return found

    def sentence(self) -> str:
        """Who the others waited for, and what to look at; "" when no rank was named."""
        if not self.named:
            return ""
        parts = []
        for rank, seen in sorted(self.named.items(), key=lambda kv: -kv[1]["windows"]):
            cause = "data" if seen["data"] >= seen["compute"] else "compute"
            fix = (
                "its loader (workers, disk, network filesystem) or host CPU"
                if cause == "data"
                else "its device (clock throttling, another job on it) or host"
            )
            parts.append(
                f"rank {rank} on {seen['host']} was slower than the others by more than {self.threshold:g}x in "
                f"{seen['windows']} of {self.windows} log windows (last {seen['slower']:g}x), waiting on {cause}: "
                f"check {fix}"
            )
        return "; ".join(parts) + "; "

"""Side-by-side timing: contenders run interleaved in one process, results as ratios.

These machines are shared and noisy, so absolute times mean little: every
contender runs once per round, in rotating order, and the report gives each
one's speed relative to the hand-written PyTorch baseline's run in the same round
(median over rounds).
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A contender runs `updates` optimizer updates and returns the seconds they took
# (it may exclude its own start-up, e.g. a Trainer's set-up, by timing inside).
Contender = Callable[[int], float]


@dataclass
class Result:
    name: str
    rates: list[float] = field(default_factory=list)  # optimizer updates per second, one per round

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def compare(contenders: dict[str, Contender], *, updates: int, rounds: int, warmup: int = 1) -> list[Result]:
    """Run every contender ``rounds`` times (after ``warmup`` untimed rounds), interleaved."""
    results = {name: Result(name) for name in contenders}
    names = list(contenders)
    for r in range(warmup + rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate who goes first
            seconds = contenders[name](updates)
            if r >= warmup:
                results[name].rates.append(updates / seconds)
    return list(results.values())


def report(title: str, results: list[Result], baseline: str) -> str:
    """Markdown table. Ratios are medians of per-round ratios: each contender is compared
    with the baseline's run of the same round, so slow drifts of a shared machine cancel."""
    base = next(r for r in results if r.name == baseline)
    lines = [
        f"## {title}",
        "",
        f"| contender | updates/s (median) | ratio to {baseline} (median of rounds) | middle half of rounds |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        ratios = sorted(a / b for a, b in zip(r.rates, base.rates, strict=True))
        q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        lines.append(f"| {r.name} | {r.median:.1f} | **{statistics.median(ratios):.3f}** | {q1:.3f}-{q3:.3f} |")
    return "\n".join(lines)


def timed_loop(
    one: Callable[[int], object], device: str = "cpu", clock: Callable[[], float] = time.perf_counter
) -> Contender:
    """A contender that calls ``one(i)`` for i in range(updates), timed (CUDA work awaited). ``clock``: the wall
    clock, or ``time.process_time`` (the CPU time of this process: on a machine shared with other jobs, the time
    spent waiting for a core is not counted; one torch thread, or its threads' spinning is)."""
    import torch

    def run(updates: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = clock()
        for i in range(updates):
            one(i)
        if device == "cuda":
            torch.cuda.synchronize()
        return clock() - start

    return run

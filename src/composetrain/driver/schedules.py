"""How far a learning-rate schedule reaches: its horizon, in its own steps, against a run's length.

A schedule built in epochs (torchvision's ``CosineAnnealingLR(T_max=epochs)``) but stepped once per
update ends after a few updates, then cycles or stays at its end, without a word (pitfall 29).
``ct.run`` knows how many times it will step the scheduler and warns when that is far past the
schedule's horizon.
"""

from __future__ import annotations

from typing import Any

from torch.optim import lr_scheduler

__all__ = ["horizon", "horizon_problem", "steps_left_problem"]


def horizon(scheduler: Any) -> tuple[int, str] | None:
    """The steps after which ``scheduler`` has done what it was built for, and what says so; None for
    a schedule without one (periodic, exponential, a lambda, a warmup that then holds)."""
    sched = lr_scheduler
    if isinstance(scheduler, sched.CosineAnnealingLR):  # past T_max the rate climbs back up
        return scheduler.T_max, f"T_max={scheduler.T_max}"
    if isinstance(scheduler, sched.OneCycleLR):  # past total_steps it raises
        return scheduler.total_steps, f"total_steps={scheduler.total_steps}"
    if isinstance(scheduler, sched.PolynomialLR):  # past total_iters it holds at 0 (its end)
        return scheduler.total_iters, f"total_iters={scheduler.total_iters}"
    if isinstance(scheduler, sched.LinearLR) and scheduler.end_factor < scheduler.start_factor:
        return scheduler.total_iters, f"total_iters={scheduler.total_iters}"  # a decay; a warmup holds after
    if isinstance(scheduler, sched.MultiStepLR) and scheduler.milestones:
        last = max(scheduler.milestones)  # the last decay
        return last, f"milestones up to {last}"
    if isinstance(scheduler, sched.SequentialLR):
        final = scheduler._schedulers[-1]
        tail = horizon(final)
        if tail is None:
            return None
        start = scheduler._milestones[-1]
        return start + tail[0], f"milestones {list(scheduler._milestones)} + {type(final).__name__} {tail[1]}"
    if isinstance(scheduler, sched.ChainedScheduler):
        found = [(h, type(s).__name__) for s in scheduler._schedulers if (h := horizon(s)) is not None]
        if not found:
            return None
        (steps, why), kind = max(found, key=lambda f: f[0][0])
        return steps, f"{kind} {why}"
    return None


def horizon_problem(scheduler: Any, interval: str, steps: int, per_epoch: int) -> str | None:
    """Why ``scheduler``, stepped ``steps`` times (once per ``interval``) in a run of ``per_epoch``
    updates per epoch, looks built for another interval (its horizon under half the run); else None."""
    found = horizon(scheduler)
    if found is None or steps <= 2 * found[0]:
        return None
    reach, why = found
    kind = type(scheduler).__name__
    if interval == "update":
        fix = (
            "if its numbers count epochs, build the TrainState with scheduler_interval='epoch' "
            f"(it then steps {steps // per_epoch} times); otherwise build it for {steps} updates"
        )
    else:
        fix = f"build it for {steps} epochs"
    return (
        f"the scheduler {kind} ends after {reach} of its steps ({why}), but this run steps it {steps} times "
        f"(once per {interval}, {per_epoch} updates per epoch): past its end it {_after(scheduler)}; {fix}"
    )


def steps_left_problem(scheduler: Any, steps: int) -> str | None:
    """Why ``scheduler``, stepped ``steps`` more times at epoch ends, would be exhausted on the way
    (OneCycleLR raises past ``total_steps``); else None. Said before the run: the epoch end that
    fails comes after its epoch's training, before its checkpoint."""
    total, taken = getattr(scheduler, "total_steps", None), getattr(scheduler, "last_epoch", None)
    if not (isinstance(total, int) and isinstance(taken, int)) or steps <= total - taken:
        return None
    return (
        f"the scheduler {type(scheduler).__name__} has {total - taken} steps left (total_steps={total}), but this "
        f"run reaches {steps} epoch ends, each stepping it once: the last would fail after training its epoch; "
        f"build it with total_steps={taken + steps}, or stop earlier"
    )


def _after(scheduler: Any) -> str:
    last = scheduler._schedulers[-1] if isinstance(scheduler, lr_scheduler.SequentialLR) else scheduler
    if isinstance(last, lr_scheduler.CosineAnnealingLR):
        return "climbs back up and cycles"
    if isinstance(last, lr_scheduler.OneCycleLR):
        return "raises"
    return "stays at its last rate"

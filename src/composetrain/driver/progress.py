"""Where ct.run's loop stands, what a checkpoint carries of it, and what is due after each update.

One object, ``Progress``, owns the loop's position (epoch, batch of the epoch, the epoch's order
record), its records (history, evaluations, and the outputs not yet logged), their checkpoint
schema (``to_checkpoint`` / ``from_checkpoint``, checkpoint format 2) and the schedule that says,
after each update, whether to log, save and evaluate (``after_update``). The loop in ``run.py``
only does what it is told, in a fixed order: log, agree on stopping, save, evaluate.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from composetrain.checkpoint.format import Local, Shared, UnloggedStep
from composetrain.core.protocol import StepOutput

__all__ = ["Due", "Progress", "Schedule"]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How long the run goes and how often it logs, evaluates and saves, in optimizer updates.

    Attributes:
        per_epoch: updates in one epoch (the fewest over the ranks); None for a stream, whose pass (its epoch)
            ends where the stream does.
        epochs: epochs in total, or None: until ``max_steps``.
        max_steps: updates in total, or None.
        log_every: log every this many updates (and at each epoch's last one).
        eval_every: evaluate every this many updates, or None: at each epoch's end.
        checkpoint_every: save every this many updates too (always at each epoch's end), or None.
    """

    per_epoch: int | None
    epochs: int | None
    max_steps: int | None
    log_every: int
    eval_every: int | None
    checkpoint_every: int | None

    @property
    def total_updates(self) -> int | None:
        """The updates the whole run makes (the progress bar's length); None: a stream's, unknown."""
        if self.max_steps or self.per_epoch is None:
            return self.max_steps
        return (self.epochs or 1) * self.per_epoch


class Due(NamedTuple):
    """What is due after one update, before the ranks agree on whether to stop.

    A stop then adds a save (the run ends saved) and takes the evaluation away (the resumed run
    makes it: it finds it missed, ``Progress.evaluation_missed``).
    """

    log: bool
    save: bool
    evaluate: bool
    epoch_end: bool  # the update was the epoch's last: the loop moves on to the next epoch


@dataclasses.dataclass
class Progress:
    """Where the loop stands; what a checkpoint must carry to continue exactly; what is due when.

    Attributes:
        schedule: the run's length and cadences.
        start: ``state.step`` when this call of ``ct.run`` began: the cadences count multiples of their
            totals from there (a resumed run keeps them).
        epoch: epochs completed.
        position: batches of the current epoch done.
        history: the log records so far.
        evals: the evaluation records so far.
        window: the outputs since the last log record (per rank, on their devices).
        order: what a given DataLoader drew this epoch's order from (per rank; ``data.epoch_order``).
        ended: a stream's pass ended after the last update (the epoch is over, ``next_epoch`` not yet called).
    """

    schedule: Schedule
    start: int = 0
    epoch: int = 0
    position: int = 0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    window: list[StepOutput] = dataclasses.field(default_factory=list)
    order: dict[str, Any] | None = None
    marks: dict[str, int] = dataclasses.field(default_factory=dict)  # the multiple each cadence was last due at
    ended: bool = False

    # -- in the checkpoint's format (checkpoint/format.py) ----------------------------------------------------------
    def to_checkpoint(
        self,
        state_dict: dict[str, Any],
        settings: dict[str, Any],
        generators: list[Any],
        over_ranks: list[StepOutput] | None = None,
        stream: dict[str, Any] | None = None,
        shared_stream: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The payload every rank shares (rank 0 writes it) and this rank's own part, as ``Checkpoints.save``
        takes them: the window goes to the CPU (any device can resume) as plain dicts of tensors; ``over_ranks``:
        the window's means over the ranks, for a resume on another number of processes (the shared part's);
        ``stream``: this rank's stream state, ``shared_stream``: one that is the whole job's (the shared part's)."""
        shared = Shared(
            state_dict,
            settings,
            self.epoch,
            self.position,
            self.history,
            self.evals,
            _plain(over_ranks or []),
            shared_stream,
        )
        window = _plain(self.window)
        local = Local(
            window,
            self.order if self.position else None,  # replays the epoch's start on resume
            generators,  # a given DataLoader's: its next epoch draws from them
            stream,
        )
        return shared.to_file(), local.to_file()

    @classmethod
    def from_checkpoint(
        cls, saved: dict[str, Any], local: dict[str, Any] | None, schedule: Schedule, start: int
    ) -> Progress:
        """The progress a checkpoint saved (``saved`` and ``local`` as ``Checkpoints.latest`` returns them,
        already checked), resumed at ``state.step == start``. Without this rank's part (``local`` None: saved by
        another number of processes), the window is the ranks' mean the shared part holds: the record it ends in
        is the same mean over ranks and updates as on the processes that saved it."""
        unlogged = local["window"] if local is not None else saved["window"]
        window = [StepOutput(o["loss"], o["metrics"], o["skipped"]) for o in unlogged]
        order = local["order"] if local is not None else None
        return cls(schedule, start, saved["epoch"], saved["position"], saved["history"], saved["evals"], window, order)

    # -- the schedule ----------------------------------------------------------------------------------------
    @property
    def resumed(self) -> bool:
        return self.epoch > 0 or self.position > 0  # a checkpoint is never saved before the first update

    def finished(self, step: int) -> bool:
        """Whether the run has done all it was asked: its epochs, or ``max_steps`` updates."""
        epochs = self.schedule.epochs
        return (epochs is not None and self.epoch >= epochs) or self.reached_max(step)

    def reached_max(self, step: int) -> bool:
        return self.schedule.max_steps is not None and step >= self.schedule.max_steps

    def after_update(self, step: int) -> Due:
        """What is due after the update that brought ``state.step`` to ``step``: the epoch's last batch
        logs, and saves; the epoch's end evaluates when no ``eval_every`` is given; the last update
        (``max_steps``) saves."""
        s = self.schedule
        epoch_end = s.per_epoch is not None and self.position == s.per_epoch
        log = self._due("log", s.log_every, step) or epoch_end
        evaluate = self._due("eval", s.eval_every, step) or (epoch_end and not s.eval_every)
        save = self._due("save", s.checkpoint_every, step) or epoch_end or self.reached_max(step)
        return Due(log, save, evaluate, epoch_end)

    def after_pass(self) -> Due:
        """What is due when a stream's pass ended after the last update (the epoch's end, found when reading on): the
        log of what the window holds, a save, the evaluation due at an epoch's end."""
        self.ended = True
        return Due(bool(self.window), True, not self.schedule.eval_every, True)

    def next_epoch(self) -> None:
        self.epoch, self.position, self.ended = self.epoch + 1, 0, False

    def evaluation_missed(self, step: int) -> bool:
        """Whether a resumed run starts where an evaluation was due but is not recorded: checkpoints are
        saved before the evaluation of the same update, so one that failed or was interrupted is run again."""
        if not self.resumed or (self.evals and self.evals[-1]["step"] == step):
            return False
        if self.schedule.eval_every:
            return step > 0 and step % self.schedule.eval_every == 0
        return self.position == 0 and self.epoch > 0  # at an epoch's end

    def _due(self, what: str, every: int | None, step: int) -> bool:
        """Whether ``step`` reached a new multiple of ``every`` since ``what`` was last due."""
        if not every:
            return False
        mark = step // every
        if mark > self.marks.get(what, self.start // every):
            self.marks[what] = mark
            return True
        return False


def _plain(window: list[StepOutput]) -> list[dict[str, Any]]:
    """Step outputs as a checkpoint holds them: on the CPU (any device can resume), plain dicts of tensors."""
    return [
        UnloggedStep(o.loss.cpu(), {k: v.cpu() for k, v in o.metrics.items()}, bool(o.skipped)).to_file()
        for o in window
    ]

"""ct.run's ``on_record``: each log and evaluation record to the user's tracker, once, on rank 0.

``Records`` sits before the metrics file (``monitor.MetricsLog``): it hands the tracker a copy of each record, and the
file gets the record's line once that call returned, so that what a file holds the tracker was sent (a process killed
inside the call sends that record again when resumed: twice, perhaps, never lost). A resumed run therefore knows what
not to send again: the checkpoint's records are never replayed, and those the interrupted run wrote after its
checkpoint (which the resumed run makes again by redoing updates) were sent; the resumed run rewrites the file
from its checkpoint, so it lists those beside it first (``sent_file``): killed again before it made them, the next
run still knows them, however many times that happens. A tracker that raises is called no
more; the driver stops after a save and raises ``error()``, so a lost tracker never costs the training done.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from composetrain.core.util import RUN, show

__all__ = ["Records", "Tracker", "deferred_kind", "sent_file"]

Tracker: TypeAlias = Callable[[dict[str, Any]], Any]  # ct.run's on_record: receives each record, returns nothing


# what calling such a function returns instead of running its body (a record it was given would be lost)
_DEFERRED = (
    (inspect.isasyncgenfunction, inspect.isasyncgen, "an async generator"),
    (inspect.iscoroutinefunction, inspect.isawaitable, "a coroutine"),
    (inspect.isgeneratorfunction, inspect.isgenerator, "a generator"),
)


def deferred_kind(fn: Any) -> str | None:
    """What ``fn(record)`` would return without running a line of ``fn`` (a generator, a coroutine; None: it
    runs): a generator or ``async def`` function, also behind ``functools.partial`` or as ``__call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    for target in (fn, inspect.getattr_static(type(fn), "__call__", None)):
        for is_function, _, kind in _DEFERRED:
            if target is not None and is_function(target):
                return kind
    return None


def sent_file(path: Path) -> Path:
    """Where the records that an interrupted run sent and a resumed run has not yet made again are listed, as
    ``[[step, evaluation?], ...]``, beside the metrics file ``path`` (hidden: ``.metrics.jsonl.sent``)."""
    return path.with_name(f".{path.name}.sent")


class Records:
    """The records on their way to ``on_record`` (None: none, as on every rank but 0).

    Attributes:
        failed: the record on which ``on_record`` raised, and the exception, or None.
    """

    def __init__(self, on_record: Tracker | None) -> None:
        self.on_record = on_record
        self.failed: tuple[dict[str, Any], BaseException] | None = None
        self.last = (0.0, 0)  # seconds the last call took, and its record's step: a slow one holds every rank
        self.sent: set[tuple[int, bool]] = set()  # (step, evaluation?) of records an interrupted run wrote

    def resume(self, written: str, path: Path, step: int) -> None:
        """The metrics file ``path`` that a run resumed at ``step`` continues (its text ``written``): each whole
        record in it was sent, and so was each that an earlier resumed run found in it (the file is rewritten
        from the checkpoint, dropping them: a second crash before they are made again would forget them). Those
        the updates from ``step`` on make again go to ``sent_file(path)`` before the file is rewritten."""
        for line in written.splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # a line cut short by a crash: sent again (its call returned)
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                self.sent.add((record["step"], isinstance(record.get("eval"), dict)))
        kept = sent_file(path)
        try:
            earlier = json.loads(kept.read_text()) if kept.is_file() else []
        except (OSError, ValueError, RecursionError):  # damaged (os.replace never leaves one cut short)
            earlier = []
        if isinstance(earlier, list):  # its [step, evaluation?] pairs: anything else in a damaged file left out
            pairs = [p for p in earlier if type(p) is list and len(p) == 2]
            self.sent.update((s, e) for s, e in pairs if type(s) is int and type(e) is bool)
        # records before ``step`` are the checkpoint's (never sent again); its evaluation at ``step`` may be redone
        self.sent = {(s, e) for s, e in self.sent if s >= step}
        if not self.sent:
            self.forget(path)
            return
        tmp = kept.with_name(kept.name + ".tmp")
        tmp.write_text(json.dumps(sorted(self.sent)))
        os.replace(tmp, kept)  # whole or not at all: before the metrics file drops the lines

    def forget(self, path: Path) -> None:
        """No record of the metrics file ``path`` was sent by an earlier run: a fresh start, or a file set aside."""
        self.sent = set()
        sent_file(path).unlink(missing_ok=True)

    def send(self, record: dict[str, Any]) -> None:
        """Hand ``on_record`` a copy of ``record`` (it may change its own), unless it was sent or a record failed."""
        if self.on_record is None or self.failed is not None or (record["step"], "eval" in record) in self.sent:
            return
        started = time.perf_counter()
        try:
            returned = self.on_record(copy.deepcopy(record))
            kind = next((kind for _, is_kind, kind in _DEFERRED if is_kind(returned)), None)
            if kind is not None:  # nothing of it ran: the record would be lost without a word
                getattr(returned, "close", lambda: None)()  # no "never awaited" warning besides the error
                raise TypeError(
                    f"on_record returned {kind} ({show(returned)}): it ran none of its body, so the record "
                    "never reached the tracker; on_record must do its work when called (log synchronously)"
                )
        except (Exception, KeyboardInterrupt, SystemExit) as e:  # the user's tracker: the run stops saved, then raises
            self.failed = (record, e)
        finally:
            self.last = (time.perf_counter() - started, record["step"])

    def slow(self, timeout: float) -> str | None:
        """What to add to a lost rank's error when ``on_record`` itself took about the timeout (rank 0), or None."""
        seconds, step = self.last
        if self.on_record is None or seconds < 0.5 * timeout:
            return None
        return (
            f"on_record took {seconds:.1f}s on the record of update {step}, while every other rank waited for this one "
            f"(timeout={timeout:g}s): make it return quickly (log in a background thread, or queue the record), or "
            "raise ct.run's timeout"
        )

    def error(self, saved: Path | str | None) -> BaseException:
        """What to raise once the run stopped and saved (at ``saved``, None: no checkpoint) for ``failed``: a
        RuntimeError naming the record; a KeyboardInterrupt or SystemExit itself, with that as its note (a stop
        asked for stays one)."""
        assert self.failed is not None  # for the type checker: called only then
        record, e = self.failed
        kind = "evaluation record" if "eval" in record else "record"
        where = (
            f"saved checkpoint {str(saved)!r} and stopped: fix on_record and run the same command again to resume "
            "there (the record is in the metrics file and the run's history, and is not sent again)"
            if saved is not None
            else "stopped (no checkpoint_dir to save in): the trained state is in the TrainState"
        )
        shown = json.dumps(record)
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        if not isinstance(e, Exception):
            if hasattr(e, "add_note"):  # Python 3.11 on
                e.add_note(f"{RUN}: on_record raised it on the {kind} of update {record['step']}; the run {where}")
            return e
        return RuntimeError(
            f"{RUN}: on_record raised {type(e).__name__}: {e} on the {kind} of update {record['step']} ({shown}); "
            f"the run {where}"
        )

"""Checkpoints for ct.run: atomic, per-rank random state, the latest valid one wins; written in the background.

A checkpoint is a folder ``step-000001234/`` holding ``state.pt`` (written by rank
0: the TrainState and the loop's position) and ``rank-<rank>.pt`` (every rank's
random number generators and its own loop state, such as metrics not yet logged).
It is written under a hidden temporary name in the same folder, every file
fsynced, then renamed into place and the folder fsynced: a crash mid-save leaves
the previous checkpoint as the latest valid one. Files hold tensors and plain types
only and load with ``weights_only=True``: resuming never runs code from the folder.

A save happens in three parts: ``_begin`` (every check, on every rank alike, and the temporary folder), the writes
(each rank its own files, each fsynced, its checksum kept), and ``_publish`` (rank 0 lists every checksum, makes
the folder durable, renames it into place; only then are older checkpoints pruned). ``save`` runs them in turn;
``save_async`` stages what this rank writes (a copy off the live tensors), hands the writes to a thread and
returns; ``finish`` waits for them and publishes, on every rank together, at an update boundary.

One run at a time: every process that writes holds ``.lock-rank-<rank>`` in the folder
(``fcntl.flock``, released by the kernel when its holder ends, even by SIGKILL), so a
second run on the same folder is refused before it touches anything. Only folders named
exactly as ``save`` names them are checkpoints, ordered by their number; anything else
is left where it is, with a warning. Files that are not regular files are never opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import functools
import io
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter

from composetrain.checkpoint.background import Staged, Writer, io_step, stage
from composetrain.checkpoint.checksums import CHECKSUMS, Hashing, digest, mismatch, read_sums, write_sums
from composetrain.checkpoint.folder import (
    LEFTOVER,
    SHARDS,
    STATE_FILE,
    foreign,
    human,
    is_checkpoint,
    os_error,
    rank_file,
    size_of,
    step_of,
    take_lock,
)
from composetrain.checkpoint.format import (
    LOCAL,
    SHARED,
    check_fits,
    local_problem,
    read,
    same_ranks,
    shared_problem,
    stamp_local,
    stamp_shared,
    unlogged_problem,
    unplain,
)
from composetrain.checkpoint.shards import ShardFiles, split
from composetrain.core.util import RUN
from composetrain.launch.agree import all_true, from_rank0, gathered

__all__ = ["Checkpoints", "Flush", "StepWriter", "mark_name", "mark_text", "parse_mark"]


def _write(obj: Any, path: Path) -> str:
    """``obj`` saved in ``path``, durable: the SHA-256 of what was written, hashed as it went."""
    io_step(f"write {path.name}")
    with open(path, "wb") as f:
        hashing = Hashing(f)
        torch.save(obj, cast(IO[bytes], hashing))
        f.flush()
        io_step(f"fsync {path.name}")
        os.fsync(f.fileno())
    return hashing.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StepWriter(FileSystemWriter):
    """DCP's FileSystemWriter, its two I/O steps (this rank's shard files; rank 0's metadata) marked."""

    def write_data(self, *args: Any, **kwargs: Any) -> Any:
        io_step(f"write {SHARDS}/")
        return super().write_data(*args, **kwargs)

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        io_step(f"write {SHARDS}/.metadata")
        return super().finish(*args, **kwargs)


@dataclasses.dataclass
class Flush:
    """One save from its checks to its publication: where it goes (``final``) and is written first (``tmp``),
    what this rank writes (``files``: file name to value; emptied once staged), the sharded tensors (DCP's), the
    checksums of the files written so far, and DCP's writes in flight (``save_async``)."""

    step: int
    final: Any
    tmp: Any
    files: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    size: int  # bytes of tensor data, for the messages
    written: dict[str, str] = dataclasses.field(default_factory=dict)
    shards: Any = None


# A failed run's rank 0 waits for the other ranks' parts of the save in flight this long at most, beyond four times
# what the save took on rank 0 (and never past ``timeout``): Checkpoints.abandon
MARKS_GRACE = 30.0


class Checkpoints:
    """The checkpoints of one run in ``directory``, written and read by all ranks together (for ``ct.run``,
    which its messages name).

    Every decision (the directory is writable, which checkpoint loads) is made once and
    shared, so that no rank raises while the others wait in a collective.

    Args:
        directory: where checkpoints live; created if missing, checked writable.
        rank, world_size: this process in the job.
        keep: how many of the newest checkpoints to keep.
        data_shards: the data shard each rank reads (``Capabilities.data_shard``; None: rank r reads shard r): a
            rank's own file continues only on processes laid out alike.
        shards: where a sharded TrainState's tensors go (``ct.sharded``): each rank writes its own
            through torch.distributed.checkpoint, into ``shards/``.
        timeout: seconds a background save's own collectives (DCP's, sharded) wait for the other ranks, and
            ``abandon`` for this rank's writes.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rank: int,
        world_size: int,
        keep: int,
        shards: ShardFiles | None = None,
        data_shards: list[int] | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.shards = shards
        self.data_shards = list(range(world_size)) if data_shards is None else list(data_shards)
        self.dir: Any = self._locate(directory)
        self.rank, self.world_size, self.keep, self.timeout = rank, world_size, keep, timeout
        self.newest: Any = None  # the last checkpoint this object published
        self._lock: io.FileIO | None = None
        self._writer = Writer()
        self._pending: Flush | None = None  # the save whose writes are in flight (save_async)
        self._began = 0.0  # when it began (time.monotonic())
        self._group: Any = None  # the process group of background DCP writes
        self._open()

    local = True  # a folder of this machine's (a rename publishes); ObjectCheckpoints: object storage

    def _locate(self, directory: Any) -> Any:
        """Where the checkpoints live, as the other methods take it (a local folder: its Path)."""
        return Path(directory).expanduser()

    def _open(self) -> None:
        """Check the folder writable, take it for this run, and remove what an interrupted save left."""
        rank = self.rank
        problem = None
        if rank == 0:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                probe = self.dir / f".write-test-{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as e:
                problem = e.strerror or str(e)
        problem = from_rank0(problem)
        if problem is not None:
            raise PermissionError(
                f"{RUN}: checkpoint_dir {str(self.dir)!r} is not writable ({problem}); choose a folder you can write to"
            )
        self._lock, holder, held = take_lock(self.dir, rank)  # every rank its own file
        if not all_true(holder is None):
            self.close()
            if not all_true(not held):  # another run holds some rank's lock
                seen = holder if held else "seen by another rank"
                raise RuntimeError(
                    f"{RUN}: checkpoint_dir {str(self.dir)!r} is in use by another run ({seen}); two runs in one "
                    "folder would overwrite each other's checkpoints and metrics: wait for that run to end (its "
                    "lock goes with it), or give this one another checkpoint_dir"
                )
            why = holder or "another rank could not take its lock file"
            raise RuntimeError(
                f"{RUN}: cannot lock checkpoint_dir {str(self.dir)!r} ({why}); the lock keeps a second run out of "
                "the folder"
            )
        if rank == 0:  # the folder is ours alone now: what an interrupted save left is no live run's
            for stale in sorted(self.dir.iterdir()):
                if LEFTOVER.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
                    final = self.dir / stale.name[1:].rsplit(".", 1)[0]
                    restore = stale.name.endswith(".old") and step_of(final.name) is not None
                    if restore and not os.path.lexists(final) and is_checkpoint(stale):
                        os.replace(stale, final)  # a re-save died between its two renames: this is the checkpoint
                    else:
                        shutil.rmtree(stale, ignore_errors=True)
        self._barrier()

    def close(self) -> None:
        """Let the folder go (the kernel does it too when this process ends, however it ends); a save still in
        flight is abandoned first, never published."""
        try:
            self.abandon()
        finally:
            if self._group is not None:
                group, self._group = self._group, None
                dist.destroy_process_group(group)
            if self._lock is not None:
                lock, self._lock = self._lock, None
                lock.close()  # closing the only descriptor releases the flock

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    # -- saving: begin (checks, staging, the temporary folder), write, publish -------------------------------------
    def save(self, step: int, payload: dict[str, Any], local: dict[str, Any], nonfinite: str | None = None) -> Path:
        """Write ``payload`` (rank 0's), and ``local`` with this rank's RNG states, as checkpoint
        ``step``, atomically; then drop all but the ``keep`` newest older ones. ``nonfinite``: the name of a
        parameter holding NaN or inf on this rank: then nothing is written or dropped, on any rank (a diverged
        model must never prune the finite checkpoints it could resume from). A save in flight (``save_async``)
        is finished and published first."""
        self.finish()
        flush = self._begin(step, payload, local, nonfinite)
        self._agreed(flush, lambda: self._write_files(flush, flush.files))
        if flush.tensors and self.shards is not None:  # every rank alike: the same state is sharded everywhere
            self._agreed(flush, lambda: self._write_shards(flush))
        return self._publish(flush, gathered(flush.written))

    def save_async(
        self, step: int, payload: dict[str, Any], local: dict[str, Any], nonfinite: str | None = None
    ) -> None:
        """``save``, with the writing off this thread: the checks, the copy of what this rank writes (its
        tensors into new host memory: ``background.stage``) and the temporary folder now, on every rank together;
        the files written by a thread while training goes on; published by ``finish``, once every
        rank's files are durable. At most one save is in flight: a save in flight is finished first (this
        waits for its writes)."""
        self.finish()
        self._began = time.monotonic()
        flush = self._begin(step, payload, local, nonfinite)
        copies: list[Staged] = []  # the copy made on every rank, or an error (no host memory left) on every rank
        self._agreed(flush, lambda: copies.append(stage(flush.files)))
        staged = copies[0]
        if flush.tensors and self.shards is not None:  # DCP stages the shards now, and writes them in its thread
            if self._group is None and dist.is_available() and dist.is_initialized():
                # the writes' own collectives, on a group of their own: never between the training's
                self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))
            flush.shards = self._shards_async(flush)

        def work() -> dict[str, str]:
            error: BaseException | None = None
            try:
                self._write_files(flush, staged.ready())
            except BaseException as e:
                error = e
            if flush.shards is not None:  # DCP's thread done with the folder before it is published or removed
                shards, flush.shards = flush.shards, None
                error = error or shards.exception()
                if error is None:
                    flush.written.update(self._shard_sums(flush))
            if self.world_size > 1:  # this rank's part told in the folder: rank 0 can publish alone (abandon)
                try:
                    self._mark(flush, None if error is None else f"{type(error).__name__}: {error}")
                except Exception as e:  # a full disk: the mark of a failure too (rank 0 then waits its timeout)
                    error = error or e
            if error is not None:
                raise error
            return flush.written

        flush.files = {}  # the live values: only the staged copy is read from here on
        self._pending = flush
        self._writer.start(work, name=f"checkpoint step {step}")

    @property
    def in_flight(self) -> bool:
        """Whether this rank's writes of a save are still going on."""
        return self._writer.busy

    @property
    def pending(self) -> int | None:
        """The step of the save started by ``save_async`` and not yet published, or None."""
        return None if self._pending is None else self._pending.step

    def finish(self) -> Path | None:
        """Wait for the save in flight, if any, and publish it: on every rank together (a collective). Its error
        (a full disk) is raised on every rank alike, nothing of it left behind, the previous checkpoint the
        newest. Returns the checkpoint published, or None when none was in flight."""
        flush = self._pending
        if flush is None:
            return None
        self._writer.wait()
        self._pending = None
        written, failure = self._writer.outcome()
        self._fail_if(flush, failure)
        return self._publish(flush, gathered(written))

    def abandon(self) -> None:
        """The run failed with a save in flight: it is published if every rank wrote its part, else given up (never
        published; what it left is removed by the next run), as a synchronous save would have been published
        before the failure. Each rank waits for its own writes (``timeout`` seconds at most). Alone, this process
        then publishes it; with several, the ranks may be anywhere (in a collective that will never complete, or
        gone), so none is asked to agree: each rank's writer left its checksums in the folder once its part was
        written (``_mark``), and rank 0 publishes the save once every rank's are there, waiting for them until
        ``timeout`` seconds have passed since the failure (a rank that died mid-write never leaves them), and no
        longer than ``MARKS_GRACE`` seconds plus four times as long as the save has taken here so far: the ranks
        began it together, a live rank's part is written in about the time this one's was, and waiting for a dead
        rank's would hold the job's restart for the whole ``timeout``."""
        flush = self._pending
        if flush is None:
            return
        deadline = time.monotonic() + self.timeout
        written = self._writer.wait(self.timeout)
        now = time.monotonic()
        deadline = min(deadline, now + MARKS_GRACE + 4 * (now - self._began))
        if written and self.world_size == 1:
            with contextlib.suppress(Exception):  # a failed write: removed, the run's own error goes on
                self.finish()
        elif written and self.rank == 0 and self._writer.outcome()[1] is None:
            with contextlib.suppress(Exception):  # the store or the disk failing now: the next run tidies
                parts = self._wait_for_marks(flush, deadline)
                if parts is not None:
                    self._publish_alone(flush, parts)
        self._pending = None

    def _wait_for_marks(self, flush: Flush, deadline: float) -> list[dict[str, str]] | None:
        """Every rank's checksums, as its writer left them in ``flush``'s folder, once all are there; None as soon
        as some rank's writes are marked failed, or when some rank's mark is still missing at ``deadline``."""
        parts: dict[int, dict[str, str]] = {}
        pause = 0.05  # then longer: each look is a request per missing rank in object storage
        while True:
            for rank in range(self.world_size):
                if rank not in parts:
                    found = self._read_mark(flush, rank)
                    if isinstance(found, str):  # that rank's writes failed: nothing to publish
                        return None
                    if found is not None:
                        parts[rank] = found
            if len(parts) == self.world_size:
                return [parts[r] for r in range(self.world_size)]
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2.0, pause * 1.5)

    def _begin(self, step: int, payload: dict[str, Any], local: dict[str, Any], nonfinite: str | None) -> Flush:
        """Every check, on every rank alike, before anything is written; then the temporary folder."""
        if not all_true(nonfinite is None):
            told = gathered(nonfinite)
            rank = next(r for r, name in enumerate(told) if name is not None)
            previous = next(iter(self._steps()), None) if self.rank == 0 else None
            previous = from_rank0(self._name(previous) if previous is not None else None)
            kept = f"the last checkpoint {previous} is kept, unchanged" if previous else "there is no checkpoint yet"
            where = f" on rank {rank}" if self.world_size > 1 else ""
            raise FloatingPointError(
                f"{RUN}: refusing to save checkpoint step {step}: the model's parameter {told[rank]!r} holds NaN "
                f"or inf{where}, so the training diverged by update {step}; the run stopped, nothing was saved and "
                f"{kept}: find the cause (a learning rate too high, a bad batch, no gradient clipping; "
                "ct.mixed_precision's loss scaling skips non-finite updates) before resuming from it"
            )
        local = stamp_local(local)
        payload, tensors = split(payload) if self.shards is not None else (payload, {})  # sharded: placeholders
        problem = unplain(local, rank_file(self.rank)) or (unplain(payload, STATE_FILE) if self.rank == 0 else None)
        if not all_true(problem is None):  # before anything is written, on every rank alike
            raise TypeError(
                f"{RUN}: cannot checkpoint step {step}: {problem or 'another rank holds what it cannot save'}; "
                "a checkpoint holds tensors and plain types only (dict, list, tuple, str, int, float, bool, None), "
                "which load without running code: convert that value in its state_dict()"
            )
        final, tmp = self._places(step)
        what = self._taken(final) if self.rank == 0 else None
        if not all_true(what is None):  # before anything is written: the user's folder stays as it is
            raise FileExistsError(
                f"{RUN}: cannot save checkpoint step {step}: {final} exists and is not a checkpoint "
                f"({what or 'seen by rank 0'}), so ct.run leaves it alone; move it out of checkpoint_dir and rerun"
            )
        files = {rank_file(self.rank): local}
        if self.rank == 0:
            files[STATE_FILE] = stamp_shared(payload, self.world_size, self.data_shards)
        size = size_of(payload) + size_of(local) + size_of(tensors)  # only for the messages
        flush = Flush(step, final, tmp, files, tensors, size)
        self._agreed(flush, lambda: self._prepare(flush))
        return flush

    def _agreed(self, flush: Flush, phase: Callable[[], Any]) -> None:
        """``phase`` on this rank, then whether it went well everywhere (the collective that also orders the
        phases); a failure (a full disk) raises on every rank, nothing left behind."""
        failure: BaseException | None = None
        try:
            phase()
        except Exception as e:  # torch.save reports a full disk as a RuntimeError caused by the OSError
            failure = e
        self._fail_if(flush, failure)

    def _fail_if(self, flush: Flush, failure: BaseException | None) -> None:
        """Raise, on every rank, the error of a save that failed on any (``failure``: this rank's, or None),
        once rank 0 removed what it wrote; each rank learns which rank failed and why."""
        if all_true(failure is None):
            return
        if self.rank == 0:
            self._discard(flush)  # nothing that looks like a checkpoint, the space back
        cause = os_error(failure)
        mine = None if cause is None else (cause.errno, cause.strerror, cause.filename)
        # every rank learns which rank failed and why (a full disk is ENOSPC on all of them alike)
        told = gathered((failure is not None, mine))
        if failure is not None and cause is None:
            raise failure  # not the disk: as it came (every other rank says the step was not saved)
        rank = self.rank if failure is not None else next(r for r, (failed, _) in enumerate(told) if failed)
        if cause is None:
            rank = next((r for r, (_, info) in enumerate(told) if info is not None), rank)
            info = told[rank][1]
            cause = None if info is None else OSError(info[0], info[1], info[2])
        raise self._save_failed(flush.step, cause, flush.size, rank) from failure

    def _write_files(self, flush: Flush, files: dict[str, Any]) -> None:
        """This rank's files (its own, and rank 0 ``state.pt``), each durable, its checksum kept."""
        for name, value in files.items():
            flush.written[name] = self._write_file(flush, name, value)

    def _write_shards(self, flush: Flush) -> None:  # every rank alike: the same state is sharded everywhere
        assert self.shards is not None
        self.shards.save(flush.tensors, self._shard_folder(flush), writer=self._shard_writer(flush))
        flush.written.update(self._shard_sums(flush))

    def _shards_async(self, flush: Flush) -> Any:
        assert self.shards is not None
        return self.shards.save_async(
            flush.tensors, self._shard_folder(flush), self._group, writer=self._shard_writer(flush)
        )

    def _publish(self, flush: Flush, everyone: list[dict[str, str]]) -> Path:
        """Rank 0 lists every rank's checksums and makes the checkpoint what ``latest`` finds (all of it
        durable first); then the older ones beyond ``keep`` go. Every rank returns once it is published."""
        sums = {name: sum_ for part in everyone for name, sum_ in part.items()}
        self._agreed(flush, lambda: self._seal(flush, sums) if self.rank == 0 else None)
        self._agreed(flush, lambda: self._commit(flush, sums) if self.rank == 0 else None)  # every rank learns
        if self.rank == 0:
            self._prune(flush.step)
        self._barrier()
        self.newest = flush.final
        return flush.final

    def _publish_alone(self, flush: Flush, everyone: list[dict[str, str]]) -> None:
        """``_publish`` by rank 0 alone, no other rank taking part (``abandon``); its errors raised here."""
        sums = {name: sum_ for part in everyone for name, sum_ in part.items()}
        self._seal(flush, sums)
        self._commit(flush, sums)
        self._prune(flush.step)
        self.newest = flush.final

    def _prune(self, step: int) -> None:
        """Rank 0: the checkpoints older than ``step`` beyond ``keep`` removed; ``step``'s, just published, never."""
        older = [p for p in self._steps() if self._step(p) < step]
        for stale in older[self.keep - 1 :]:
            self._remove(stale)

    def taken(self, step: int) -> bool:
        """Whether something that is no checkpoint sits where checkpoint ``step`` would be published (a save there
        is refused): rank 0 looks, every rank learns."""
        return bool(from_rank0(self._taken(self._places(step)[0]) is not None if self.rank == 0 else None))

    # -- the local folder: a temporary folder, each file and folder fsynced, one rename ---------------------------
    def _places(self, step: int) -> tuple[Any, Any]:
        """Where checkpoint ``step`` is published, and where it is written first."""
        return self.dir / f"step-{step:09d}", self.dir / f".step-{step:09d}.tmp"

    def _taken(self, final: Any) -> str | None:
        """What sits at ``final`` that is no checkpoint (a save there is refused), or None."""
        if not os.path.lexists(final) or is_checkpoint(final):
            return None
        if final.is_symlink():
            return "it is a link"
        return f"it holds no {STATE_FILE}" if final.is_dir() else "it is a file"

    def _prepare(self, flush: Flush) -> None:
        if self.rank == 0:
            io_step(f"mkdir {flush.tmp.name}")
            shutil.rmtree(flush.tmp, ignore_errors=True)
            flush.tmp.mkdir()

    def _write_file(self, flush: Flush, name: str, value: Any) -> str:
        return _write(value, flush.tmp / name)

    def _shard_folder(self, flush: Flush) -> Any:
        return flush.tmp

    def _shard_writer(self, flush: Flush) -> Any:
        return StepWriter(flush.tmp / SHARDS, sync_files=True)

    def _shard_sums(self, flush: Flush) -> dict[str, str]:
        # DCP names each rank's files __<rank>_<n>.distcp; the coordinator (rank 0) writes .metadata
        mine = [
            *(flush.tmp / SHARDS).glob(f"__{self.rank}_*"),
            *((flush.tmp / SHARDS).glob(".metadata") if self.rank == 0 else []),
        ]
        found = {}
        for p in mine:
            if p.is_file():
                io_step(f"digest {SHARDS}/{p.name}")
                found[f"{SHARDS}/{p.name}"] = digest(p)
        return found

    def _mark(self, flush: Flush, failed: str | None) -> None:
        """This rank's part of ``flush`` written (its checksums) or ``failed`` (why), said in the temporary folder,
        whole or not at all (``abandon``: rank 0 publishes alone once every rank's are there; ``_seal`` removes
        them)."""
        mark = flush.tmp / mark_name(self.rank)
        part = mark.with_name(mark.name + ".part")
        io_step(f"write {mark.name}")
        part.write_text(mark_text(flush.written, failed))
        os.replace(part, mark)

    def _read_mark(self, flush: Flush, rank: int) -> dict[str, str] | str | None:
        """The checksums ``rank`` left in ``flush``'s temporary folder, why its writes failed (a str), or None while
        it left nothing readable."""
        try:
            return parse_mark((flush.tmp / mark_name(rank)).read_text())
        except (OSError, ValueError):
            return None

    def _seal(self, flush: Flush, sums: dict[str, str]) -> None:
        """Rank 0: the checksums listed, then every entry of the temporary folder durable."""
        for mark in flush.tmp.glob(".written-rank-*"):  # the ranks' marks (several ranks): no file of the checkpoint
            io_step(f"remove {mark.name}")
            mark.unlink(missing_ok=True)
        io_step(f"write {CHECKSUMS}")
        write_sums(flush.tmp, sums)
        if (flush.tmp / SHARDS).is_dir():
            io_step(f"fsync {SHARDS}/")
            _fsync_dir(flush.tmp / SHARDS)
        io_step(f"fsync {flush.tmp.name}/")
        _fsync_dir(flush.tmp)

    def _commit(self, flush: Flush, sums: dict[str, str]) -> None:
        """Rank 0: one rename publishes the checkpoint, made durable; a checkpoint saved at this step before (a
        skipped update) is kept under ``.step-N.old`` until the new one is in place."""
        old = self.dir / f".step-{flush.step:09d}.old"
        if flush.final.exists():
            io_step(f"rename {flush.final.name} {old.name}")
            os.replace(flush.final, old)
        io_step(f"rename {flush.tmp.name} {flush.final.name}")  # the checkpoint is published by this rename
        os.replace(flush.tmp, flush.final)
        io_step("fsync checkpoint_dir")
        _fsync_dir(self.dir)
        if old.exists():
            io_step(f"remove {old.name}")
        shutil.rmtree(old, ignore_errors=True)

    def _discard(self, flush: Flush) -> None:
        shutil.rmtree(flush.tmp, ignore_errors=True)

    def _remove(self, checkpoint: Any) -> None:
        io_step(f"remove {checkpoint.name}")
        shutil.rmtree(checkpoint, ignore_errors=True)

    def _name(self, checkpoint: Any) -> str:
        return checkpoint.name

    def _step(self, checkpoint: Any) -> int:
        step = step_of(checkpoint.name)
        assert step is not None  # _steps lists checkpoints only
        return step

    def refuse_in_the_way(self, saves: Any) -> None:
        """Refuse, on every rank and before any training, what sits where a save this run makes would go:
        a folder named like a checkpoint at a step for which ``saves(step)`` is true, but no checkpoint (no
        ``state.pt``), that ``save`` would refuse only once the training up to it is done."""
        found = []
        if self.rank == 0:
            for p in sorted(self.dir.iterdir()):
                step = step_of(p.name)
                if step is not None and saves(step) and not is_checkpoint(p):
                    found.append((p.name, "a link" if p.is_symlink() else "a folder" if p.is_dir() else "a file"))
        found = from_rank0(found)
        if found:
            name, kind = found[0]
            what = f"{kind} without {STATE_FILE}" if kind == "a folder" else kind
            raise FileExistsError(
                f"{RUN}: {self.dir / name} is named as the checkpoint of step {step_of(name)}, which this run saves, "
                f"but it is no checkpoint ({what}); ct.run leaves it alone, and its save there would be refused "
                "after training up to it: move it out of checkpoint_dir (a checkpoint that lost its state.pt "
                "cannot be resumed from) and rerun"
            )

    def _save_failed(self, step: int, failure: OSError | None, size: int, rank: int) -> OSError:
        """The error a failed save raises: what failed, on which rank, where, and that the previous
        checkpoint is intact."""
        previous = self._previous()
        intact = "there is no previous checkpoint"
        if previous is not None:
            intact = f"the previous checkpoint {previous} is intact"
        if failure is None:
            return OSError(
                f"{RUN}: checkpoint step {step} was not saved: rank {rank} could not write its part (its own "
                f"error says why); {intact}"
            )
        cause = f"{failure.strerror or failure}" + (f": {failure.filename}" if failure.filename else "")
        cause += f", on rank {rank}" if self.world_size > 1 else ""
        if failure.errno in (errno.ENOSPC, errno.EDQUOT):
            return OSError(
                failure.errno,
                f"{RUN}: no space left in {self.dir} for checkpoint step {step} (writing about "
                f"{human(size)}; {cause}); {intact} and {self.LEFT.format(step=step)}; free some space, "
                "lower keep_checkpoints, or point checkpoint_dir at a larger disk",
            )
        said = (
            f"{RUN}: checkpoint step {step} could not be written in {self.dir} ({cause}); {intact} and "
            f"{self.LEFT.format(step=step)}"
        )
        return OSError(failure.errno, said) if failure.errno is not None else OSError(said)

    LEFT = "nothing of step {step} was left behind"  # what a failed save leaves, as its error says

    def _previous(self) -> str | None:
        """The name of the newest checkpoint, for a failed save's error."""
        previous = next(iter(self._steps()), None)
        return None if previous is None else self._name(previous)

    def _steps(self) -> list[Path]:
        """This run's checkpoints, newest first: folders named as ``save`` names them, holding their state file."""
        found = [(step_of(p.name), p) for p in self.dir.iterdir()]
        ours = [(n, p) for n, p in found if n is not None and is_checkpoint(p)]
        return [p for _, p in sorted(ours, key=lambda np_: np_[0], reverse=True)]

    def latest(self) -> tuple[Path, dict[str, Any], dict[str, Any] | None] | None:
        """The newest checkpoint that every rank can load: (path, payload, this rank's part).

        This rank's part is None when the checkpoint was written by another number of processes, or by processes
        that read other data shards (another mesh layout), which only a run defined by its global batch continues
        (``check_fits`` refuses any other): no rank's own file applies then, none is read, and ranks that wrote
        none (more of them now) or that are gone (fewer) make no difference.

        Every rank reads it (the folder must be shared by the nodes). Files are loaded with
        ``weights_only=True`` and checked against what ``ct.run`` writes (random states are
        tried on fresh generators), so that resuming never runs code and never fails half-way.
        One that does not pass is skipped with a warning and moved aside (``corrupt-step-...``),
        so that it never shadows the good ones again; when none is left and some were set aside (now or by an
        earlier run), every rank refuses rather than starting the run over.
        """
        if self.rank == 0:
            for line in self._foreign():
                warnings.warn(f"{RUN}: {line}", stacklevel=2)
        for name in from_rank0([p.name for p in self._steps()] if self.rank == 0 else None):
            path = self.dir / name
            step = step_of(name)
            payload, problem = self._read(path, STATE_FILE, SHARED, functools.partial(shared_problem, step=step))
            local, read_all = None, False  # this rank's part, and whether every part it needs was read
            if all_true(payload is not None):
                assert payload is not None
                check_fits(payload, self.world_size, path, self.data_shards)  # one file everywhere: all raise alike
                mine = same_ranks(payload, self.world_size, self.data_shards)
                if mine:
                    local, problem = self._read(path, rank_file(self.rank), LOCAL, local_problem)
                    problem = problem or (local and unlogged_problem(payload, local["window"]))
                    local = None if problem else local
                read_all = not mine or local is not None
            if all_true(read_all) and self.shards is not None:
                assert payload is not None
                payload, problem = self._with_shards(path, payload)
                read_all = payload is not None
            if all_true(read_all):
                assert payload is not None
                return path, payload, local
            if self.rank == 0:
                aside = self._set_aside(path, f"corrupt-{name}")
                warnings.warn(
                    f"{RUN}: skipping unreadable checkpoint {path}: {problem or 'on another rank'}; moved to {aside}",
                    stacklevel=2,
                )
            self._barrier()
        aside = from_rank0(self._set_aside_names() if self.rank == 0 else None)
        if aside:  # every checkpoint of this run is corrupt: starting afresh would lose its training unnoticed
            raise RuntimeError(
                f"{RUN}: no checkpoint in {self.dir} could be read (set aside: {', '.join(aside)}), so this run "
                "would start over from its first update; restore a checkpoint into it, or move the "
                "corrupt-step-* folders out of checkpoint_dir to start afresh"
            )
        return None

    def _foreign(self) -> list[str]:
        """What in the folder looks like a checkpoint, is none, and is left alone: one line each."""
        return foreign(self.dir)

    def _set_aside(self, checkpoint: Any, name: str) -> str:
        """Move a corrupt ``checkpoint`` to ``name`` (or ``name-2``...: the first free); the name it got."""
        aside = _free(self.dir, name)
        os.replace(checkpoint, aside)
        return aside.name

    def _set_aside_names(self) -> list[str]:
        return sorted(p.name for p in self.dir.glob("corrupt-step-*"))

    def _read(self, path: Any, name: str, schema: dict[str, Any], deep: Any) -> tuple[Any, str | None]:
        """``format.read`` of ``path/name``, its bytes first checked against the checksum written with it (a
        mismatch: corrupt); a file this user may not read is no corrupt file: every rank
        refuses the checkpoint, which is left as it is (setting it aside would start the run over)."""
        denied: OSError | None = None
        try:
            value, problem = self._verified(path, name, schema, deep)
        except PermissionError as e:
            value, problem, denied = None, None, e
        if not all_true(denied is None):
            why = f"{denied.strerror or denied}: {denied.filename}" if denied else "on another rank"
            raise PermissionError(
                errno.EACCES,
                f"{RUN}: cannot read checkpoint {path} ({why}); it is left as it is: give this run read access "
                "to it (chmod, chown), or move it out of checkpoint_dir to resume from an older one",
            )
        return value, problem

    def _verified(self, path: Path, name: str, schema: dict[str, Any], deep: Any) -> tuple[Any, str | None]:
        """``format.read`` of ``path/name`` once its bytes matched their checksum, or why not."""
        sums, problem = read_sums(path)
        problem = problem or mismatch(path, name, sums)
        value, problem = (None, problem) if problem else read(path / name, schema, deep)
        if value is not None and name == STATE_FILE and sums is None and value["format"] >= 3:
            value, problem = None, f"it lacks {CHECKSUMS}, which every checkpoint of format 3 holds"
        return value, problem

    def _with_shards(self, path: Path, payload: dict[str, Any]) -> tuple[Any, str | None]:
        """The payload with its sharded tensors read (DCP: a collective whose errors reach every rank)."""
        assert self.shards is not None
        try:  # each rank checks its share of the shard files against their checksums, before DCP reads them
            sums, problem = read_sums(path)
            # the files in the folder, each needing its checksum: never the paths the list names (a list that
            # lost an entry would let that shard load unchecked; one naming shards/../x would have it read)
            found = path / SHARDS
            names = sorted(f"{SHARDS}/{p.name}" for p in found.iterdir()) if found.is_dir() and sums else []
            problem = problem or next(
                filter(None, (mismatch(path, n, sums) for n in names[self.rank :: self.world_size])), None
            )
        except OSError as e:
            problem = f"its checksums: {e.strerror or e}"
        if not all_true(problem is None):
            return None, problem or "its shards, on another rank"
        try:
            return self.shards.load(path, payload), None
        except Exception as e:
            return None, f"its shards: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _free(directory: Path, name: str) -> Path:
    """``directory/name``, or ``name-2``, ``name-3``...: the first that does not exist (a step can
    be corrupted again after a rerun saved it anew)."""
    candidate, n = directory / name, 1
    while candidate.exists():
        n += 1
        candidate = directory / f"{name}-{n}"
    return candidate


def mark_name(rank: int) -> str:
    """The name of the file in which ``rank``'s writer leaves the checksums of its part of a save (several ranks)."""
    return f".written-rank-{rank}"


def mark_text(sums: dict[str, str], failed: str | None) -> str:
    """A rank's mark: ``{"sha256": its files' checksums}``, or ``{"failed": why}``."""
    return json.dumps({"sha256": sums} if failed is None else {"failed": failed})


def parse_mark(text: str | bytes) -> dict[str, str] | str | None:
    """A rank's mark as ``_mark`` wrote it: its files' checksums by name, why its writes failed (a str), or None:
    not one."""
    value = json.loads(text)
    if isinstance(value, dict) and isinstance(value.get("failed"), str):
        return str(value["failed"])
    sums = value.get("sha256") if isinstance(value, dict) else None
    if isinstance(sums, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in sums.items()):
        return sums
    return None

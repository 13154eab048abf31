"""Checkpoints for ct.run: atomic, per-rank random state, the latest valid one wins.

A checkpoint is a folder ``step-000001234/`` holding ``state.pt`` (written by rank
0: the TrainState and the loop's position) and ``rank-<rank>.pt`` (every rank's
random number generators and its own loop state, such as metrics not yet logged).
It is written under a hidden temporary name in the same folder, every file
fsynced, then renamed into place and the folder fsynced: a crash mid-save leaves
the previous checkpoint as the latest valid one. Files hold tensors and plain types
only and load with ``weights_only=True``: resuming never runs code from the folder.

One run at a time: every process that writes holds ``.lock-rank-<rank>`` in the folder
(``fcntl.flock``, released by the kernel when its holder ends, even by SIGKILL), so a
second run on the same folder is refused before it touches anything. Only folders named
exactly as ``save`` names them are checkpoints, ordered by their number; anything else
is left where it is, with a warning. Files that are not regular files are never opened.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from composetrain.checkpoint.checksums import CHECKSUMS, digest, mismatch, read_sums, write_sums
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
    shared_problem,
    stamp_local,
    stamp_shared,
    unplain,
)
from composetrain.checkpoint.shards import ShardFiles, split
from composetrain.core.util import RUN
from composetrain.launch.agree import all_true, from_rank0, gathered

__all__ = ["Checkpoints"]


def _write(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpoints:
    """The checkpoints of one run in ``directory``, written and read by all ranks together (for ``ct.run``,
    which its messages name).

    Every decision (the directory is writable, which checkpoint loads) is made once and
    shared, so that no rank raises while the others wait in a collective.

    Args:
        directory: where checkpoints live; created if missing, checked writable.
        rank, world_size: this process in the job.
        keep: how many of the newest checkpoints to keep.
        shards: where a sharded TrainState's tensors go (``ct.sharded``): each rank writes its own
            through torch.distributed.checkpoint, into ``shards/``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rank: int,
        world_size: int,
        keep: int,
        shards: ShardFiles | None = None,
    ) -> None:
        self.shards = shards
        self.dir = Path(directory).expanduser()
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self._lock: io.FileIO | None = None
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
        """Let the folder go (the kernel does it too when this process ends, however it ends)."""
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.close()  # closing the only descriptor releases the flock

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def save(self, step: int, payload: dict[str, Any], local: dict[str, Any], nonfinite: str | None = None) -> Path:
        """Write ``payload`` (rank 0's), and ``local`` with this rank's RNG states, as checkpoint
        ``step``, atomically; then drop all but the ``keep`` newest older ones. ``nonfinite``: the name of a
        parameter holding NaN or inf on this rank: then nothing is written or dropped, on any rank (a diverged
        model must never prune the finite checkpoints it could resume from)."""
        if not all_true(nonfinite is None):
            told = gathered(nonfinite)
            rank = next(r for r, name in enumerate(told) if name is not None)
            previous = next(iter(self._steps()), None) if self.rank == 0 else None
            previous = from_rank0(previous.name if previous is not None else None)
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
        final = self.dir / f"step-{step:09d}"
        tmp = self.dir / f".step-{step:09d}.tmp"
        taken = self.rank == 0 and os.path.lexists(final) and not is_checkpoint(final)
        if not all_true(not taken):  # before anything is written: the user's folder stays as it is
            what = (
                (
                    "it is a link"
                    if final.is_symlink()
                    else f"it holds no {STATE_FILE}"
                    if final.is_dir()
                    else "it is a file"
                )
                if self.rank == 0
                else "seen by rank 0"
            )
            raise FileExistsError(
                f"{RUN}: cannot save checkpoint step {step}: {final} exists and is not a checkpoint ({what}), "
                "so ct.run leaves it alone; move it out of checkpoint_dir and rerun"
            )

        def agreed(phase: Any) -> None:
            """``phase`` on this rank, then whether it went well everywhere (the collective that also
            orders the phases); a failure (a full disk) raises on every rank, nothing left behind."""
            failure: Exception | None = None
            try:
                phase()
            except Exception as e:  # torch.save reports a full disk as a RuntimeError caused by the OSError
                failure = e
            if not all_true(failure is None):
                if self.rank == 0:
                    shutil.rmtree(tmp, ignore_errors=True)  # nothing that looks like a checkpoint, the space back
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
                size = size_of(payload) + size_of(local) + size_of(tensors)  # only for the message
                raise self._save_failed(step, cause, size, rank) from failure

        def prepare() -> None:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()

        written: dict[str, str] = {}  # this rank's files, by their path in the folder: their checksums

        def write() -> None:
            _write(local, tmp / rank_file(self.rank))
            written[rank_file(self.rank)] = digest(tmp / rank_file(self.rank))
            if self.rank == 0:
                _write(stamp_shared(payload, self.world_size), tmp / STATE_FILE)
                written[STATE_FILE] = digest(tmp / STATE_FILE)

        def write_shards() -> None:  # every rank alike: the same state is sharded everywhere
            if tensors and self.shards is not None:
                self.shards.save(tensors, tmp)
                # DCP names each rank's files __<rank>_<n>.distcp; the coordinator (rank 0) writes .metadata
                mine = [
                    *(tmp / SHARDS).glob(f"__{self.rank}_*"),
                    *((tmp / SHARDS).glob(".metadata") if self.rank == 0 else []),
                ]
                written.update({f"{SHARDS}/{p.name}": digest(p) for p in mine if p.is_file()})

        def seal() -> None:  # rank 0 lists every rank's checksums, before the fsync and the rename
            if self.rank == 0:
                write_sums(tmp, {name: sum_ for part in everyone for name, sum_ in part.items()})

        def sync() -> None:
            if self.rank == 0:
                if tensors:
                    _fsync_dir(tmp / SHARDS)
                _fsync_dir(tmp)

        for phase in (prepare, write, write_shards):
            agreed(phase)
        everyone = gathered(written)  # every rank is here: each phase above ended in the same collective
        for phase in (seal, sync):
            agreed(phase)
        if self.rank == 0:
            old = self.dir / f".step-{step:09d}.old"
            if final.exists():  # saved at this step before (a skipped update): keep it until replaced
                os.replace(final, old)
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            shutil.rmtree(old, ignore_errors=True)
            older = [p for p in self._steps() if step_of(p.name) < step]  # type: ignore[operator]
            for stale in older[self.keep - 1 :]:
                shutil.rmtree(stale, ignore_errors=True)
        self._barrier()
        return final

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
        previous = next(iter(self._steps()), None)
        intact = f"the previous checkpoint {previous.name} is intact" if previous else "there is no previous checkpoint"
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
                f"{human(size)}; {cause}); {intact} and nothing of step {step} was left behind; free some space, "
                "lower keep_checkpoints, or point checkpoint_dir at a larger disk",
            )
        return OSError(
            failure.errno,
            f"{RUN}: checkpoint step {step} could not be written in {self.dir} ({cause}); {intact} and "
            f"nothing of step {step} was left behind",
        )

    def _steps(self) -> list[Path]:
        """This run's checkpoints, newest first: folders named as ``save`` names them, holding their state file."""
        found = [(step_of(p.name), p) for p in self.dir.iterdir()]
        ours = [(n, p) for n, p in found if n is not None and is_checkpoint(p)]
        return [p for _, p in sorted(ours, key=lambda np_: np_[0], reverse=True)]

    def latest(self) -> tuple[Path, dict[str, Any], dict[str, Any] | None] | None:
        """The newest checkpoint that every rank can load: (path, payload, this rank's part).

        This rank's part is None when the checkpoint was written by another number of processes (a run defined by
        its global batch: ``check_fits`` refuses any other): no rank's own file applies then, none is read, and
        ranks that wrote none (more of them now) or that are gone (fewer) make no difference.

        Every rank reads it (the folder must be shared by the nodes). Files are loaded with
        ``weights_only=True`` and checked against what ``ct.run`` writes (random states are
        tried on fresh generators), so that resuming never runs code and never fails half-way.
        One that does not pass is skipped with a warning and moved aside (``corrupt-step-...``),
        so that it never shadows the good ones again; when none is left and some were set aside (now or by an
        earlier run), every rank refuses rather than starting the run over.
        """
        if self.rank == 0:
            for line in foreign(self.dir):
                warnings.warn(f"{RUN}: {line}", stacklevel=2)
        for name in from_rank0([p.name for p in self._steps()] if self.rank == 0 else None):
            path = self.dir / name
            step = step_of(name)
            payload, problem = self._read(path, STATE_FILE, SHARED, functools.partial(shared_problem, step=step))
            local, read_all = None, False  # this rank's part, and whether every part it needs was read
            if all_true(payload is not None):
                assert payload is not None
                check_fits(payload, self.world_size, path)  # the same file on every rank: all raise alike
                if payload["world_size"] == self.world_size:
                    local, problem = self._read(path, rank_file(self.rank), LOCAL, local_problem)
                read_all = payload["world_size"] != self.world_size or local is not None
            if all_true(read_all) and self.shards is not None:
                assert payload is not None
                payload, problem = self._with_shards(path, payload)
                read_all = payload is not None
            if all_true(read_all):
                assert payload is not None
                return path, payload, local
            if self.rank == 0:
                aside = _free(self.dir, f"corrupt-{name}")
                warnings.warn(
                    f"{RUN}: skipping unreadable checkpoint {path}: {problem or 'on another rank'}; "
                    f"moved to {aside.name}",
                    stacklevel=2,
                )
                os.replace(path, aside)
            self._barrier()
        aside = from_rank0(sorted(p.name for p in self.dir.glob("corrupt-step-*")) if self.rank == 0 else None)
        if aside:  # every checkpoint of this run is corrupt: starting afresh would lose its training unnoticed
            raise RuntimeError(
                f"{RUN}: no checkpoint in {self.dir} could be read (set aside: {', '.join(aside)}), so this run "
                "would start over from its first update; restore a checkpoint into it, or move the "
                "corrupt-step-* folders out of checkpoint_dir to start afresh"
            )
        return None

    def _read(self, path: Path, name: str, schema: dict[str, Any], deep: Any) -> tuple[Any, str | None]:
        """``format.read`` of ``path/name``, its bytes first checked against the checksum written with it (a
        mismatch: corrupt); a file this user may not read is no corrupt file: every rank
        refuses the checkpoint, which is left as it is (setting it aside would start the run over)."""
        denied: OSError | None = None
        try:
            sums, problem = read_sums(path)
            problem = problem or mismatch(path, name, sums)
            value, problem = (None, problem) if problem else read(path / name, schema, deep)
            if value is not None and name == STATE_FILE and sums is None and value["format"] >= 3:
                value, problem = None, f"it lacks {CHECKSUMS}, which every checkpoint of format 3 holds"
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

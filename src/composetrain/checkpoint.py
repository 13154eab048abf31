"""Checkpoints for ct.run: atomic, per-rank random state, the latest valid one wins.

A checkpoint is a folder ``step-000001234/`` holding ``state.pt`` (written by rank
0: the TrainState and the loop's position) and ``rank-<rank>.pt`` (every rank's
random number generators and its own loop state, such as metrics not yet logged).
It is written under a hidden temporary name in the same folder, every file
fsynced, then renamed into place and the folder fsynced: a crash mid-save leaves
the previous checkpoint as the latest valid one.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Checkpoints", "capture_rng", "restore_rng"]

FORMAT = 1


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states of this process."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        states["numpy"] = np.random.get_state()
    except ImportError:  # NumPy is optional
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


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
    """The checkpoints of one run in ``directory``, written and read by all ranks together.

    Every decision (the directory is writable, which checkpoint loads) is made once and
    shared, so that no rank raises while the others wait in a collective.

    Args:
        directory: where checkpoints live; created if missing, checked writable.
        rank, world_size: this process in the job.
        keep: how many of the newest checkpoints to keep.
        who: the name in messages.
    """

    def __init__(self, directory: str | os.PathLike[str], rank: int, world_size: int, keep: int, who: str) -> None:
        self.dir = Path(directory)
        self.rank, self.world_size, self.keep, self.who = rank, world_size, keep, who
        problem = None
        if rank == 0:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                probe = self.dir / f".write-test-{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
                for stale in self.dir.glob(".step-*"):  # a save that a crash interrupted
                    shutil.rmtree(stale, ignore_errors=True)
            except OSError as e:
                problem = e.strerror or str(e)
        problem = self._shared(problem)
        if problem is not None:
            raise PermissionError(
                f"{who}: checkpoint_dir {str(self.dir)!r} is not writable ({problem}); choose a folder you can write to"
            )

    def _shared(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if self.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def _all(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank."""
        if self.world_size == 1:
            return ok
        flag = torch.tensor([int(ok)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def save(self, step: int, payload: dict[str, Any], local: dict[str, Any]) -> Path:
        """Write ``payload`` (rank 0's), and ``local`` with this rank's RNG states, as checkpoint
        ``step``, atomically; then drop all but the ``keep`` newest older ones."""
        final = self.dir / f"step-{step:09d}"
        tmp = self.dir / f".step-{step:09d}.tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self._barrier()
        _write({**local, "rng": capture_rng()}, tmp / f"rank-{self.rank}.pt")
        if self.rank == 0:
            _write({**payload, "format": FORMAT, "world_size": self.world_size}, tmp / "state.pt")
        self._barrier()
        if self.rank == 0:
            _fsync_dir(tmp)
            old = self.dir / f".step-{step:09d}.old"
            if final.exists():  # saved at this step before (a skipped update): keep it until replaced
                os.replace(final, old)
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            shutil.rmtree(old, ignore_errors=True)
            older = [p for p in self._steps() if p.name < final.name]
            for stale in older[self.keep - 1 :]:
                shutil.rmtree(stale, ignore_errors=True)
        self._barrier()
        return final

    def _steps(self) -> list[Path]:
        return sorted((p for p in self.dir.glob("step-*") if p.is_dir()), reverse=True)

    def latest(self) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        """The newest checkpoint that every rank can load: (path, payload, this rank's part).

        Every rank reads it (the folder must be shared by the nodes). One that does not
        load is skipped with a warning and moved aside (``corrupt-step-...``), so that
        it never shadows the good ones again.
        """
        for name in self._shared([p.name for p in self._steps()] if self.rank == 0 else None):
            path = self.dir / name
            payload: Any
            payload, problem = _load(path / "state.pt")
            if payload is not None and payload.get("format") != FORMAT:
                payload, problem = None, f"format {payload.get('format')!r}, expected {FORMAT}"
            local = None
            if self._all(payload is not None):
                assert payload is not None
                if payload["world_size"] != self.world_size:  # read from the same file on every rank
                    raise ValueError(
                        f"{self.who}: checkpoint {path} was saved by {payload['world_size']} process(es), this "
                        f"run has {self.world_size}; resume with the same number of processes (the data order "
                        "and random states are per rank)"
                    )
                local, problem = _load(path / f"rank-{self.rank}.pt")
            if self._all(local is not None):
                assert payload is not None and local is not None
                return path, payload, local
            if self.rank == 0:
                warnings.warn(
                    f"{self.who}: skipping unreadable checkpoint {path}: {problem or 'on another rank'}", stacklevel=2
                )
                os.replace(path, self.dir / f"corrupt-{name}")
            self._barrier()
        return None


def _load(path: Path) -> tuple[Any, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=False), None
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"

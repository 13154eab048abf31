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
    """The checkpoints of one run in ``directory``, written by all ranks together.

    Args:
        directory: where checkpoints live; created if missing, checked writable.
        rank, world_size: this process in the job.
        keep: how many of the newest checkpoints to keep.
        who: the name in messages.
    """

    def __init__(self, directory: str | os.PathLike[str], rank: int, world_size: int, keep: int, who: str) -> None:
        self.dir = Path(directory)
        self.rank, self.world_size, self.keep, self.who = rank, world_size, keep, who
        if rank == 0:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                probe = self.dir / f".write-test-{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as e:
                raise PermissionError(
                    f"{who}: checkpoint_dir {str(self.dir)!r} is not writable ({e.strerror or e}); choose a "
                    "folder you can write to"
                ) from e
            for stale in self.dir.glob(".step-*.tmp"):  # a save that a crash interrupted
                shutil.rmtree(stale, ignore_errors=True)
        self._barrier()

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def save(self, step: int, payload: dict[str, Any], local: dict[str, Any]) -> Path:
        """Write ``payload`` (rank 0's), and ``local`` with this rank's RNG states, as checkpoint
        ``step``, atomically."""
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
            if final.exists():  # saved at this step before (e.g. the end after an epoch boundary)
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            for old in self._steps()[self.keep :]:
                shutil.rmtree(old, ignore_errors=True)
        self._barrier()
        return final

    def _steps(self) -> list[Path]:
        return sorted((p for p in self.dir.glob("step-*") if p.is_dir()), reverse=True)

    def latest(self) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        """The newest checkpoint that loads: (path, payload, this rank's local part); None if none.

        A checkpoint that does not load is skipped with a warning. Every rank picks
        the same one (the newest that rank 0 can read).
        """
        chosen: Path | None = None
        if self.rank == 0:
            for path in self._steps():
                try:
                    payload = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
                    if payload.get("format") != FORMAT:
                        raise ValueError(f"format {payload.get('format')!r}, expected {FORMAT}")
                    missing = [r for r in range(self.world_size) if not (path / f"rank-{r}.pt").exists()]
                    if missing:
                        raise ValueError(f"nothing saved for ranks {missing}")
                    chosen = path
                    break
                except Exception as e:
                    warnings.warn(f"{self.who}: skipping unreadable checkpoint {path}: {e}", stacklevel=2)
        if self.world_size > 1:
            shared = [str(chosen) if chosen is not None else None]
            dist.broadcast_object_list(shared, src=0)
            chosen = Path(shared[0]) if shared[0] is not None else None
        if chosen is None:
            return None
        payload = torch.load(chosen / "state.pt", map_location="cpu", weights_only=False)
        if payload["world_size"] != self.world_size:
            raise ValueError(
                f"{self.who}: checkpoint {chosen} was saved by {payload['world_size']} process(es), this run has "
                f"{self.world_size}; resume with the same number of processes (the data order and random "
                "states are per rank)"
            )
        local = torch.load(chosen / f"rank-{self.rank}.pt", weights_only=False)
        return chosen, payload, local

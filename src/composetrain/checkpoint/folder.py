"""The checkpoint folder's files: which names are checkpoints, what is left alone, the lock that keeps
one run per folder, and the checks that keep a read from blocking (internal to ``checkpoint/``).

A checkpoint is a folder named as ``Checkpoints.save`` names it, ``step-`` and the step in at least
9 ASCII digits (``step-000001234``), holding a ``state.pt``; checkpoints are ordered by that number.
Anything else is the user's: never renamed, pruned or deleted.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import re
import socket
import stat
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "LEFTOVER",
    "SHARDS",
    "STATE_FILE",
    "foreign",
    "human",
    "is_checkpoint",
    "not_regular",
    "os_error",
    "rank_file",
    "size_of",
    "step_of",
    "take_lock",
]

STATE_FILE = "state.pt"  # rank 0's: the TrainState and the loop's position
SHARDS = "shards"  # the sharded tensors' folder, written by DCP


def rank_file(rank: int) -> str:
    """The name of ``rank``'s own file in a checkpoint folder."""
    return f"rank-{rank}.pt"


_NAME = re.compile(r"step-([0-9]{9,})")  # as save() names it: ASCII digits, at least 9, no spare zero
LEFTOVER = re.compile(r"\.step-[0-9]{9,}\.(tmp|old)")  # what an interrupted save() leaves


def step_of(name: str) -> int | None:
    """The step of a checkpoint folder's ``name``, or None if ``save`` would never name a folder so."""
    match = _NAME.fullmatch(name)
    return int(match[1]) if match and name == f"step-{int(match[1]):09d}" else None


def size_of(value: Any) -> int:
    """Bytes of tensor data in ``value`` (what a save writes, give or take the plain values)."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, dict):
        return sum(size_of(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(size_of(v) for v in value)
    return 0


def human(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def take_lock(directory: Path, rank: int) -> tuple[io.FileIO | None, str | None, bool]:
    """Hold ``rank``'s lock file in ``directory`` (``fcntl.flock``: the kernel releases it when its holder
    ends, however it ends): (the open lock, None, False); (None, who holds it: pid and host, as the holder
    wrote them, True); or (None, why the file cannot serve as a lock, False). Ranks of one run lock files
    of their own, so they never exclude each other. A link is never followed: the pid written into the
    lock would overwrite whatever file it points to."""
    path = directory / f".lock-rank-{rank}"
    if os.path.islink(path):
        return None, f"its lock file {path} is a symbolic link; remove it", False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        return None, f"its lock file {path} cannot be opened ({e.strerror or e}); remove it", False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None, f"its lock file {path} is not a regular file; remove it", False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        who = os.pread(fd, 200, 0).decode(errors="replace").strip()
        os.close(fd)
        return None, f"{who or 'a process'} holds {path}", True
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return os.fdopen(fd, "r+b", buffering=0), None, False  # a file object: closed (and released) if dropped


def foreign(directory: Path) -> list[str]:
    """What in the folder looks like a checkpoint, is none, and is left alone: one line each."""
    lines = []
    for p in sorted(directory.iterdir()):
        if step_of(p.name) is not None and not is_checkpoint(p):
            kind = f"it holds no {STATE_FILE}" if p.is_dir() and not p.is_symlink() else "it is not a folder"
            lines.append(f"leaving {p} alone: {kind}, so it is no checkpoint (ct.run writes one into each)")
        elif p.name.startswith("step-") and step_of(p.name) is None:
            lines.append(
                f"ignoring {p}: not a checkpoint name (ct.run names them step-<step as 9 or more ASCII digits>, "
                "e.g. step-000000005); rename it so to resume from it"
            )
    return lines


def os_error(error: BaseException | None) -> OSError | None:
    """The OSError that ``error`` is or was caused by (torch wraps a failed write in a RuntimeError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a folder (not a link) holding a ``state.pt`` entry: one ct.run wrote."""
    if not path.is_dir() or path.is_symlink():
        return False
    try:
        os.lstat(path / STATE_FILE)
    except PermissionError:  # a folder this user cannot look into: reading it says why, it is never skipped
        return True
    except OSError:
        return False
    return True


def not_regular(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (missing, or a FIFO, socket, device, folder), or None;
    PermissionError if this user may not look."""
    try:
        mode = os.stat(path).st_mode  # a link is followed: what it points to must be a file
    except PermissionError:
        raise  # not the file's fault: the caller says so, and sets nothing aside
    except OSError as e:
        return f"{path.name}: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return None
    kinds = [
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ]
    kind = next((name for test, name in kinds if test(mode)), "not a file")
    return f"{path.name} is {kind}, not a regular file, so it was not opened"

"""The checksums of a checkpoint's files (internal to ``checkpoint/``): written with them, verified before loading.

``torch.load`` does not notice a flipped byte inside a tensor's data: the checkpoint loads, a value off. So every
file of a checkpoint (``state.pt``, each ``rank-<rank>.pt``, the DCP shard files) has its SHA-256 recorded in
``checksums.json`` when it is written (by the rank that wrote it; rank 0 writes the list, fsynced, before the
folder is renamed into place), and a file whose bytes do not match is a corrupt checkpoint, set aside as any other.
A checkpoint of format 2 (before checksums) has no list and loads unverified; one of format 3 without it is corrupt.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from composetrain.checkpoint.folder import not_regular

__all__ = [
    "CHECKSUMS",
    "Hashing",
    "differs",
    "digest",
    "mismatch",
    "parse_sums",
    "read_sums",
    "sums_text",
    "write_sums",
]

CHECKSUMS = "checksums.json"  # {"sha256": {path inside the checkpoint folder: hex digest}}


def digest(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, read in pieces (a file of gigabytes is never held whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 22):
            h.update(piece)
    return h.hexdigest()


class Hashing:
    """A file written through this hashes what it writes: a file's checksum taken as it is written, never by reading
    it back (``torch.save`` writes and flushes, nothing else)."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha256 = f, hashlib.sha256()
        if hasattr(f, "name"):
            self.name = f.name  # a file object's: what it writes to

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return int(self.f.write(data))

    def flush(self) -> None:
        self.f.flush()

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


def sums_text(sums: dict[str, str]) -> str:
    """``checksums.json``'s text: ``sums`` by file name, sorted."""
    return json.dumps({"sha256": dict(sorted(sums.items()))}, indent=0)


def write_sums(folder: Path, sums: dict[str, str]) -> None:
    with open(folder / CHECKSUMS, "w") as f:
        f.write(sums_text(sums))
        f.flush()
        os.fsync(f.fileno())


def read_sums(folder: Path) -> tuple[dict[str, str] | None, str | None]:
    """The checksums recorded in ``folder`` (None: it has none, as a checkpoint of format 2), or why they are
    unreadable; PermissionError as ``not_regular`` raises it."""
    path = folder / CHECKSUMS
    if not os.path.lexists(path):
        return None, None
    problem = not_regular(path)
    if problem:
        return None, problem
    try:
        text = path.read_text()
    except (OSError, ValueError) as e:  # ValueError: not UTF-8
        return None, f"its {CHECKSUMS} is unreadable ({type(e).__name__})"
    return parse_sums(text)


def parse_sums(text: str | bytes) -> tuple[dict[str, str] | None, str | None]:
    """The checksums ``checksums.json``'s ``text`` records, or why they are unreadable."""
    try:
        sums = json.loads(text)["sha256"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: [[[[...
        return None, f"its {CHECKSUMS} is unreadable ({type(e).__name__})"
    if not isinstance(sums, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sums.items()):
        return None, f"its {CHECKSUMS} is unreadable (not a dict of file names to digests)"
    return sums, None


def differs(name: str, got: str, want: str | None) -> str | None:
    """Why a file of digest ``got`` does not match ``want``, its recorded checksum (None: none recorded)."""
    if want is None:
        return f"{name} has no checksum in its {CHECKSUMS}"
    if got != want:
        return (
            f"{name} does not match the checksum written with it (SHA-256 {got[:16]}..., recorded {want[:16]}...): "
            "it changed on disk after it was written"
        )
    return None


def mismatch(folder: Path, name: str, sums: dict[str, str] | None) -> str | None:
    """Why ``folder/name`` does not match its recorded checksum (or has none recorded), or None; None too when
    ``sums`` is None (a checkpoint written before checksums), or the file cannot be read (its reader says why)."""
    if sums is None or not_regular(folder / name):
        return None
    if sums.get(name) is None:
        return differs(name, "", None)
    return differs(name, digest(folder / name), sums[name])

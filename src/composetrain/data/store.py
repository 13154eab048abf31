"""Where ``ct.cache`` may publish a store, and which store a dataset was opened on.

A path is a store only when its manifest is a cache manifest: anything else there (a dataset folder with a
``manifest.json`` of its own, a file, a folder of other things) is never renamed, replaced or deleted. A store
is published by renaming a folder into place, which a mount point cannot take: refused before an item is read.
A ``CachedDataset`` records its files' identity when opened; each process checks it before mapping them, so a
store rebuilt or removed meanwhile is refused by name rather than read in part or as other data.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from composetrain.core.util import CACHE
from composetrain.data.layout import DEPTH
from composetrain.data.store_files import MANIFEST, NotAStore, read_json, read_manifest

__all__ = [
    "FULL",
    "Stamp",
    "check_lock_file",
    "check_lock_owner",
    "check_renamable",
    "check_replaceable",
    "check_unchanged",
    "disk_error",
    "foreign",
    "leftovers",
    "publish_error",
    "remove_store",
    "stamp",
]

Stamp = tuple[int, int, int, int] | None
FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # a disk out of space or inodes, a file past its size limit
_OWN = re.compile(r"f[0-9]+[os]?\.npy")  # the arrays a writer makes (writer._Column): f0.npy, f3o.npy, f3s.npy
_HOLDER = re.compile(rb"process [0-9]+ on [^\n]{0,255}")  # what a lock's holder writes in it (cache._locked)
_TEMPORARY = re.compile(r"(old-)?[0-9a-f]{12}")  # what follows ".NAME.tmp-" in a writer's folders (see cache._write)


def foreign(folder: Path, temporary: bool = False) -> list[str]:
    """The names in ``folder`` that are not a store's own files (``_own``; in a writer's ``temporary`` folder, whose
    manifest may not be written yet, also the ``f<n>[os].npy`` arrays a writer makes), regular files: a user's files, a
    store nested inside, links. ``ct.cache`` never removes them."""
    own = _own(folder)
    names = []
    for name in sorted(os.listdir(folder)):
        try:
            plain = stat.S_ISREG(os.lstat(folder / name).st_mode)
        except FileNotFoundError:
            continue
        if not (plain and (name in own or (temporary and _OWN.fullmatch(name)))):
            names.append(name)
    return names


def _own(folder: Path) -> set[str]:
    """A store's own files: ``manifest.json`` and the arrays the writer gives a store of its manifest's fields
    (``f<n>.npy`` for the n-th, and ``f<n>o.npy``, ``f<n>s.npy`` for a ragged one): for a manifest it wrote, exactly
    the arrays its fields name, never a user's ``f7.npy`` beside them. Read leniently (a manifest damaged elsewhere
    still says which they are); one whose item structure cannot be followed owns no array."""
    try:
        raw = read_json(folder)
    except (OSError, ValueError):
        return {MANIFEST}
    ragged = _ragged(raw.get("item") if isinstance(raw, dict) else None)
    arrays = [[f"f{n}.npy", *([f"f{n}o.npy", f"f{n}s.npy"] if r else [])] for n, r in enumerate(ragged or [])]
    return {MANIFEST, *(name for names in arrays for name in names)}


def _ragged(node: Any, depth: int = 0) -> list[bool] | None:
    """Whether each field of a manifest's item structure (its JSON, in the writer's order) is ragged; None where the
    structure cannot be followed."""
    if depth > DEPTH or not isinstance(node, dict) or len(node) != 1:
        return None
    ((tag, body),) = node.items()
    if tag == "field":
        return [body.get("shape") is None] if isinstance(body, dict) else None
    if tag == "dict" and isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body):
        body = [value for _, value in body]
    elif tag not in ("tuple", "list") or not isinstance(body, list):
        return None
    found: list[bool] = []
    for child in body:
        inner = _ragged(child, depth + 1)
        if inner is None:
            return None
        found += inner
    return found


def remove_store(folder: Path, temporary: bool = False) -> None:
    """Remove a store's (or a writer's ``temporary``) folder: its own files, then the folder if nothing else is left in
    it (never ``shutil.rmtree``: a file someone put there meanwhile stays, with the folder)."""
    try:
        others = set(foreign(folder, temporary))
    except OSError:
        return
    for name in os.listdir(folder):
        if name not in others:
            with contextlib.suppress(OSError):
                os.unlink(folder / name)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def check_replaceable(path: Path, replacing: bool = True) -> None:
    """Refuse unless ``path`` is absent, an empty folder or a cache store: what ``ct.cache`` may replace; and,
    ``replacing`` it, a store holding anything but its own files."""
    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise ValueError(f"{CACHE}: {path} is a file, not a cache store: choose another path")
    manifest = path / MANIFEST
    if not os.path.lexists(manifest):
        if any(path.iterdir()):
            raise ValueError(
                f"{CACHE}: {path} is a folder that is not a cache store (no {MANIFEST}): choose another path"
            )
        return
    try:
        read_manifest(path)
    except NotAStore as e:  # a dataset's own manifest (WebDataset shards, an export): never ct.cache's to delete
        raise NotAStore(
            f"{CACHE}: {path} is not a cache store ({e}); ct.cache never replaces or removes it, "
            "with or without rebuild=True: choose another path"
        ) from None
    except (OSError, ValueError):
        pass  # a cache manifest of another version, or a store damaged otherwise: a store, rebuilt on request
    others = foreign(path) if replacing else []
    if others:  # a user's files put in the store, or a cache manifest copied into a folder of other things
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ValueError(
            f"{CACHE}: {path} holds files that are not the store's ({shown}); ct.cache never removes "
            "them, so it does not write the store again there: move them out, or choose another "
            "path"
        )


def check_renamable(path: Path) -> None:
    """Refuse, before any item is read, a ``path`` that a folder cannot be renamed onto (a mount point)."""
    if os.path.lexists(path) and os.path.ismount(path):
        raise ValueError(
            f"{CACHE}: {path} is a mount point: a store is published by renaming a folder into place, "
            f"which a mount point cannot take; give a folder inside it (e.g. "
            f"{path / 'store'})"
        )
    if not path.is_dir() or os.path.lexists(path / MANIFEST):
        return
    # an empty folder, as a bind mount or a container's volume is (os.path.ismount does not see those): try it
    aside = path.parent / f".{path.name}.tmp-probe"
    try:
        os.rename(path, aside)
    except OSError as e:
        raise OSError(
            e.errno,
            f"{CACHE}: {path} cannot be replaced by a renamed folder ({os.strerror(e.errno or 0)}),"
            f" as a store is published; give a folder inside it (e.g. {path / 'store'})",
        ) from None
    os.rename(aside, path)


def publish_error(path: Path, e: OSError) -> OSError:
    """The error for a rename into ``path`` refused after writing (a store already at a mount point)."""
    if e.errno not in (errno.EBUSY, errno.EXDEV, errno.EPERM, errno.EACCES):
        return e
    why = os.strerror(e.errno or 0)
    return OSError(
        e.errno,
        f"{CACHE}: {path} cannot be replaced by a renamed folder ({why}), as a store is published; "
        f"nothing was kept: give a folder inside it (e.g. {path / 'store'})",
    )


def disk_error(path: Path, e: OSError) -> OSError | None:
    """The error for a write for the store at ``path`` (its lock file, folders, arrays) that the disk refused: full
    (space or inodes), read-only or not writable, said with the fix; None for another error."""
    if e.errno in FULL:
        fix = "free space, or give a path on a larger disk"
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = "give a path in a folder this process can write, on a disk mounted read-write"
    else:
        return None
    why = os.strerror(e.errno or 0)
    return OSError(e.errno, f"{CACHE}: writing {path} failed: {why}; nothing was kept: {fix}")


def leftovers(path: Path) -> list[Path]:
    """The folders a writer of ``path`` left (``.NAME.tmp-<hex>``, ``.NAME.tmp-old-<hex>``): matched by name, never
    by a glob pattern, which the store's name (``s[1]``) would be read as."""
    prefix = f".{path.name}.tmp-"
    names = os.listdir(path.parent)
    return [path.parent / n for n in names if n.startswith(prefix) and _TEMPORARY.fullmatch(n[len(prefix) :])]


def check_lock_file(lock: Path, mode: int | None = None) -> None:
    """Refuse a lock file that is not a plain file (``mode``: its fstat's, once opened; else its lstat's)."""
    if mode is None:
        try:
            mode = os.lstat(lock).st_mode
        except FileNotFoundError:
            return
    if stat.S_ISREG(mode):
        return
    what = "symbolic link" if stat.S_ISLNK(mode) else "folder" if stat.S_ISDIR(mode) else "special file"
    raise ValueError(
        f"{CACHE}: the lock file {lock} is a {what}, not a file: remove it (ct.cache creates it), or "
        "choose another path"
    )


def check_lock_owner(lock: Path, fd: int) -> bool:
    """Refuse an existing lock file (open at ``fd``) that ct.cache would not have made: one holding other text, or
    with another name (a hard link: writing it changes the file at that name too); whether it holds a holder's line
    (then it may be written again). An empty one is used as the lock, never written into: another process may have
    just made it, or it is a user's."""
    info, text = os.fstat(fd), os.pread(fd, 512, 0)
    if info.st_nlink == 1 and (not text or _HOLDER.fullmatch(text)):
        return bool(text)
    why = f"it has {info.st_nlink} names (hard links)" if info.st_nlink > 1 else "it holds text ct.cache never writes"
    raise ValueError(
        f"{CACHE}: the lock file {lock} is not one ct.cache made ({why}): ct.cache writes who holds the lock into "
        "it, so it never uses a file of someone else's; move it away (ct.cache creates the lock file), or choose "
        "another path"
    )


def stamp(path: str | Path) -> Stamp:
    """What identifies a file cheaply: device, inode, size and modification time (None: gone)."""
    try:
        s = os.lstat(path)
    except FileNotFoundError:
        return None
    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)


def check_unchanged(store: Path, stamps: Mapping[str, Stamp]) -> None:
    """Raise unless every file of the store still has the stamp it had when it was opened."""
    for path, then in stamps.items():
        now = stamp(path)
        if now != then:
            what = "it is gone" if now is None else "another file is at its path now"
            raise RuntimeError(
                f"{CACHE}: the store at {store} changed since this CachedDataset was opened ({path}: {what}): it was "
                "rebuilt or removed; call ct.cache again to open the store as it is now"
            )

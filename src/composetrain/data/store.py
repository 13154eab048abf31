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

from composetrain.core.util import CACHE
from composetrain.data.store_files import MANIFEST, NotAStore, read_manifest

__all__ = [
    "Stamp",
    "check_lock_file",
    "check_renamable",
    "check_replaceable",
    "check_unchanged",
    "foreign",
    "leftovers",
    "publish_error",
    "remove_store",
    "stamp",
]

Stamp = tuple[int, int, int, int] | None
_OWN = re.compile(r"f[0-9]+[os]?\.npy")  # the arrays a writer makes (writer._Column): f0.npy, f3o.npy, f3s.npy
_TEMPORARY = re.compile(r"(old-)?[0-9a-f]{12}")  # what follows ".NAME.tmp-" in a writer's folders (see cache._write)


def foreign(folder: Path) -> list[str]:
    """The names in ``folder`` that are not a store's own files (``manifest.json`` and the ``f<n>[os].npy`` arrays
    a writer makes, regular files): a user's files, a store nested inside, links. ``ct.cache`` never removes them."""
    names = []
    for name in sorted(os.listdir(folder)):
        try:
            plain = stat.S_ISREG(os.lstat(folder / name).st_mode)
        except FileNotFoundError:
            continue
        if not (plain and (name == MANIFEST or _OWN.fullmatch(name))):
            names.append(name)
    return names


def remove_store(folder: Path) -> None:
    """Remove a store's (or a writer's temporary) folder: its own files, then the folder if nothing else is left in
    it (never ``shutil.rmtree``: a file someone put there meanwhile stays, with the folder)."""
    try:
        others = set(foreign(folder))
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

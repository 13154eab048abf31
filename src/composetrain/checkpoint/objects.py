"""Checkpoints in object storage (internal to ``checkpoint/``): ``checkpoint_dir`` given as an fsspec URL
(``s3://bucket/runs/a``, ``memory://runs/a``, any filesystem fsspec knows). ``file://`` is a local folder, saved
as one (``Checkpoints``: a rename publishes). Needs fsspec, and its filesystem's package (s3fs for S3):
``pip install 'composetrain[s3]'``; credentials and the endpoint come as that package reads them (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...).

Objects have no atomic rename, so a checkpoint ``step-000001234/`` is written object by object where it stays, and
is published by its marker, ``checksums.json`` (every file's SHA-256, computed while it was uploaded), written last:
a checkpoint without its marker is absent (never listed, loaded, or counted by retention). An upload cut short (a
killed process, a lost connection) leaves objects without a marker; the next run removes them (only names ct.run
writes: anything else under a ``step-N/`` prefix is refused as the user's), as does the next save at that step.
A step saved again once published (an update skipped after a save) is written beside it first, complete with its
marker under ``.step-N.tmp/``, then put in place: the old marker removed, then its objects, the new ones copied,
the new marker written; the next run finishes a replacement cut short. Retention removes a checkpoint's marker
first, then its objects, and never the newest published checkpoint (only older ones).

Not done on objects: a lock (two runs on one prefix are not detected), the compile caches (kept in torch's own
folder), a default metrics file (give ``log_file``), sharded tensors (DCP): a state holding DTensors is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import urllib.parse
import urllib.request
import warnings
from typing import IO, Any, cast

import torch

from composetrain.checkpoint.background import io_step
from composetrain.checkpoint.checksums import CHECKSUMS, Hashing, differs, parse_sums, sums_text
from composetrain.checkpoint.files import Checkpoints, Flush, mark_name, mark_text, parse_mark
from composetrain.checkpoint.folder import SHARDS, STATE_FILE, step_of
from composetrain.checkpoint.format import MARK, read
from composetrain.core.util import RUN
from composetrain.launch.agree import all_true, from_rank0

__all__ = ["ObjectCheckpoints", "Place", "StorageError", "is_remote", "local_path", "open_checkpoints", "read_remote"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_OURS = re.compile(
    rf"({re.escape(STATE_FILE)}|rank-[0-9]+\.pt|{re.escape(CHECKSUMS)}|{SHARDS}/.+|\.written-rank-[0-9]+)"
)
_TMP = re.compile(r"\.(step-[0-9]{9,})\.tmp")
_UNREACHABLE = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientOSError",
}
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "NoAuthTokenError"}


def is_remote(directory: Any) -> bool:
    """Whether ``checkpoint_dir`` names object storage: a URL (``s3://...``) other than ``file://``."""
    return isinstance(directory, str) and _URL.match(directory) is not None and not directory.startswith("file://")


def local_path(directory: Any) -> Any:
    """A ``file://`` URL as the local path it names; anything else as given."""
    if isinstance(directory, str) and directory.startswith("file://"):
        return urllib.request.url2pathname(urllib.parse.urlparse(directory).path)
    return directory


def open_checkpoints(directory: Any, rank: int, world_size: int, keep: int, **options: Any) -> Checkpoints:
    """The checkpoints of ``checkpoint_dir``: in object storage for a URL, else in a local folder."""
    if is_remote(directory):
        return ObjectCheckpoints(directory, rank, world_size, keep, **options)
    return Checkpoints(local_path(directory), rank, world_size, keep, **options)


class StorageError(OSError):
    """An object store's failure, said in words (``described``); the store's own exception is its cause."""


def described(e: BaseException) -> str:
    """What an object store's error means, with the fix for the usual ones."""
    name, text = type(e).__name__, (str(e).strip().splitlines() or [""])[0]
    said = f"{name}: {text}" if text else name
    if name in _NO_CREDENTIALS:
        return (
            f"no credentials ({said}): give them as the storage's package reads them (for S3: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a role of the machine)"
        )
    if isinstance(e, PermissionError):
        return f"access denied ({said}): these credentials may not do this there (a read-only bucket or policy)"
    if isinstance(e, FileNotFoundError):
        return f"not found ({said}): does the bucket exist? create it, or correct the name"
    if name in _UNREACHABLE or isinstance(e, (ConnectionError, TimeoutError)):
        return f"the storage cannot be reached ({said}): check its endpoint (for S3: AWS_ENDPOINT_URL) and the network"
    return said


def _kind(e: BaseException) -> type[OSError]:
    """The OSError a refusal raises for ``e``: who reads the error type learns the same as from its words."""
    if type(e).__name__ in _NO_CREDENTIALS or isinstance(e, PermissionError):
        return PermissionError
    if isinstance(e, FileNotFoundError):
        return FileNotFoundError
    if type(e).__name__ in _UNREACHABLE or isinstance(e, (ConnectionError, TimeoutError)):
        return ConnectionError
    return StorageError


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path in it (no trailing slash), or an error saying what to install."""
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(
            f"{RUN}: checkpoint_dir {url!r} is object storage, which needs fsspec and the package of its filesystem: "
            "pip install 'composetrain[s3]' (fsspec and s3fs)"
        ) from e
    try:
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True)  # the environment as it is now
    except ImportError as e:  # the filesystem's own package (s3fs, gcsfs, ...)
        raise ImportError(f"{RUN}: checkpoint_dir {url!r} needs a package fsspec names: {e}") from e
    except ValueError as e:  # a protocol fsspec does not know
        raise ValueError(f"{RUN}: checkpoint_dir {url!r} is no storage fsspec knows ({e})") from e
    return fs, str(path).rstrip("/")


@dataclasses.dataclass(frozen=True)
class Place:
    """A path in an object store, with the path operations ``Checkpoints`` uses (``/``, ``name``); says its URL."""

    fs: Any = dataclasses.field(compare=False, repr=False)
    path: str
    url: str

    def __truediv__(self, name: str) -> Place:
        return Place(self.fs, f"{self.path}/{name}", f"{self.url}/{name}")

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return self.url


class ObjectCheckpoints(Checkpoints):
    """``Checkpoints`` in object storage: the same saves, loads and errors, published by a marker written last."""

    local = False
    LEFT = "nothing of step {step} was published (what was uploaded of it has no marker: it is absent)"

    def _locate(self, directory: Any) -> Place:
        fs, path = filesystem(directory)
        return Place(fs, path, directory.rstrip("/"))

    @property
    def fs(self) -> Any:
        return self.dir.fs

    def _call(self, what: str, place: Any, fn: Any, *args: Any) -> Any:
        """``fn(*args)``: a store operation, its failure a ``StorageError`` saying ``what`` failed where, and why."""
        try:
            return fn(*args)
        except Exception as e:
            raise StorageError(f"the {what} {place} failed: {described(e)}") from e

    # -- what is where ---------------------------------------------------------------------------------------------
    def _children(self) -> list[str]:
        """The names directly under the checkpoint prefix."""
        self.fs.invalidate_cache()
        try:
            found = self._call("listing of", self.dir, self.fs.ls, self.dir.path, False)
        except StorageError as e:
            if isinstance(e.__cause__, FileNotFoundError):
                return []  # nothing there yet (an empty prefix is no object)
            raise
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in found]

    def _objects(self, place: Place) -> list[str]:
        """The objects under ``place``, relative to it."""
        self.fs.invalidate_cache()
        found = self._call("listing of", place, self.fs.find, place.path)
        return sorted(str(p)[len(place.path) + 1 :] for p in found if str(p).startswith(place.path + "/"))

    def _ours(self, place: Place) -> bool:
        """Whether every object under ``place`` is named as ct.run names a checkpoint's files."""
        return all(_OURS.fullmatch(rel) for rel in self._objects(place))

    def _complete(self, place: Place) -> bool:
        """Whether ``place`` holds its marker: a published checkpoint."""
        self.fs.invalidate_cache()
        return bool(self._call("look at", place / CHECKSUMS, self.fs.exists, (place / CHECKSUMS).path))

    def _steps(self) -> list[Any]:
        """The published checkpoints, newest first: ``step-N/`` prefixes holding their marker."""
        self.fs.invalidate_cache()
        markers = self._call("listing of", self.dir, self.fs.glob, f"{self.dir.path}/step-*/{CHECKSUMS}")
        names = {str(m).rsplit("/", 2)[-2] for m in markers}
        ours = sorted(((step_of(n), n) for n in names if step_of(n) is not None), reverse=True)
        return [self.dir / n for _, n in ours]

    def _previous(self) -> str | None:
        try:
            return super()._previous()
        except StorageError:  # the store cannot be reached: the newest this run knows of
            return None if self.newest is None else self.newest.name

    def _foreign(self) -> list[str]:
        return [
            f"ignoring {self.dir / name}: not a checkpoint name (ct.run names them step-<step as 9 or more ASCII "
            "digits>, e.g. step-000000005); rename it so to resume from it"
            for name in self._children()
            if name.startswith("step-") and step_of(name) is None
        ]

    # -- the run's start: the store reachable and writable, what an interrupted save left tidied -------------------
    def _open(self) -> None:
        problem: tuple[str, str] | None = None
        if self.rank == 0:
            try:
                probe = self.dir / f".write-test-{os.getpid()}"
                self._call("write of", probe, self.fs.pipe_file, probe.path, b"")
                self._call("removal of", probe, self.fs.rm_file, probe.path)
                self._tidy()
            except StorageError as e:
                cause = e.__cause__ if e.__cause__ is not None else e
                problem = (_kind(cause).__name__, str(e))
        problem = from_rank0(problem)
        if problem is not None:
            kind = {k.__name__: k for k in (PermissionError, FileNotFoundError, ConnectionError)}.get(problem[0])
            raise (kind or StorageError)(
                f"{RUN}: checkpoint_dir {self.dir.url!r} cannot be used: {problem[1]}; nothing was trained or saved"
            )
        self._barrier()

    def _tidy(self) -> None:
        """Rank 0, at the start: finish a replacement cut short, remove what an interrupted save left."""
        for name in self._children():
            place, hidden = self.dir / name, _TMP.fullmatch(name)
            if hidden:
                final = self.dir / hidden[1]
                if self._complete(place) and not self._complete(final):  # the new copy is the checkpoint
                    self._replace(place, final, self._sums(place))
                else:
                    self._erase(place)
            elif step_of(name) is not None and not self._complete(place) and self._ours(place):
                self._erase(place)  # an upload cut short; anything else is the user's, refused if saved over

    def refuse_in_the_way(self, saves: Any) -> None:
        found = []
        if self.rank == 0:
            for name in self._children():
                step = step_of(name)
                what = self._taken(self.dir / name) if step is not None and saves(step) else None
                if what is not None:
                    found.append((name, what))
        found = from_rank0(found)
        if found:
            name, what = found[0]
            raise FileExistsError(
                f"{RUN}: {self.dir / name} is named as the checkpoint of step {step_of(name)}, which this run saves, "
                f"but it is no checkpoint ({what}); ct.run leaves it alone, and its save there would be refused "
                "after training up to it: move it out of checkpoint_dir and rerun"
            )

    # -- saving: where, the uploads, the marker --------------------------------------------------------------------
    def _places(self, step: int) -> tuple[Any, Any]:
        final = self.dir / f"step-{step:09d}"
        return final, (self.dir / f".step-{step:09d}.tmp" if self._complete(final) else final)

    def _taken(self, final: Any) -> str | None:
        if self._complete(final):
            return None
        if self._call("look at", final, self.fs.isfile, final.path):
            return "it is an object, not a prefix of them"
        others = [rel for rel in self._objects(final) if not _OURS.fullmatch(rel)]
        return f"it holds objects ct.run does not write: {', '.join(others[:3])}" if others else None

    def _prepare(self, flush: Flush) -> None:
        if self.rank == 0:
            io_step(f"prepare {flush.tmp.name}")
            self._erase(flush.tmp)  # what an earlier try left (only names ct.run writes: _taken says so)

    def _write_file(self, flush: Flush, name: str, value: Any) -> str:
        place = flush.tmp / name
        io_step(f"upload {name}")
        f = self._call("upload of", place, self.fs.open, place.path, "wb")
        hashing = Hashing(f)
        try:
            torch.save(value, cast(IO[bytes], hashing))  # torch.save writes and flushes, nothing else
        except BaseException as e:
            with contextlib.suppress(Exception):
                f.discard()  # an upload in parts aborted
                f.closed = True  # never closed: a store's file makes its object when closed (also when collected)
            if isinstance(e, Exception) and not isinstance(e, StorageError):
                raise StorageError(f"the upload of {place} failed: {described(e)}") from e
            raise
        self._call("upload of", place, f.close)  # the object appears whole, now
        return hashing.hexdigest()

    def _write_shards(self, flush: Flush) -> None:
        raise self._no_shards()

    def _shards_async(self, flush: Flush) -> Any:
        raise self._no_shards()

    def _no_shards(self) -> ValueError:
        return ValueError(
            f"{RUN}: checkpoint_dir {self.dir.url!r} is object storage, where ct.run does not save sharded tensors "
            "(ct.sharded, ct.tensor_parallel: DCP's shards); save to a folder on a shared filesystem"
        )

    def _put_marker(self, place: Place, sums: dict[str, str]) -> None:
        io_step(f"upload {place.name}/{CHECKSUMS}")
        marker = place / CHECKSUMS
        self._call("upload of", marker, self.fs.pipe_file, marker.path, sums_text(sums).encode())

    def _mark(self, flush: Flush, failed: str | None) -> None:
        mark = flush.tmp / mark_name(self.rank)
        io_step(f"upload {mark.name}")
        self._call("upload of", mark, self.fs.pipe_file, mark.path, mark_text(flush.written, failed).encode())

    def _read_mark(self, flush: Flush, rank: int) -> dict[str, str] | str | None:
        try:
            return parse_mark(self.fs.cat_file((flush.tmp / mark_name(rank)).path))
        except (OSError, ValueError):
            return None

    def _seal(self, flush: Flush, sums: dict[str, str]) -> None:
        for rank in range(self.world_size) if self.world_size > 1 else ():  # the ranks' marks: no file of it
            mark = flush.tmp / mark_name(rank)
            io_step(f"remove {mark.name}")
            with contextlib.suppress(FileNotFoundError):
                self._call("removal of", mark, self.fs.rm_file, mark.path)
        if flush.tmp != flush.final:  # a step saved again: its copy complete beside the published one
            self._put_marker(flush.tmp, sums)

    def _commit(self, flush: Flush, sums: dict[str, str]) -> None:
        if flush.tmp == flush.final:
            self._put_marker(flush.final, sums)  # the checkpoint is published by this marker
        else:
            self._replace(flush.tmp, flush.final, sums)

    def _replace(self, new: Place, final: Place, sums: dict[str, str]) -> None:
        """Put the complete checkpoint ``new`` in place of ``final``: absent for a moment, never half one."""
        self._erase(final)
        for rel in self._objects(new):
            if rel != CHECKSUMS:
                io_step(f"copy {rel}")
                self._call("copy of", new / rel, self.fs.copy, (new / rel).path, (final / rel).path)
        self._put_marker(final, sums)
        self._erase(new)

    def _erase(self, place: Place) -> None:
        """``place``'s objects, its marker first (never a checkpoint that lost a file but still looks complete)."""
        if self._complete(place):
            io_step(f"remove {place.name}/{CHECKSUMS}")
            self._call("removal of", place / CHECKSUMS, self.fs.rm_file, (place / CHECKSUMS).path)
        if self._objects(place):
            io_step(f"remove {place.name}")
            self._call("removal of", place, self.fs.rm, place.path, True)

    def _discard(self, flush: Flush) -> None:
        with contextlib.suppress(Exception):  # the store may be what failed: what is left has no marker
            if flush.tmp != flush.final and self._complete(flush.tmp) and not self._complete(flush.final):
                return  # the new copy is the only complete one: the next run puts it in place
            self._erase(flush.tmp)

    def _remove(self, checkpoint: Any) -> None:
        try:
            self._erase(checkpoint)
        except StorageError as e:  # retention is tidying: the run goes on, the checkpoint stays
            warnings.warn(f"{RUN}: could not remove the old checkpoint {checkpoint}: {e}", stacklevel=2)

    # -- loading ---------------------------------------------------------------------------------------------------
    def _sums(self, place: Place) -> dict[str, str]:
        sums, problem = parse_sums(self._call("read of", place / CHECKSUMS, self.fs.cat_file, (place / CHECKSUMS).path))
        if sums is None:
            raise StorageError(f"the marker of {place} is unreadable: {problem}")
        return sums

    def _verified(self, path: Any, name: str, schema: dict[str, Any], deep: Any) -> tuple[Any, str | None]:
        return verified(self.fs, path, name, schema, deep)

    def _read(self, path: Any, name: str, schema: dict[str, Any], deep: Any) -> tuple[Any, str | None]:
        failure: Exception | None = None
        try:
            value, problem = self._verified(path, name, schema, deep)
        except Exception as e:  # the store, not the checkpoint: every rank refuses, nothing is set aside
            value, problem, failure = None, None, e
        if not all_true(failure is None):
            why = described(failure) if failure is not None else "on another rank"
            raise (_kind(failure) if failure is not None else StorageError)(
                f"{RUN}: cannot read checkpoint {path} ({why}); it is left as it is: make it readable, or move it out "
                "of checkpoint_dir to resume from an older one"
            )
        return value, problem

    def _with_shards(self, path: Any, payload: dict[str, Any]) -> tuple[Any, str | None]:
        if _holds_placeholders(payload):
            return None, "it holds sharded tensors (DCP), which ct.run does not read from object storage"
        assert self.shards is not None
        return self.shards.load(path, payload), None

    def _set_aside(self, checkpoint: Any, name: str) -> str:
        taken, n, aside = set(self._children()), 1, name
        while aside in taken:
            n += 1
            aside = f"{name}-{n}"
        target = self.dir / aside
        for rel in self._objects(checkpoint):  # copied whole, marker and all; then the original removed
            self._call("copy of", checkpoint / rel, self.fs.copy, (checkpoint / rel).path, (target / rel).path)
        self._erase(checkpoint)
        return aside

    def _set_aside_names(self) -> list[str]:
        return sorted(n for n in self._children() if n.startswith("corrupt-step-"))


def _holds_placeholders(value: Any) -> bool:
    if isinstance(value, dict):
        return MARK in value or any(_holds_placeholders(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_placeholders(v) for v in value)
    return False


def verified(fs: Any, place: Place, name: str, schema: dict[str, Any], deep: Any) -> tuple[Any, str | None]:
    """``format.read`` of the object ``place/name`` once its bytes matched the checksum its marker records, or why
    not; the store's errors as they come (PermissionError, ...)."""
    try:
        marker = fs.cat_file((place / CHECKSUMS).path)
    except FileNotFoundError:
        return None, f"its marker {CHECKSUMS} is gone"
    sums, problem = parse_sums(marker)
    if sums is None:
        return None, problem
    try:
        data = fs.cat_file((place / name).path)
    except FileNotFoundError:
        return None, f"{name} is missing"
    problem = differs(name, hashlib.sha256(data).hexdigest(), sums.get(name))
    return (None, problem) if problem else read(data, schema, deep)


def read_remote(url: str, schema: dict[str, Any], deep: Any) -> tuple[Any, str | None]:
    """``state.pt`` of the checkpoint at ``url`` (``ct.load_checkpoint``), checked against its marker."""
    fs, path = filesystem(url)
    place = Place(fs, path, url.rstrip("/"))
    try:
        value, problem = verified(fs, place, STATE_FILE, schema, deep)
    except Exception as e:
        raise _kind(e)(f"load_checkpoint: cannot read {url}: {described(e)}") from e
    if value is not None and _holds_placeholders(value):
        return None, "it holds sharded tensors (DCP), which ct.run does not read from object storage"
    return value, problem

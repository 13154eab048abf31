"""Sharded tensors in ct.run's checkpoints, through torch.distributed.checkpoint (internal).

A TrainState sharded by ``ct.sharded`` holds DTensors: each rank has its own shard. On save,
every DTensor in the payload is replaced by a placeholder (plain types) and written by DCP
under ``shards/`` of the checkpoint folder, each rank its own shards; ``state.pt`` keeps the
rest. On load, the placeholders are filled by DCP into tensors laid out as the live state's
(its shards, or whole tensors where the state is not sharded), so a checkpoint of W ranks
loads on any number of them (DCP reshards), and nothing in the live state changes until
``TrainState.load_state_dict`` takes it all at once.

Loading runs no code: DCP reads ``.metadata`` with ``pickle.load`` and non-tensor entries
with ``torch.load(weights_only=False)``. Here the metadata goes through an unpickler that
knows only DCP's metadata classes, every entry asked for must be a tensor (never bytes),
and tensors themselves are read by DCP with ``weights_only=True``.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import async_save as dcp_async_save
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.storage import StorageWriter
from torch.distributed.tensor import DTensor, distribute_tensor

from composetrain.checkpoint.folder import SHARDS, not_regular
from composetrain.checkpoint.format import MARK
from composetrain.core.state import TrainState

__all__ = ["SafeReader", "ShardFiles", "split"]

Path_ = tuple[Any, ...]


def split(payload: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``payload`` with every DTensor replaced by a placeholder, and those DTensors by key."""
    found: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: Path_) -> Any:
        if isinstance(value, DTensor):
            key = "/".join(map(str, path))
            found[key] = value
            return {MARK: key, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        if isinstance(value, dict):
            return type(value)((k, walk(v, (*path, k))) for k, v in value.items())
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(walk(v, (*path, i)) for i, v in enumerate(value))
        return value

    return walk(payload, ()), found


def _placeholders(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, dict[str, Any]]]:
    if isinstance(value, dict) and MARK in value:
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _placeholders(v, (*path, k))
    elif type(value) in (list, tuple):
        for i, v in enumerate(value):
            yield from _placeholders(v, (*path, i))


def _replace(value: Any, path: Path_, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return type(value)((k, _replace(v, rest, new) if k == head else v) for k, v in value.items())
    return type(value)(_replace(v, rest, new) if i == head else v for i, v in enumerate(value))


class ShardFiles:
    """What ``Checkpoints`` calls for a payload that holds sharded tensors, given the live state."""

    def __init__(self, state: TrainState) -> None:
        self.state = state

    def save(self, tensors: dict[str, torch.Tensor], folder: Any, writer: StorageWriter | None = None) -> None:
        """Every rank writes its own shards (a collective); files are fsynced. A failure on any rank
        (a full disk) raises an ``OSError`` on every rank, with the first failing rank's cause. ``writer``:
        DCP's storage writer (default: a FileSystemWriter of ``folder/shards``)."""
        try:
            dcp_save(tensors, storage_writer=writer or FileSystemWriter(Path(folder) / SHARDS, sync_files=True))
        except CheckpointException as e:  # a BaseException: made an ordinary error, with its cause
            raise _write_error(e, folder)  # noqa: B904 - its cause set inside: the rank's own error

    def save_async(
        self, tensors: dict[str, torch.Tensor], folder: Any, group: Any, writer: StorageWriter | None = None
    ) -> Future[None]:
        """``save`` in DCP's own thread (``torch.distributed.checkpoint.async_save``), its collectives on
        ``group`` (one with a CPU backend, used by nothing else meanwhile): the shards are copied to host memory
        now (pinned, from a GPU), written while training goes on. The future's exception is ``save``'s error."""
        pinned = any(t.device.type == "cuda" for t in tensors.values())
        stager = DefaultStager(StagingOptions(pinned, False, False, False))
        try:
            upload = dcp_async_save(
                tensors,
                storage_writer=writer or FileSystemWriter(Path(folder) / SHARDS, sync_files=True),
                process_group=group,
                async_stager=stager,
            )
        except CheckpointException as e:  # the planning's collective, which runs now
            stager.close()
            raise _write_error(e, folder)  # noqa: B904 - its cause set inside: the rank's own error
        except BaseException:
            stager.close()
            raise
        done: Future[None] = Future()

        def finished(f: Any) -> None:
            stager.close()  # its copies freed once written
            error = f.exception()
            if isinstance(error, CheckpointException):
                error = _write_error(error, folder)
            done.set_exception(error) if error is not None else done.set_result(None)

        assert isinstance(upload, Future)  # a stager that stages at once: the upload's future alone
        upload.add_done_callback(finished)
        return done

    def load(self, folder: Path, payload: dict[str, Any], at: Path_ = ("state",)) -> dict[str, Any]:
        """``payload`` with its placeholders filled from ``folder``'s shards, and its whole tensors
        sharded where the live state is (a collective when there are placeholders)."""
        live = self.state.state_dict()
        params = [p for g in self.state.optimizer.param_groups for p in g["params"]]
        targets: dict[str, torch.Tensor] = {}
        where: dict[str, Path_] = {}
        for path, mark in _placeholders(payload):
            key = mark[MARK]
            dtype = getattr(torch, str(mark.get("dtype")), None)
            if not isinstance(key, str) or not isinstance(dtype, torch.dtype) or key in targets:
                raise ValueError(f"its shard placeholder at {'/'.join(map(str, path))} is malformed")
            targets[key] = self._target(path[len(at) :], live, params, torch.Size(mark["shape"]), dtype)
            where[key] = path
        if targets:
            reader = SafeReader(folder / SHARDS)
            try:
                dcp_load(targets, storage_reader=reader, planner=DefaultLoadPlanner(allow_partial_load=False))
            except CheckpointException as e:  # a BaseException: made an ordinary error, with its first cause
                rank, cause = _first_failure(e)
                detail = str(cause).strip().splitlines()
                raise ValueError(
                    f"DCP could not read the shards (rank {rank}: {detail[-1] if detail else cause})"
                ) from None
            for key, path in where.items():
                payload = _replace(payload, path, targets[key])
        return self._shard_whole(payload, at, live, params)

    def _target(
        self, path: Path_, live: Any, params: list[torch.Tensor], shape: torch.Size, dtype: torch.dtype
    ) -> torch.Tensor:
        """An empty tensor laid out as the live state's at ``path``: its shard, or the whole tensor."""
        like = _live_like(path, live, params)
        if isinstance(like, DTensor) and like.shape == shape:
            return torch.empty_like(like, dtype=dtype)
        device = like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
        return torch.empty(shape, dtype=dtype, device=device)

    def _shard_whole(self, payload: Any, at: Path_, live: Any, params: list[torch.Tensor]) -> Any:
        """Whole tensors where the live state holds shards (a checkpoint of fewer ranks, or unsharded)."""
        state = payload
        for k in at:
            state = state[k]

        def walk(value: Any, path: Path_) -> Any:
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
                like = _live_like(path, live, params)
                if isinstance(like, DTensor) and like.shape == value.shape:
                    return distribute_tensor(
                        value.to(like.device), like.device_mesh, like.placements, src_data_rank=None
                    )
                return value
            if isinstance(value, dict):
                return type(value)((k, walk(v, (*path, k))) for k, v in value.items())
            return value

        return _replace(payload, at, walk(state, ()))


def _write_error(e: CheckpointException, folder: Any) -> OSError:
    """DCP's failure to write (a BaseException) as an ordinary error, with the first failing rank's cause."""
    rank, cause = _first_failure(e)
    error = cause if isinstance(cause, OSError) else None
    made = OSError(
        error.errno if error else None,
        f"DCP could not write the shards (rank {rank}: {cause})",
        error.filename if error else f"{folder}/{SHARDS}",
    )
    made.__cause__ = cause if isinstance(cause, BaseException) else None
    return made


def _first_failure(e: CheckpointException) -> tuple[int, Any]:
    """The lowest failing rank and its exception (DCP wraps each in a ``_WrappedException``)."""
    rank, found = min(e.failures.items(), key=lambda kv: kv[0])
    cause: Any = found
    if isinstance(cause, tuple) and cause and isinstance(cause[0], BaseException):  # (exception, its frames)
        cause = cause[0]
    return rank, getattr(cause, "exc", cause)


def _live_like(path: Path_, live: Any, params: list[torch.Tensor]) -> Any:
    """The live state's value at ``path`` (of ``TrainState.state_dict()``); for optimizer state that
    does not exist yet, the parameter it belongs to."""
    value = live
    for k in path:
        if isinstance(value, dict) and k in value:
            value = value[k]
        else:
            value = None
            break
    if value is None and len(path) >= 3 and path[:2] == ("optimizer", "state") and isinstance(path[2], int):
        value = params[path[2]] if 0 <= path[2] < len(params) else None
    return value


# DCP's metadata classes, and what they are built from: nothing else unpickles
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "BytesStorageMetadata",
    )
} | {
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("torch.distributed.checkpoint._extension", "StreamTransformExtension"),
    ("torch", "Size"),
    ("torch", "float64"),
    ("torch", "float32"),
    ("torch", "float16"),
    ("torch", "bfloat16"),
    ("torch", "int64"),
    ("torch", "int32"),
    ("torch", "int8"),
    ("torch", "uint8"),
    ("torch", "bool"),
    ("torch", "strided"),
    ("torch", "contiguous_format"),
    ("torch", "preserve_format"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("torch.serialization", "_get_layout"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the shard metadata names {module}.{name}, which is not DCP metadata")


class SafeReader(FileSystemReader):
    """DCP's FileSystemReader, but its metadata is unpickled from an allow-list and must list tensors only."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        folder = Path(self.path)
        problem = not_regular(folder / ".metadata")
        if problem:  # a FIFO would block the read forever
            raise ValueError(f"the shard metadata: {problem}")
        data = (folder / ".metadata").read_bytes()
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"the shard metadata holds a {type(metadata).__name__}, not DCP Metadata")
        entries = metadata.state_dict_metadata
        if not all(isinstance(v, TensorStorageMetadata) for v in entries.values()):
            raise ValueError("the shard metadata lists entries that are not tensors; ct.run writes tensors only")
        inside, checked = folder.resolve(), set()
        for info in (metadata.storage_data or {}).values():  # the files DCP will open: each in this folder
            relative = getattr(info, "relative_path", None)
            if not isinstance(relative, str):
                raise ValueError(f"the shard metadata names a file as {relative!r}, not a relative path")
            if relative in checked:  # one entry per tensor chunk, a few files: each file checked once
                continue
            checked.add(relative)
            target = (folder / relative).resolve()
            if target.parent != inside:
                raise ValueError(
                    f"the shard metadata names {relative!r}, outside the checkpoint's shards folder {inside}; "
                    "ct.run writes every shard file inside it"
                )
            problem = not_regular(target)
            if problem:
                raise ValueError(f"the shard file {problem}")
        storage = metadata.storage_meta if metadata.storage_meta is not None else StorageMeta()
        storage.load_id = self.load_id  # what FileSystemReader.read_metadata adds after unpickling
        metadata.storage_meta = storage
        return metadata

"""ct.run's checkpoint format, defined once: what each file holds, as small typed values, and the reader that
loads a file without running code and checks it against them.

A checkpoint folder (``folder.py`` names it) holds ``state.pt``, written by rank 0: a ``Shared`` part stamped
with the format, the world size and the data shard each rank read, and ``rank-<rank>.pt``, each rank's ``Local``
part stamped with its random states. A run defined by its global batch resumes on another number of processes, or
another layout of them, from ``state.pt`` alone. The
dataclasses below are the files' keys and value types; ``SHARED``, ``LOCAL`` and ``ORDER`` are the schemas read from
them, and the TrainState inside comes with the keys ``TrainState.state_dict`` defines.
"""

import dataclasses
import io
import pickle
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from composetrain.checkpoint.folder import not_regular
from composetrain.core.rng import capture_rng, generators_problem, rng_problem
from composetrain.core.state import KEYS as STATE_KEYS
from composetrain.core.util import RUN, show

__all__ = [
    "ADDED",
    "ADDED_LOCAL",
    "FORMAT",
    "LOCAL",
    "MARK",
    "ORDER",
    "READS",
    "SHARED",
    "STREAM_STATES",
    "WINDOW",
    "Local",
    "Order",
    "Shared",
    "UnloggedStep",
    "check_fits",
    "local_problem",
    "read",
    "same_ranks",
    "shape_problem",
    "shared_problem",
    "stamp_local",
    "stamp_shared",
    "stream_problem",
    "unlogged_problem",
    "unplain",
    "window_problem",
]

FORMAT = 3  # 2: tensors and plain types only, loaded with weights_only=True; 3: and checksums.json
READS = (2, 3)  # 2 loads unverified: it was written before checksums
MARK = "__dcp_shard__"  # a sharded tensor's placeholder in state.pt: {MARK: its DCP key, "shape", "dtype"}


class _Part:
    """A part of a checkpoint file: a dataclass whose fields are the file's keys."""

    def to_file(self) -> dict[str, Any]:
        """The fields as a dict, the values as they are (``dataclasses.asdict`` would copy tensors)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


def _schema(cls: type) -> dict[str, Any]:
    return {f.name: f.type for f in dataclasses.fields(cls)}


# No ``from __future__ import annotations`` here: the field types are the classes the reader checks.
@dataclasses.dataclass(frozen=True)
class Shared(_Part):
    """What every rank resumes from (rank 0 writes it): the TrainState's ``state_dict()``, the run's settings
    (a change is warned about), and where the loop stands; ``window``: the step outputs not yet logged, each the
    mean over the ranks (``UnloggedStep``s, float64), which a run defined by its global batch continues on any
    number of processes (empty otherwise, and in checkpoints written before it)."""

    state: dict
    settings: dict
    epoch: int
    position: int
    history: list
    evals: list
    window: list = dataclasses.field(default_factory=list)
    stream: dict | None = None  # a stream's state that is the whole job's (the same on every rank), else None


@dataclasses.dataclass(frozen=True)
class UnloggedStep(_Part):
    """One step output not yet logged (``Meter``'s window), on the CPU."""

    loss: torch.Tensor
    metrics: dict
    skipped: bool


@dataclasses.dataclass(frozen=True)
class Local(_Part):
    """One rank's own part: its unlogged step outputs, the epoch's data order (None when it needs no
    replay), a given DataLoader's generators, and a stream's ``state_dict()`` (None: no stream, or one resumed by
    replay)."""

    window: list
    order: dict | None
    generators: list
    stream: dict | None = None


@dataclasses.dataclass(frozen=True)
class Order(_Part):
    """What decides a given DataLoader's order for an epoch (``driver.loader.epoch_order``)."""

    rng: dict
    generators: list
    sampler_seed: int | None


# The schemas a loadable file has: anything else is corrupt.
SHARED = {"format": int, "world_size": int, "data_shards": list, **_schema(Shared)}
# state.pt's keys that older checkpoints lack, and a rank file's: read as empty there
ADDED: dict[str, Callable[[], Any]] = {"window": list, "data_shards": list, "stream": type(None)}
ADDED_LOCAL: dict[str, Callable[[], Any]] = {"stream": type(None)}
LOCAL = {"rng": dict, **_schema(Local)}
ORDER = _schema(Order)
WINDOW = _schema(UnloggedStep)


def stamp_shared(shared: dict[str, Any], world_size: int, data_shards: list[int] | None = None) -> dict[str, Any]:
    """``state.pt``'s content: the shared part, with the format, the number of processes that wrote it and the data
    shard each of them read (``Capabilities.data_shard``; None: each its own, rank r shard r)."""
    shards = list(range(world_size)) if data_shards is None else list(data_shards)
    return {**shared, "format": FORMAT, "world_size": world_size, "data_shards": shards}


def stamp_local(local: dict[str, Any]) -> dict[str, Any]:
    """``rank-<rank>.pt``'s content: this rank's part, with its random states taken now."""
    return {**local, "rng": capture_rng()}


def _shards_of(payload: dict[str, Any]) -> list[int]:
    """The data shard each rank that wrote ``payload`` read (a checkpoint written before it was stamped: its own)."""
    return payload["data_shards"] or list(range(payload["world_size"]))


def same_ranks(payload: dict[str, Any], world_size: int, data_shards: list[int] | None = None) -> bool:
    """Whether this run's processes are the ones that wrote ``payload``: as many, each reading the same data shard
    (a composition that splits its model over a mesh maps ranks to shards by its layout). Only then does each rank's
    own file (its random states, its unlogged outputs) continue on the rank of the same number."""
    shards = list(range(world_size)) if data_shards is None else list(data_shards)
    return payload["world_size"] == world_size and _shards_of(payload) == shards


def check_fits(payload: dict[str, Any], world_size: int, path: Path, data_shards: list[int] | None = None) -> None:
    """Refuse a sound checkpoint that this run cannot continue (it is not corrupt: kept as it is). One of a run
    defined by its global batch continues on any number of processes, in any layout (ct.run then compares its
    settings); one given a per-process batch_size, on the same processes reading the same data shards only."""
    if payload["format"] not in READS:
        raise ValueError(
            f"{RUN}: checkpoint {path} is in format {payload['format']}, this composetrain reads formats "
            f"{' and '.join(map(str, READS))} (tensors and plain types only, loaded with weights_only=True); finish "
            "that run with the "
            "composetrain that wrote it, or point checkpoint_dir elsewhere to start afresh"
        )
    settings = payload["settings"]
    if payload["world_size"] != world_size and settings.get("stream") not in (None, "global state"):
        raise ValueError(
            f"{RUN}: checkpoint {path} was saved by {payload['world_size']} process(es), this run has {world_size}; "
            "a stream's state is each rank's own (where that rank stands in its share of the stream), so resume "
            f"with {payload['world_size']} process(es); a dataset whose state_dict() is the whole job's position "
            "(the same on every rank, e.g. the items the job has read in all) says so with a class attribute "
            "state_is_global = True, and then resumes on any number (read with num_workers=0)"
        )
    # a global batch's run, or a stream whose state is the whole job's, continues on any number of processes
    if settings.get("global_batch_size") is not None or (
        settings.get("stream") and payload["world_size"] != world_size
    ):
        return
    if payload["world_size"] != world_size:
        raise ValueError(
            f"{RUN}: checkpoint {path} was saved by {payload['world_size']} process(es), this "
            f"run has {world_size}; resume with the same number of processes: its batch_size is per process, "
            "so its data order and random states are per rank (a run given global_batch_size= instead, the "
            "samples of an update all processes together, resumes on any number of processes that divides it)"
        )
    if not same_ranks(payload, world_size, data_shards):
        now = list(range(world_size)) if data_shards is None else list(data_shards)
        raise ValueError(
            f"{RUN}: checkpoint {path} was saved by processes reading data shards {_shards_of(payload)} (rank by "
            f"rank, as its composition laid them out), and this run's read {now}; resume with "
            "the same layout (the same tensor-parallel, pipeline and data-parallel sizes): its batch_size is per "
            "process, so its data order and random states are per rank (a run given global_batch_size= instead "
            "resumes on any layout whose data shards divide it)"
        )


def read(path: Path | bytes, schema: dict[str, Any], deep: Callable[[Any], str | None]) -> tuple[Any, str | None]:
    """The dict in ``path`` (or in these bytes: an object's, from object storage) if it loads without running code
    and has the ``schema``; else why not."""
    if not isinstance(path, bytes):
        problem = not_regular(path)
        if problem:  # a FIFO would block the open forever, a device would be read without end
            return None, problem
    try:
        value = torch.load(io.BytesIO(path) if isinstance(path, bytes) else path, map_location="cpu", weights_only=True)
        added: dict[str, Callable[[], Any]] = ADDED if schema is SHARED else ADDED_LOCAL if schema is LOCAL else {}
        if isinstance(value, dict):
            value = {**{k: kind() for k, kind in added.items()}, **value}
    except PermissionError:
        raise  # not the file's fault: Checkpoints._read refuses it on every rank
    except pickle.UnpicklingError as e:  # weights_only refused a global: the file asks to run code
        detail = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line), str(e).splitlines()[0])
        return None, f"it holds objects other than tensors and plain types, so it was not loaded ({detail})"
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    problem = shape_problem(value, schema) or deep(value)
    return (None, problem) if problem else (value, None)


def shape_problem(value: Any, schema: dict[str, Any]) -> str | None:
    if not isinstance(value, dict):
        return f"it holds a {type(value).__name__}, not a dict of {sorted(schema)}"
    missing = sorted(schema.keys() - value.keys())
    if missing:
        return f"it lacks {missing}"
    for key, kind in schema.items():
        if not isinstance(value[key], kind) or (kind is int and isinstance(value[key], bool)):
            return f"its {key!r} is a {type(value[key]).__name__}"
    return None


def shared_problem(payload: dict[str, Any], step: int | None = None) -> str | None:
    """What is wrong with a ``state.pt`` payload, or None; ``step``: its folder's, when known."""
    per_epoch = payload["settings"].get("updates_per_epoch")
    if payload["settings"].get("stream"):  # a pass of a stream holds as many updates as the stream gives
        per_epoch = float("inf")
    if payload["world_size"] < 1 or payload["epoch"] < 0 or not 0 <= payload["position"] < (per_epoch or 1):
        return (
            f"world_size {payload['world_size']}, epoch {payload['epoch']}, position {payload['position']} "
            f"of {per_epoch} updates per epoch"
        )
    shards = payload["data_shards"]
    if shards and (len(shards) != payload["world_size"] or not all(type(s) is int and s >= 0 for s in shards)):
        return f"its data_shards {shards!r} are not a data shard for each of its {payload['world_size']} process(es)"
    state = payload["state"]
    missing = sorted(STATE_KEYS - state.keys())
    if missing:
        return f"its TrainState lacks {missing}"
    if type(state["step"]) is not int or (step is not None and state["step"] != step):
        return f"its TrainState's step {state['step']!r} is not the step of its folder ({step})"
    if not all(isinstance(r, dict) for r in payload["history"] + payload["evals"]):
        return "its history and evals must be lists of dicts"
    problem = next(filter(None, map(window_problem, payload["window"])), None)
    if problem is None and payload["settings"].get("global_batch_size") is not None:  # its window: ranks' means
        problem = unlogged_problem(payload, payload["window"])
    return problem or stream_problem(payload["stream"])


def unlogged_problem(payload: dict[str, Any], window: list[dict[str, Any]]) -> str | None:
    """Why ``window``, a checkpoint's updates not yet logged (each checked by ``window_problem``), cannot continue
    the record of the ``state.pt`` ``payload``, or None: its applied (not skipped) updates are those since the
    last record, ``step - history[-1]["step"]`` (with no record yet, at most ``step``: the run may have begun at a
    later update). One that does not add up (edited, damaged) would make the next record another mean, silently."""
    step, history = payload["state"]["step"], payload["history"]
    applied = sum(not entry["skipped"] for entry in window)
    last = history[-1].get("step") if history else None
    since = step - last if type(last) is int else None
    if applied == since or (since is None and applied <= step):
        return None
    expected = f"the {since} since its last record (at update {last})" if since is not None else f"at most {step}"
    return f"its {applied} unlogged update(s) are not {expected}, at update {step}"


def local_problem(local: dict[str, Any]) -> str | None:
    """What is wrong with a ``rank-<rank>.pt`` payload, or None (random states tried on fresh generators)."""
    order = local["order"]
    if order is not None and (bad := shape_problem(order, ORDER)):
        return f"its data order state: {bad}"
    return (
        rng_problem(local["rng"])
        or generators_problem(local["generators"])
        or (order and (rng_problem(order["rng"]) or generators_problem(order["generators"])))
        or next(filter(None, map(window_problem, local["window"])), None)
        or stream_problem(local["stream"])
    )


STREAM_STATES = (dict, OrderedDict)  # what a stream's state_dict() may be: saved as it is, loaded as it was saved


def stream_problem(record: Any) -> str | None:
    """What is wrong with a checkpoint's record of a stream (``{"state": its state_dict(), "ended": bool}``), or
    None."""
    if record is None or (
        type(record) is dict
        and record.keys() == {"state", "ended"}
        and type(record["state"]) in STREAM_STATES
        and type(record["ended"]) is bool
    ):
        return None
    return "its stream record must be None or a dict of the stream's state (a dict) and whether it ended"


def window_problem(entry: Any) -> str | None:
    """What is wrong with one saved step output (``UnloggedStep``), or None."""
    if shape_problem(entry, WINDOW) is None and all(
        type(k) is str and isinstance(v, torch.Tensor)
        for k, v in entry["metrics"].items()  # exactly as saved
    ):
        return None
    return "its unlogged step outputs must be dicts of loss, metrics and skipped"


_PLAIN = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)


def unplain(value: Any, where: str) -> str | None:
    """Where in ``value`` something sits that ``torch.load(weights_only=True)`` would refuse, or None.
    Exact types: a NumPy float is a float subclass, and a named tuple a tuple one, yet neither loads."""
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN:
        return None
    if type(value) in (dict, OrderedDict):
        for k, v in value.items():
            problem = unplain(k, f"a key of {where}") or unplain(v, f"{where}[{k!r}]")
            if problem:
                return problem
        return None
    if type(value) in (list, tuple, set):
        return next(filter(None, (unplain(v, f"{where}[{i}]") for i, v in enumerate(value))), None)
    return f"{where} is {show(value)}"

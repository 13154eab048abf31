"""ct.run's options as typed values (internal): the loader's, the checkpoints', the log's and the
evaluation's, each checked once, when it is built, and handed whole to the part that uses it.

``from_run_args`` takes ``ct.run``'s arguments as the user gave them (None: the default), resolves
the defaults and what can only be checked against ``data``; ``__post_init__`` checks the resolved
value, so that no option value exists that was not checked. Nothing here touches a process group,
a device or a folder: every refusal comes before anything is set up.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sized
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.autograd import profiler as torch_profiler
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from composetrain.checkpoint.objects import is_remote, local_path
from composetrain.core.protocol import TrainStep
from composetrain.core.util import RUN, check_int, check_real, show
from composetrain.driver.epoch_ends import check_hook, parse_metric
from composetrain.driver.streams import MODES, is_stream, resume_problem
from composetrain.driver.throughput import PRECISIONS
from composetrain.driver.tracking import deferred_kind

__all__ = [
    "CheckpointOptions",
    "EvalOptions",
    "LoaderOptions",
    "LogOptions",
    "ProfileOptions",
    "RunOptions",
    "WatchOptions",
]


def _optional_int(value: Any, name: str) -> int | None:
    """None, or a positive int (the one rule for ints: a wrong kind TypeError, out of range ValueError)."""
    return None if value is None else check_int(value, RUN, name, example=f"{name}=10 or None")


def _set(options: Any, **normalised: Any) -> None:
    """Store the checked form of fields (a NumPy integer as an int: the checkpoint keeps plain types)."""
    for name, value in normalised.items():
        object.__setattr__(options, name, value)


def _workers(value: Any) -> int | str:
    """num_workers checked: 'auto', or a non-negative int ('many', 2.0, -1: named, with both ways to say it)."""
    if isinstance(value, str) and value == "auto":
        return value
    return check_int(value, RUN, "num_workers", minimum=0, example="num_workers=2 or 'auto'")


def _no_nul(value: Any, name: str) -> None:
    """A path with a NUL byte, which the OS would refuse with a bare 'embedded null byte' at its first use."""
    text = os.fspath(value)
    if isinstance(text, bytes):  # a PathLike of bytes: pathlib's bare TypeError, or none at all
        raise TypeError(
            f"{RUN}: {name} must be a str or an os.PathLike of str, got {show(value)} (a path of bytes); "
            f"e.g. {name}='runs/a'"
        )
    if "\0" in text:
        raise ValueError(
            f"{RUN}: {name} holds a null byte, which no path may hold, got {show(value)}; e.g. {name}='runs/a'"
        )


def _within(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies inside it (as absolute paths, before either exists)."""
    inner, outer = Path(os.path.abspath(inner)), Path(os.path.abspath(outer))
    return inner == outer or outer in inner.parents


def _file_above(path: Path) -> Path | None:
    """The first of ``path``'s parents that exists and is not a folder (nothing can be made under it)."""
    return next((p for p in path.parents if p.exists() and not p.is_dir()), None)


def _log_path(log_file: Any) -> Path | None:
    """The metrics file given (None: none given), refused now if it cannot be one: before the checkpoint
    folder is made (a bytes path, a number, "": which pathlib would refuse bare, or take as no file)."""
    if log_file is None:
        return None
    if not isinstance(log_file, (str, os.PathLike)):
        raise TypeError(
            f"{RUN}: log_file must be a str or os.PathLike, got {show(log_file)}; e.g. "
            "log_file='runs/a/metrics.jsonl', or None"
        )
    _no_nul(log_file, "log_file")  # and an os.PathLike of bytes
    if not os.fspath(log_file):
        raise ValueError(
            f"{RUN}: log_file must name a file, got {show(log_file)}; e.g. log_file='runs/a/metrics.jsonl', or "
            "None (the default: checkpoint_dir/metrics.jsonl)"
        )
    path = Path(log_file).expanduser()
    inside = _file_above(path)
    problem = (
        "it is a folder"
        if path.is_dir()
        else f"it is inside {str(inside)!r}, a file, not a folder"
        if inside is not None
        else None
    )
    if problem is not None:  # as MetricsLog would find it, but before the checkpoint folder is made
        raise PermissionError(
            f"{RUN}: log_file {str(path)!r} is not writable ({problem}); choose a file you can write to, e.g. "
            "log_file='runs/a/metrics.jsonl'"
        )
    return path


def _not_tensors(data: Any, name: str) -> None:
    """A dict or a tuple of tensors is no Dataset (a dict is Sized, and read by index fails with a bare KeyError)."""
    if isinstance(data, Mapping) or (isinstance(data, tuple) and data and all(isinstance(t, Tensor) for t in data)):
        raise TypeError(
            f"{RUN}: {name} must be a Dataset or DataLoader, got {show(data)}; wrap tensors as "
            "torch.utils.data.TensorDataset(x, y)"
        )


def check_flag(value: Any, name: str, *, optional: bool = False) -> None:
    """True or False (or None, the default, when ``optional``): 1, 'yes' and np.bool_ are refused."""
    if not isinstance(value, bool) and not (value is None and optional):
        raise TypeError(
            f"{RUN}: {name} must be True or False{' (or None: the default)' if optional else ''}, got "
            f"{show(value)}; e.g. {name}=True"
        )


def dataloader_settings(
    data: DataLoader[Any], batch_size: int | None, shuffle: bool | None, drop_last: bool | None
) -> None:
    """For a DataLoader given as is (its own batching and sampler decide): refuse any of batch_size, shuffle
    and drop_last that says otherwise, rather than ignore it."""
    fix = "leave it out (the DataLoader is used as given), or pass the Dataset and let ct.run build the loader"
    if batch_size is not None and batch_size != data.batch_size:
        by = (
            data.batch_size
            if data.batch_size is not None
            else f"its {type(data.batch_sampler).__name__}"
            if data.batch_sampler is not None
            else "none (batch_size=None: each item is a batch)"
        )
        raise ValueError(f"{RUN}: batch_size={batch_size} but the DataLoader given batches by {by}; {fix}")
    if drop_last is not None and drop_last != data.drop_last:
        raise ValueError(f"{RUN}: drop_last={drop_last} but the DataLoader given has drop_last={data.drop_last}; {fix}")
    own = _shuffles(data.sampler)
    if shuffle is not None and own is None:
        raise ValueError(
            f"{RUN}: shuffle={shuffle} but the DataLoader given orders its data by its own "
            f"{type(data.sampler).__name__}, which ct.run cannot change; {fix}"
        )
    if shuffle is not None and shuffle != own:
        raise ValueError(
            f"{RUN}: shuffle={shuffle} but the DataLoader given has a {type(data.sampler).__name__} "
            f"({'shuffled' if own else 'in order'}); {fix}"
        )


def _shuffles(sampler: Any) -> bool | None:
    """Whether a sampler reshuffles its data (None: a sampler of unknown kind)."""
    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    if isinstance(sampler, DistributedSampler):
        return bool(sampler.shuffle)
    return None


def check_eval_data(eval_data: Any, data: Any) -> None:
    """Refuse a Dataset for eval_data that ct.run could not batch: the DataLoader given as data has no batch size."""
    if eval_data is None or isinstance(eval_data, DataLoader):
        return
    if isinstance(data, DataLoader) and data.batch_size is None:
        by = (
            f"it batches with batch_sampler={type(data.batch_sampler).__name__}"
            if data.batch_sampler is not None
            else "batch_size=None: each item is a batch"
        )
        raise ValueError(
            f"{RUN}: eval_data is a Dataset, which ct.run batches by the training loader's batch size, but the "
            f"DataLoader given as data has none ({by}); "
            "give eval_data as a DataLoader too: eval_data=DataLoader(eval_set, batch_size=256)"
        )


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """How ct.run reads ``data``: a DataLoader given is used as given (batch_size None: its own); a Dataset in
    batches of ``batch_size`` per process, or of ``global_batch_size`` all processes together (one of them)."""

    data: Any
    batch_size: int | None
    shuffle: bool
    drop_last: bool
    num_workers: int | str
    collate_fn: Callable[[list[Any]], Any] | None
    seed: int
    global_batch_size: int | None = None
    stream_resume: str | None = None

    def __post_init__(self) -> None:
        seed = check_int(self.seed, RUN, "seed", minimum=0, example="seed=0")
        if seed >= 2**32:
            raise ValueError(f"{RUN}: seed must be below 2**32, got {show(self.seed)}; e.g. seed=0")
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise TypeError(f"{RUN}: collate_fn must be a function, got {show(self.collate_fn)}; or leave it out")
        if self.collate_fn is not None and isinstance(self.data, DataLoader):
            raise ValueError(
                f"{RUN}: collate_fn is given but so is a DataLoader, which collates with its own; give the "
                "DataLoader collate_fn=, or pass the Dataset"
            )
        _not_tensors(self.data, "data")
        check_flag(self.shuffle, "shuffle")
        check_flag(self.drop_last, "drop_last")
        _set(self, seed=seed)
        if isinstance(self.data, DataLoader) and self.global_batch_size is not None:
            raise ValueError(
                f"{RUN}: global_batch_size={self.global_batch_size!r} but data is a DataLoader, which reads "
                "its own batches: ct.run could not choose which samples of each update each process reads; pass "
                "the Dataset (with collate_fn= and num_workers= as needed) and ct.run builds the loader, or give "
                "batch_size= with the DataLoader"
            )
        if self.stream_resume is not None and self.stream_resume not in MODES:
            raise ValueError(
                f"{RUN}: stream_resume must be one of {', '.join(map(repr, MODES))} (or None: 'state'), got "
                f"{show(self.stream_resume)}; e.g. stream_resume='replay'"
            )
        if self.stream:
            self._check_stream()
            return
        if self.stream_resume is not None:
            raise ValueError(
                f"{RUN}: stream_resume={self.stream_resume!r} but data is {show(self.data)}, not a stream (an "
                "IterableDataset, or a DataLoader over one): a map-style dataset resumes by its sample order; leave "
                "stream_resume out"
            )
        if isinstance(self.data, DataLoader):
            return  # batches, orders and reads by its own (checked against these by from_run_args)
        if not isinstance(self.data, Dataset) and not hasattr(self.data, "__getitem__"):
            raise TypeError(f"{RUN}: data must be a torch Dataset or DataLoader, got {show(self.data)}")
        if self.batch_size is not None and self.global_batch_size is not None:
            raise ValueError(
                f"{RUN}: batch_size={self.batch_size!r} and global_batch_size={self.global_batch_size!r} "
                "are both given; give one: batch_size is per process (the run changes with the number of "
                "processes), global_batch_size is all processes together (the same run on any number of "
                "processes that divides it)"
            )
        if self.global_batch_size is not None:
            size = check_int(self.global_batch_size, RUN, "global_batch_size", example="global_batch_size=256")
            if not isinstance(self.data, Sized):
                raise TypeError(
                    f"{RUN}: global_batch_size needs the dataset's length (its order is a permutation of its "
                    f"samples), but {show(self.data)} has none; give it __len__"
                )
            _set(self, global_batch_size=size, num_workers=_workers(self.num_workers))
            return
        if self.batch_size is None:
            raise ValueError(
                f"{RUN}: batch_size is required when data is a Dataset, e.g. batch_size=64 (per process), or "
                "global_batch_size=256 (all processes together: the same run on any number of processes)"
            )
        batch_size = check_int(self.batch_size, RUN, "batch_size", example="batch_size=64")
        _set(self, batch_size=batch_size, num_workers=_workers(self.num_workers))

    def _check_stream(self) -> None:
        """A stream (an IterableDataset, or a DataLoader over one): it orders and splits itself, so ct.run batches it
        by ``batch_size`` per process and nothing decides a global order."""
        if self.global_batch_size is not None:
            raise ValueError(
                f"{RUN}: global_batch_size={self.global_batch_size!r} but data is a stream "
                f"({type(self.data).__name__}), which decides itself which items each process reads: ct.run could not "
                "make each update the same samples on any number of processes; give batch_size= (per process), or a "
                "map-style dataset (ct.tokens, ct.cache) with global_batch_size"
            )
        if self.shuffle:
            raise ValueError(
                f"{RUN}: shuffle=True but data is a stream ({type(self.data).__name__}), which orders its items "
                "itself; shuffle inside it (a shuffle buffer, or shards in a seeded order: set_epoch(epoch) is called "
                "before each pass), and leave shuffle out"
            )
        if isinstance(self.data, DataLoader):
            return  # batches and reads by its own (checked against batch_size, drop_last by from_run_args)
        if self.batch_size is None:
            raise ValueError(
                f"{RUN}: batch_size is required when data is a stream ({type(self.data).__name__}): items per update "
                "per process, e.g. batch_size=64"
            )
        batch_size = check_int(self.batch_size, RUN, "batch_size", example="batch_size=64")
        _set(self, batch_size=batch_size, num_workers=_workers(self.num_workers))

    @property
    def stream(self) -> bool:
        """Whether ``data`` is read as a stream: an IterableDataset, or a DataLoader over one."""
        return is_stream(self.data)

    @property
    def auto_workers(self) -> bool:
        """Whether the number of workers is chosen by measurement (``num_workers="auto"``)."""
        return isinstance(self.num_workers, str)

    @classmethod
    def from_run_args(
        cls,
        data: Any,
        *,
        batch_size: Any,
        shuffle: Any,
        drop_last: Any,
        num_workers: Any,
        collate_fn: Any,
        seed: Any,
        global_batch_size: Any = None,
        stream_resume: Any = None,
    ) -> LoaderOptions:
        """shuffle (default True, False for a stream) and drop_last (default False) resolved; for a DataLoader given
        as is, any of batch_size, shuffle and drop_last that says otherwise than it is refused, never ignored."""
        check_flag(shuffle, "shuffle", optional=True)
        check_flag(drop_last, "drop_last", optional=True)
        if isinstance(data, DataLoader) and global_batch_size is None:
            # checked as for a Dataset first: True, 4.0 or "4" must not pass, nor be shown as 4, by comparison
            size = None if batch_size is None else check_int(batch_size, RUN, "batch_size", example="batch_size=64")
            workers = _workers(num_workers)
            dataloader_settings(data, size, shuffle, drop_last)
            if not isinstance(workers, str) and workers != data.num_workers:
                raise ValueError(
                    f"{RUN}: num_workers={workers} but the DataLoader given has num_workers={data.num_workers}; "
                    "leave it out (the DataLoader is used as given), or give the DataLoader num_workers="
                )
        return cls(
            data,
            batch_size,
            not is_stream(data) if shuffle is None else shuffle,
            bool(drop_last),
            num_workers,
            collate_fn,
            seed,
            global_batch_size,
            stream_resume,
        )


# A run with a checkpoint_dir saves at least this often (wall-clock; its epoch ends too), unless told otherwise:
# a kill loses minutes, not an epoch. What it costs is measured in benchmarks/README.md (Checkpoints).
DEFAULT_INTERVAL = "10min"
# Whether saves are written in the background unless told (checkpoint_async=None): they keep every promise of a
# synchronous save (tests/test_run_tracker.py, test_checkpoint_async.py, test_checkpoint_kill_points.py with it on)
# and stall the training 0.2 of one (benchmarks/README.md, Checkpoints)
ASYNC_DEFAULT = True
_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(s|min|h)")
_EVERY = (
    "a number of updates (checkpoint_every=500), a wall-clock interval ('90s', '30min', '2h'), both "
    "((500, '30min'): whichever comes first), or 'epoch' (epoch ends only)"
)


def seconds_of(value: str) -> float | None:
    """The seconds a duration such as ``"90s"``, ``"30min"``, ``"1.5h"`` means, or None if it is none."""
    match = _DURATION.fullmatch(value)
    seconds = None if match is None else float(match[1]) * _UNITS[match[2]]
    return seconds if seconds is None or math.isfinite(seconds) else None  # 400 nines: no interval, never a save


def _every(value: Any) -> tuple[int | None, float | None]:
    """checkpoint_every checked: (a number of updates or None, a wall-clock interval in seconds or None)."""
    if isinstance(value, tuple) and len(value) == 2:
        counts = [v for v in value if not isinstance(v, str)]
        texts = [v for v in value if isinstance(v, str)]
        if len(counts) == 1 and len(texts) == 1 and texts[0] != "epoch" and counts[0] is not None:
            return _every(counts[0])[0], _every(texts[0])[1]
    elif isinstance(value, str):
        seconds = seconds_of(value)
        if value == "epoch" or (seconds is not None and seconds > 0):
            return None, seconds
        raise ValueError(f"{RUN}: checkpoint_every must be {_EVERY}, got {show(value)}; units are s, min and h")
    elif value is None or not isinstance(value, (tuple, list)):
        return _optional_int(value, "checkpoint_every"), None
    raise TypeError(f"{RUN}: checkpoint_every must be {_EVERY}, got {show(value)}")


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """Where and how often ct.run saves (checkpoint_dir None: never), how many saves it keeps, and whether it writes
    them in the background. ``checkpoint_every``: updates (int), a wall-clock interval (``"30min"``), both as a
    tuple (``(500, "30min")``: each applies), or ``"epoch"``; resolved to ``DEFAULT_INTERVAL`` for a run with a
    checkpoint_dir and none given. ``checkpoint_async`` resolved to ``ASYNC_DEFAULT`` when None."""

    checkpoint_dir: str | os.PathLike[str] | None = None
    checkpoint_every: int | str | tuple[Any, ...] | None = None
    keep_checkpoints: int = 2
    checkpoint_async: bool | None = None

    def __post_init__(self) -> None:
        every = _every(self.checkpoint_every)[0]  # and its interval, checked
        keep = check_int(self.keep_checkpoints, RUN, "keep_checkpoints", example="keep_checkpoints=10")
        folder = self.checkpoint_dir
        if folder is not None and (not isinstance(folder, (str, os.PathLike)) or os.fspath(folder) in ("", b"")):
            # bytes reach pathlib's bare TypeError; "" would save in the working folder and log nowhere
            raise (TypeError if not isinstance(folder, (str, os.PathLike)) else ValueError)(
                f"{RUN}: checkpoint_dir must be a non-empty str or os.PathLike, got {show(folder)}; "
                "e.g. checkpoint_dir='runs/a', or None for no checkpoints"
            )
        if folder is not None:
            _no_nul(folder, "checkpoint_dir")
        check_flag(self.checkpoint_async, "checkpoint_async", optional=True)
        for name in ("checkpoint_every", "checkpoint_async"):
            if getattr(self, name) is not None and self.checkpoint_dir is None:
                raise ValueError(
                    f"{RUN}: {name}={getattr(self, name)!r} but no checkpoint_dir to save in; give "
                    f"checkpoint_dir, or leave {name} out"
                )
        given = self.checkpoint_every
        if isinstance(given, tuple):  # a NumPy count as an int: the options keep plain types
            given = tuple(v if isinstance(v, str) else every for v in given)
        elif every is not None:
            given = every
        elif given is None and folder is not None:
            given = DEFAULT_INTERVAL
        on = ASYNC_DEFAULT if self.checkpoint_async is None and folder is not None else self.checkpoint_async
        _set(self, checkpoint_every=given, keep_checkpoints=keep, checkpoint_async=on)

    @property
    def every_updates(self) -> int | None:
        """Save every this many updates (None: by no count)."""
        return _every(self.checkpoint_every)[0]

    @property
    def every_seconds(self) -> float | None:
        """Save once this many seconds passed since the last save began, by rank 0's clock (None: by no clock)."""
        return _every(self.checkpoint_every)[1]


@dataclasses.dataclass(frozen=True)
class LogOptions:
    """How often ct.run reads the metrics, and where they go: the resolved metrics file and
    TensorBoard folder (None: none), whether rank 0 shows a progress bar, and the function that
    receives each record on rank 0 (``on_record``, None: none)."""

    log_every: int = 50
    log_file: Path | None = None
    tensorboard: Path | None = None
    progress: bool = True
    on_record: Callable[[dict[str, Any]], Any] | None = None

    def __post_init__(self) -> None:
        every = check_int(self.log_every, RUN, "log_every", example="log_every=10")
        check_flag(self.progress, "progress")
        if self.on_record is not None and (not callable(self.on_record) or isinstance(self.on_record, type)):
            raise TypeError(
                f"{RUN}: on_record must be a function on_record(record) (called with each log and evaluation "
                f"record), got {show(self.on_record)}; e.g. on_record=lambda r: wandb.log(..., step=r['step'])"
            )
        deferred = None if self.on_record is None else deferred_kind(self.on_record)
        if deferred is not None:
            raise TypeError(
                f"{RUN}: on_record must be a plain function on_record(record), got {show(self.on_record)}, which "
                f"returns {deferred} when called and runs none of its body: no record would reach the tracker; "
                "log in a plain def (e.g. lambda r: wandb.log(r, step=r['step'])), or drive an async client from it"
            )
        for name in ("log_file", "tensorboard"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), Path):
                raise TypeError(f"{RUN}: LogOptions.{name} is a resolved Path or None, got {show(getattr(self, name))}")
        _set(self, log_every=every)

    @classmethod
    def from_run_args(
        cls,
        *,
        log_every: Any,
        log_file: Any,
        tensorboard: Any,
        progress: Any,
        checkpoint_dir: Any,
        on_record: Any = None,
    ) -> LogOptions:
        """The metrics file (default ``checkpoint_dir/metrics.jsonl``) and the TensorBoard folder resolved."""
        path = _log_path(log_file)
        # checked by CheckpointOptions; object storage holds no metrics file (log_file gives one)
        local = checkpoint_dir is not None and not is_remote(checkpoint_dir)
        folder = Path(local_path(checkpoint_dir)).expanduser() if local else None
        if path is not None and folder is not None and _within(folder, path):
            raise ValueError(
                f"{RUN}: log_file={str(path)!r} is checkpoint_dir or a folder above it, {str(folder)!r}: it cannot "
                "be both a file and a folder; e.g. log_file='runs/a/metrics.jsonl' (the default), or leave it out"
            )
        if path is None and folder is not None:
            path = folder / "metrics.jsonl"
        board = _tensorboard_dir(tensorboard, path)
        if board is not None and path is not None and _within(board, path):
            raise ValueError(
                f"{RUN}: tensorboard={str(board)!r} is the metrics file {str(path)!r} or inside it: it cannot be "
                "both a file and a folder; e.g. tensorboard=True (a tensorboard/ folder beside the metrics file)"
            )
        return cls(log_every, path, board, progress, on_record)


def _tensorboard_dir(tensorboard: Any, log_path: Path | None) -> Path | None:
    """Where TensorBoard's event files go, checked before anything runs (None: no TensorBoard)."""
    if tensorboard is False:
        return None
    if not isinstance(tensorboard, (bool, str, os.PathLike)):
        raise TypeError(f"{RUN}: tensorboard must be True, False or a folder, got {show(tensorboard)}")
    if tensorboard is True and log_path is None:
        raise ValueError(
            f"{RUN}: tensorboard=True writes beside the metrics file, but there is none: give checkpoint_dir "
            "or log_file, or a folder: tensorboard='runs/tb'"
        )
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"{RUN}: tensorboard={tensorboard!r} needs the tensorboard package: pip install tensorboard"
        ) from e
    if isinstance(tensorboard, bool):
        assert log_path is not None  # for the type checker: refused above
        return log_path.parent / "tensorboard"
    _no_nul(tensorboard, "tensorboard")
    if not os.fspath(tensorboard):
        raise ValueError(
            f"{RUN}: tensorboard={tensorboard!r} names no folder (it would write into the working directory); "
            "give a folder: tensorboard='runs/tb', or tensorboard=True to write beside the metrics file"
        )
    folder = Path(tensorboard).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"{RUN}: tensorboard={str(folder)!r} is a file, not a folder; give a folder for its event files: "
            "tensorboard='runs/tb', or tensorboard=True to write beside the metrics file"
        )
    inside = _file_above(folder)
    if inside is not None:  # found now, not after the checkpoint folder and the metrics file are made
        raise ValueError(
            f"{RUN}: tensorboard={str(folder)!r} is inside {str(inside)!r}, a file, not a folder; give a folder "
            "for its event files: tensorboard='runs/tb', or tensorboard=True to write beside the metrics file"
        )
    return folder


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """What ct.run evaluates with and on, how often (eval_every None: at each epoch's end), and which of its
    metrics a scheduler steps on (``scheduler_metric``, ``driver/epoch_ends.py``); ``enabled`` is False without
    an eval_step."""

    eval_step: Callable[..., Any] | None = None
    eval_data: Any = None
    eval_every: int | None = None
    scheduler_metric: str | None = None

    def __post_init__(self) -> None:
        every = _optional_int(self.eval_every, "eval_every")
        if parse_metric(self.scheduler_metric) is not None:
            named = f"scheduler_metric={self.scheduler_metric!r}"
            if self.eval_step is None:
                raise ValueError(
                    f"{RUN}: {named} but no eval_step to evaluate with; give eval_step and eval_data: the scheduler "
                    "steps with the metric after each epoch's evaluation"
                )
            if every is not None:
                raise ValueError(
                    f"{RUN}: {named} with eval_every={self.eval_every}: the scheduler steps once per epoch, with the "
                    "evaluation at the epoch's end; leave eval_every out (an evaluation at each epoch's end)"
                )
        if self.eval_step is not None and not callable(self.eval_step):
            raise TypeError(
                f"{RUN}: eval_step must be a function, got {show(self.eval_step)}; "
                "e.g. eval_step=lambda model, batch: {'acc': ...}"
            )
        if isinstance(self.eval_step, TrainStep):  # found now, not when the first evaluation calls it
            raise TypeError(
                f"{RUN}: eval_step must be a function eval_step(model, batch) -> {{name: mean}}, got the TrainStep "
                f"{self.eval_step!r}, which trains (an optimizer update per call); give the plain function "
                "(torch.compile(fn) compiles it)"
            )
        if self.eval_data is not None and not isinstance(self.eval_data, DataLoader):
            _not_tensors(self.eval_data, "eval_data")
            if isinstance(self.eval_data, IterableDataset) or not isinstance(self.eval_data, Sized):
                kind = (
                    "an IterableDataset, without a length"
                    if isinstance(self.eval_data, IterableDataset)
                    else ("without a length")
                )
                raise TypeError(
                    f"{RUN}: eval_data is a {type(self.eval_data).__name__} ({kind}), which ct.run cannot batch and "
                    "split among processes; give a map-style Dataset, or a DataLoader that reads this process's "
                    "share: eval_data=DataLoader(eval_data, batch_size=...)"
                )
        if every is not None and self.eval_step is None:
            raise ValueError(
                f"{RUN}: eval_every={self.eval_every} but no eval_step to evaluate with; give eval_step and "
                "eval_data, or leave eval_every out"
            )
        if (self.eval_step is None) != (self.eval_data is None):
            given, missing = ("eval_step", "eval_data") if self.eval_data is None else ("eval_data", "eval_step")
            raise ValueError(
                f"{RUN}: {given}={show(getattr(self, given))} but {missing}=None; give eval_step and eval_data "
                "together, or neither"
            )
        _set(self, eval_every=every)

    @property
    def enabled(self) -> bool:
        return self.eval_step is not None

    @classmethod
    def from_run_args(
        cls, data: Any, *, eval_step: Any, eval_data: Any, eval_every: Any, scheduler_metric: Any = None
    ) -> EvalOptions:
        """Also refused: a Dataset for eval_data where the training DataLoader gives no batch size to batch it by."""
        options = cls(eval_step, eval_data, eval_every, scheduler_metric)
        check_eval_data(eval_data, data)
        return options


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """Which updates ``torch.profiler`` records (``ct.run(profile=...)``): after ``wait`` updates of the call it
    starts, warms up over ``warmup`` updates, records ``active`` ones and writes their trace into ``folder``; that
    ``repeat`` times. ``record_shapes``, ``profile_memory`` and ``with_stack`` are the profiler's own."""

    wait: int = 5
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    folder: Path | None = None

    def __post_init__(self) -> None:
        example = "profile={'wait': 5, 'warmup': 1, 'active': 3, 'repeat': 1}"
        for name, least in (("wait", 0), ("warmup", 0), ("active", 1), ("repeat", 1)):
            _set(
                self, **{name: check_int(getattr(self, name), RUN, f"profile's {name}", minimum=least, example=example)}
            )
        for name in ("record_shapes", "profile_memory", "with_stack"):
            check_flag(getattr(self, name), f"profile's {name}")
        if self.folder is not None and not isinstance(self.folder, Path):
            raise TypeError(f"{RUN}: ProfileOptions.folder is a resolved Path or None, got {show(self.folder)}")

    @classmethod
    def from_run_arg(cls, profile: Any, run_folder: Path | None, log_file: Path | None = None) -> ProfileOptions | None:
        """``profile``: False (no profiler), True (the default window), or a dict of the fields (``folder``: where the
        traces go, default ``profile/`` in the run's folder: checkpoint_dir, else the metrics file's)."""
        if profile is False:
            return None
        if torch_profiler._is_profiler_enabled:  # torch runs one at a time: the window's would cancel the user's
            raise RuntimeError(
                f"{RUN}: profile={show(profile)} starts torch.profiler over its window, but a profiler is recording "
                "already (torch runs one at a time: the user's trace would be cancelled); leave profile out inside "
                "your own torch.profiler.profile(), or call ct.run outside it"
            )
        if profile is True:
            profile = {}
        if not isinstance(profile, Mapping):
            raise TypeError(
                f"{RUN}: profile must be True, False or a dict of the window, got {show(profile)}; e.g. profile=True, "
                "or profile={'wait': 5, 'warmup': 1, 'active': 3, 'repeat': 1}"
            )
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in profile if k not in fields)
        if unknown:
            raise ValueError(f"{RUN}: profile has no setting {unknown[0]!r}; its settings are {fields}")
        given = dict(profile)
        folder = given.pop("folder", None)
        window = cls(**given)  # the window's values checked first, then where it writes
        if folder is None:
            if run_folder is None:
                raise ValueError(
                    f"{RUN}: profile writes its traces into the run's folder, but there is none: give checkpoint_dir "
                    "or log_file, or a folder: profile={'folder': 'runs/a/profile'}"
                )
            folder = run_folder / "profile"
        else:
            if not isinstance(folder, (str, os.PathLike)) or not os.fspath(folder):
                raise TypeError(
                    f"{RUN}: profile's folder must name a folder, got {show(folder)}; e.g. 'runs/a/profile'"
                )
            _no_nul(folder, "profile's folder")
            folder = Path(folder).expanduser()
        # torch.profiler makes the folder only when a window's trace is written, updates into the run
        inside = _file_above(folder)
        problem = (
            "it is the metrics file"
            if log_file is not None and _within(folder, log_file)
            else "a file is there"
            if folder.exists() and not folder.is_dir()
            else f"it would be inside {str(inside)!r}, a file, not a folder"
            if inside is not None
            else None
        )
        if problem is not None:
            raise PermissionError(
                f"{RUN}: profile's folder {str(folder)!r} cannot be made ({problem}); choose a folder for the traces, "
                "e.g. profile={'folder': 'runs/a/profile'}"
            )
        return dataclasses.replace(window, folder=folder)


@dataclasses.dataclass(frozen=True)
class WatchOptions:
    """What ct.run measures beyond the loss: the profiler window (None: none), the peak FLOP/s that MFU divides by
    (a number, a precision to look up for the GPU, or None: no MFU), the ratio that names a straggler, and
    whether an out-of-memory error on CUDA leaves a memory snapshot in ``folder`` (the run's folder)."""

    profile: ProfileOptions | None = None
    peak_flops: float | str | None = None
    straggler_threshold: float = 1.2
    oom_snapshot: bool = False
    folder: Path | None = None

    def __post_init__(self) -> None:
        peak = self.peak_flops
        if isinstance(peak, str):
            if peak not in PRECISIONS:
                raise ValueError(
                    f"{RUN}: peak_flops must be a number (FLOP/s of one device) or one of {list(PRECISIONS)} (looked "
                    f"up for this GPU), got {show(peak)}; e.g. peak_flops='bf16'"
                )
        elif peak is not None:
            _set(self, peak_flops=check_real(peak, RUN, "peak_flops", example="peak_flops=312e12, or 'bf16'"))
        threshold = check_real(self.straggler_threshold, RUN, "straggler_threshold", example="straggler_threshold=1.2")
        if not threshold > 1:
            raise ValueError(
                f"{RUN}: straggler_threshold must be above 1 (how many times slower than the others' median a rank "
                f"must be to be named), got {show(self.straggler_threshold)}; e.g. straggler_threshold=1.2"
            )
        _set(self, straggler_threshold=threshold)
        check_flag(self.oom_snapshot, "oom_snapshot")
        if self.oom_snapshot and self.folder is None:  # the snapshot would be lost without a word
            raise ValueError(
                f"{RUN}: oom_snapshot writes its snapshot into the run's folder, but there is none: give "
                "checkpoint_dir (a local folder) or log_file"
            )
        if self.profile is not None and not isinstance(self.profile, ProfileOptions):
            raise TypeError(f"{RUN}: WatchOptions.profile is a ProfileOptions or None, got {show(self.profile)}")

    @classmethod
    def from_run_args(
        cls,
        *,
        profile: Any,
        peak_flops: Any,
        straggler_threshold: Any,
        oom_snapshot: Any,
        run_folder: Path | None,
        log_file: Path | None = None,
    ) -> WatchOptions:
        return cls(
            ProfileOptions.from_run_arg(profile, run_folder, log_file),
            peak_flops,
            straggler_threshold,
            oom_snapshot,
            run_folder,
        )


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """All of ct.run's options: how long it runs (epochs None: as many as max_steps needs), what it
    does on pre-emption, how long it waits for other processes, what it calls at each epoch's start and end,
    and the four parts' own."""

    epochs: int | None
    max_steps: int | None
    requeue: bool
    timeout: float
    loader: LoaderOptions
    checkpoint: CheckpointOptions
    log: LogOptions
    eval: EvalOptions
    watch: WatchOptions = WatchOptions()
    on_epoch_start: Callable[[Any, int], Any] | None = None
    on_epoch_end: Callable[[Any, int], Any] | None = None

    def __post_init__(self) -> None:
        _set(self, epochs=_optional_int(self.epochs, "epochs"), max_steps=_optional_int(self.max_steps, "max_steps"))
        check_hook(self.on_epoch_start, "on_epoch_start")
        check_hook(self.on_epoch_end, "on_epoch_end")
        check_flag(self.requeue, "requeue")
        _set(self, timeout=check_real(self.timeout, RUN, "timeout", example="timeout=300 (seconds)"))
        loader = self.loader
        if loader.stream_resume is not None and self.checkpoint.checkpoint_dir is None:
            raise ValueError(
                f"{RUN}: stream_resume={loader.stream_resume!r} but no checkpoint_dir: a run that saves nothing never "
                "resumes; give checkpoint_dir, or leave stream_resume out"
            )
        if loader.stream and self.checkpoint.checkpoint_dir is not None and loader.stream_resume != "replay":
            problem = resume_problem(loader.data)
            if problem is not None:
                raise TypeError(
                    f"{RUN}: checkpoint_dir is given, but {problem}. (Without checkpoint_dir a run of it never "
                    "resumes, and needs neither.)"
                )
        data = loader.data
        if (
            loader.stream
            and isinstance(data, DataLoader)
            and data.num_workers
            and data.persistent_workers
            and callable(getattr(data.dataset, "set_epoch", None))
            and (self.total_epochs or 1) > 1
        ):
            raise ValueError(
                f"{RUN}: epochs={self.total_epochs} over a {type(data).__name__} with persistent_workers=True: its "
                "workers keep the copies of the stream they started with, which never see the set_epoch(epoch) "
                "ct.run calls before each pass (on the dataset in this process), so the passes after the first "
                "read a spent stream (or the first pass again); give the loader persistent_workers=False (its "
                "workers start each pass from the dataset as set_epoch left it), or epochs=1"
            )

    @property
    def total_epochs(self) -> int | None:
        """The epochs to run: 1 by default, None when ``max_steps`` alone decides; a stream's passes: ``epochs``,
        else one (``max_steps`` then ends the run earlier, or the stream does)."""
        if self.loader.stream:
            return self.epochs or 1
        return self.epochs if self.epochs is not None else 1 if self.max_steps is None else None

    @classmethod
    def from_run_args(cls, data: Any, **args: Any) -> RunOptions:
        """Every option of ``ct.run(train_step, state, data, **args)`` checked, before anything is set up."""
        a = args
        for name in ("epochs", "max_steps"):  # first, as the loop is what a reader reads first
            _optional_int(a[name], name)
        checkpoint = CheckpointOptions(
            a["checkpoint_dir"], a["checkpoint_every"], a["keep_checkpoints"], a.get("checkpoint_async")
        )
        log = LogOptions.from_run_args(
            log_every=a["log_every"],
            log_file=a["log_file"],
            tensorboard=a["tensorboard"],
            progress=a["progress"],
            checkpoint_dir=a["checkpoint_dir"],
            on_record=a.get("on_record"),
        )
        evaluation = EvalOptions.from_run_args(
            data,
            eval_step=a["eval_step"],
            eval_data=a["eval_data"],
            eval_every=a["eval_every"],
            scheduler_metric=a.get("scheduler_metric"),
        )
        loader = LoaderOptions.from_run_args(
            data,
            batch_size=a["batch_size"],
            shuffle=a["shuffle"],
            drop_last=a["drop_last"],
            num_workers=a["num_workers"],
            collate_fn=a["collate_fn"],
            seed=a["seed"],
            global_batch_size=a.get("global_batch_size"),
            stream_resume=a.get("stream_resume"),
        )
        # the local folder the traces and snapshots go to: checkpoint_dir's (a file:// URL's path; object storage is
        # none), else the metrics file's
        directory = a["checkpoint_dir"]
        local = directory is not None and not is_remote(directory)
        run_folder = Path(local_path(directory)).expanduser() if local else None
        if run_folder is None and log.log_file is not None:
            run_folder = log.log_file.parent
        watch = WatchOptions.from_run_args(
            profile=a.get("profile", False),
            peak_flops=a.get("peak_flops"),
            straggler_threshold=a.get("straggler_threshold", 1.2),
            oom_snapshot=a.get("oom_snapshot", False),
            run_folder=run_folder,
            log_file=log.log_file,
        )
        return cls(
            a["epochs"],
            a["max_steps"],
            a["requeue"],
            a["timeout"],
            loader,
            checkpoint,
            log,
            evaluation,
            watch=watch,
            on_epoch_start=a.get("on_epoch_start"),
            on_epoch_end=a.get("on_epoch_end"),
        )

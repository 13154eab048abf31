"""ct.run's streams: an ``IterableDataset``, or a DataLoader over one (torchdata's ``StatefulDataLoader``), read in
passes of batches, its state checkpointed per rank by torchdata's ``Stateful`` protocol.

What ct.run does with a stream, in order:

- it tells the dataset its place once, before anything is read: ``set_rank(rank, world_size)`` when the dataset has
  it (the process group is up by then too, so ``torch.distributed.get_rank()`` works inside ``__iter__``); splitting
  the stream over the ranks, and over loader workers (``torch.utils.data.get_worker_info()``), is the dataset's;
- before each pass (epoch) it calls ``set_epoch(epoch)`` when the dataset has it, then ``iter()``;
- it reads one batch per update: ``batch_size`` items collated (``collate_fn``, default ``default_collate``) in this
  process (``num_workers=0``), or a ``StatefulDataLoader``'s batch (``num_workers > 0``, or one given); nothing is
  read ahead, so the state taken after an update holds exactly the batches trained on;
- every rank says whether it got a batch (one small all-reduce per update on several processes): at the first
  update some rank's stream has none, the pass ends on every rank (the others' batch of that update is dropped),
  and a stream that raises on one rank (reading an item, or in ``set_rank``, ``set_epoch`` or ``iter()``) raises on
  every rank;
- a save keeps ``state_dict()`` (the dataset's, or the loader's, which holds its workers' datasets'), checked to
  hold tensors and plain types only; a resume hands it to ``load_state_dict`` before the next ``iter()`` (inside a
  pass after that pass's ``set_epoch``, at a pass's end before the next one's). Read in this process, ct.run also
  records that it saw the stream end inside the last, short batch; read by torchdata's workers, a stream must be
  spent at its end (an ``iter()`` from that state yields nothing: a restored worker is asked for one more batch)
  and begin its next pass in ``set_epoch``. Workers start after ``set_epoch`` (before the first update only the
  dataset's own state is checked, so that none start earlier); those of the loader ct.run builds draw their base
  seed per pass from (seed, rank, epoch), exact at a pass's start: inside a pass their own generators' draws are
  not restored, only the stream's state.

Where a stream keeps no state, ``stream_resume="replay"`` resumes it by reading the pass from its start again and
dropping the batches already trained on. A dataset whose class says ``state_is_global = True`` keeps the whole
job's position (the same ``state_dict()`` on every rank), which resumes on any number of processes.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from composetrain.checkpoint.format import STREAM_STATES, unplain
from composetrain.core.rng import capture_rng, derive_seed, restore_rng
from composetrain.core.util import RUN, show
from composetrain.launch.rendezvous import Process

__all__ = [
    "MODES",
    "Stream",
    "build_stream",
    "has_state",
    "is_stream",
    "resume_problem",
    "state_digest",
    "state_problem",
]

MODES = ("state", "replay")  # stream_resume: the stream's own state (the default), or reading the pass again


def is_stream(data: Any) -> bool:
    """Whether ``data`` is read as a stream: an IterableDataset, or a DataLoader over one."""
    return isinstance(data, IterableDataset) or (
        isinstance(data, DataLoader) and isinstance(data.dataset, IterableDataset)
    )


def has_state(obj: Any) -> bool:
    """Whether ``obj`` keeps state by torchdata's ``Stateful`` protocol: ``state_dict()`` and ``load_state_dict()``."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def resume_problem(data: Any) -> str | None:
    """Why a stream's state cannot resume it (a checkpoint would have nothing to continue from), or None."""
    replay = (
        "or stream_resume='replay': a resume then reads the pass from its start again and drops the batches already "
        "trained on (exact only for a stream that yields the same batches every time it is read, and as slow as "
        "reading them)"
    )
    protocol = (
        "state_dict() (where the stream stands after the items it yielded: tensors and plain types) and "
        "load_state_dict(state) (the next iter() continues from there)"
    )
    if isinstance(data, DataLoader):
        if not has_state(data):
            return (
                f"the {type(data).__name__} given has no state_dict(), so a checkpoint could not say where its stream "
                f"stands; give torchdata's StatefulDataLoader over a dataset with {protocol}, or the dataset itself "
                f"(ct.run batches it), {replay}"
            )
        if getattr(data, "in_order", True) is False and data.num_workers > 1:
            return (
                f"the {type(data).__name__} given has in_order=False, so its batches come in the order its workers "
                "finish them and its state cannot say which of them were trained on (torchdata gives no guarantee "
                "for it); give it in_order=True (the default)"
            )
        if not has_state(data.dataset):
            return (
                f"the {type(data).__name__}'s dataset {type(data.dataset).__name__} has no state_dict() and "
                "load_state_dict(), so the loader's state would only count batches (a resume would re-read them "
                f"all); give it {protocol}, {replay}"
            )
        return None
    if not has_state(data):
        name = type(data).__name__
        return f"the stream {name} has no state_dict() and load_state_dict(); give it {protocol}, {replay}"
    return None


def build_stream(
    data: Any,
    *,
    batch_size: int | None,
    drop_last: bool,
    collate_fn: Callable[[list[Any]], Any] | None,
    num_workers: int | str,
    resume: str | None,
    proc: Process,
    seed: int,
) -> Stream:
    """``data``'s stream for this process (``num_workers="auto"``: read here; a DataLoader: as given)."""
    auto = isinstance(num_workers, str) and not isinstance(data, DataLoader)
    choice = (
        'num_workers="auto" chose 0 for a stream: how a stream splits among loader workers is the dataset\'s '
        "(get_worker_info), which changes what each worker yields, so ct.run never starts workers by timing; give "
        "num_workers=N to read it with N workers"
        if auto
        else None
    )
    return Stream(
        data,
        batch_size=batch_size,
        drop_last=drop_last,
        collate_fn=collate_fn,
        num_workers=0 if isinstance(num_workers, str) else num_workers,
        mode=resume or "state",
        rank=proc.rank,
        world_size=proc.world_size,
        seed=seed,
        pin_memory=proc.device.type == "cuda",
        choice=choice,
    )


class Stream:
    """One rank's stream: its batches pass by pass, its state, and what ct.run tells its dataset.

    Args:
        data: an IterableDataset, or a DataLoader over one (used as given).
        batch_size, drop_last, collate_fn: how ct.run batches a dataset (a DataLoader batches by its own).
        num_workers: 0: ct.run reads the dataset's items in this process, its state the dataset's own; more: a
            ``StatefulDataLoader`` with that many workers (torchdata), its state the loader's.
        mode: ``stream_resume``: "state" or "replay".
        rank, world_size, seed, pin_memory: this process in its job; the loader's generator is drawn from the seed.
        choice: what num_workers="auto" chose, and why (None: an int was given).
    """

    def __init__(
        self,
        data: Any,
        *,
        batch_size: int | None,
        drop_last: bool,
        collate_fn: Callable[[list[Any]], Any] | None,
        num_workers: int,
        mode: str,
        rank: int,
        world_size: int,
        seed: int,
        pin_memory: bool,
        choice: str | None = None,
    ) -> None:
        self.mode, self.choice = mode, choice
        self.seed, self.rank, self.epoch = seed, rank, 0
        self.opened = False  # a pass was opened, or a state loaded: a loader's state_dict() starts no workers now
        self.loader: DataLoader[Any] | None = None  # None: ct.run reads the dataset's items itself
        self.dataset: Any
        if isinstance(data, DataLoader):
            self.loader, self.dataset = data, data.dataset
        else:
            self.dataset = data
            if num_workers:
                seed = derive_seed(seed, "loader", rank=rank)
                self.loader = _stateful_loader(data, batch_size, drop_last, collate_fn, num_workers, pin_memory, seed)
        self.built = self.loader is not None and self.loader is not data  # its workers end with the run
        self.batch_size = self.loader.batch_size if self.loader is not None else batch_size
        self.num_workers = self.loader.num_workers if self.loader is not None else 0
        self.drop_last, self.collate_fn = drop_last, collate_fn or default_collate
        self.ended = False  # ct.run's reader saw the stream end in this pass (while reading its last, short batch)
        # global: the state is the whole job's (the same on every rank), read from the dataset itself
        self.global_state = mode == "state" and self.loader is None and getattr(data, "state_is_global", False) is True
        if callable(getattr(self.dataset, "set_rank", None)):
            self.dataset.set_rank(rank, world_size)

    @property
    def source(self) -> Any:
        """What keeps the state: the loader (its workers' datasets' states inside), or the dataset."""
        return self.loader if self.loader is not None else self.dataset

    def set_epoch(self, epoch: int) -> None:
        """A new pass is about to begin (``set_epoch`` of the dataset, where it has one)."""
        self.ended, self.epoch = False, epoch
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def iterate(self) -> Iterator[Any]:
        """The batches of the pass, from where the stream stands (none when it was seen to end)."""
        self.opened = True
        loader = self.loader
        if loader is None:
            return iter(()) if self.ended else self._read(iter(self.dataset))
        if self.built:  # the workers' base seed of this pass, whichever process reads it
            assert loader.generator is not None  # for the type checker: ct.run built it with one
            loader.generator.manual_seed(derive_seed(self.seed, "stream pass", rank=self.rank, epoch=self.epoch))
        return _untouched(lambda: iter(loader))

    def _read(self, items: Iterator[Any]) -> Iterator[Any]:
        """``batch_size`` items at a time, collated; the pass's last, short batch unless ``drop_last``. A stream
        that ends while a batch is read is ``ended`` after it: its state may already be the next pass's (a stream
        that starts over at its end), so a resume must not read it again in this pass."""
        assert self.batch_size is not None  # for the type checker: a dataset is batched by ct.run's batch_size
        while True:
            batch = list(itertools.islice(items, self.batch_size))
            self.ended = len(batch) < self.batch_size
            if not batch or (self.ended and self.drop_last):
                return
            yield self.collate_fn(batch)
            if self.ended:
                return

    def state_dict(self) -> Any:
        """The stream's own state: its dataset's, or its loader's (which holds its workers' datasets')."""
        if self.loader is None:
            return self.dataset.state_dict()
        return _untouched(self.source.state_dict)  # before the first iter(), it makes the iterator

    def state_to_check(self) -> Any:
        """The state checked before the first update: ``state_dict()``; but a loader's before its first pass is its
        dataset's (what each worker's state holds), since its own would start its workers there, before
        ``set_epoch`` of that pass, and the pass would read their copies of the stream as they were."""
        if self.loader is not None and not self.opened and has_state(self.dataset):
            return self.dataset.state_dict()
        return self.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.source.load_state_dict(state)
        self.opened = True  # a loader's state_dict() gives the state loaded, starting nothing

    def record(self, state: dict[str, Any]) -> dict[str, Any]:
        """What a checkpoint keeps of this rank's stream: its ``state`` and whether ct.run saw it end in this pass."""
        return {"state": state, "ended": self.ended}

    def restore(self, record: dict[str, Any]) -> None:
        self.load_state_dict(record["state"])
        self.ended = record["ended"]

    def close(self) -> None:
        """Stop the workers of a loader ct.run built (a given one is yours)."""
        iterator = getattr(self.loader, "_iterator", None) if self.built else None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


def _untouched(make: Callable[[], Any]) -> Any:
    """``make()`` with the process's random states put back after it: a DataLoader's new iterator draws its workers'
    base seed from the global generator (one given without ``generator=``), which a resumed run makes at another
    update than the uninterrupted run did; the dropout masks after it would differ."""
    states = capture_rng()
    try:
        return make()
    finally:
        restore_rng(states)


def _stateful_loader(
    data: Any,
    batch_size: int | None,
    drop_last: bool,
    collate_fn: Callable[[list[Any]], Any] | None,
    workers: int,
    pin_memory: bool,
    seed: int,
) -> DataLoader[Any]:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as e:
        raise ImportError(
            f"{RUN}: num_workers={workers} for a stream needs torchdata's StatefulDataLoader, whose state holds its "
            "workers' streams: pip install torchdata (or composetrain[streams]); or read the stream in this process "
            "with num_workers=0"
        ) from e
    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in newer torch
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return StatefulDataLoader(
            data,
            batch_size=batch_size,
            drop_last=drop_last,
            collate_fn=collate_fn,
            num_workers=workers,
            pin_memory=pin_memory,
            generator=torch.Generator().manual_seed(seed),  # never the global one: resume stays exact
        )


def state_digest(state: Any) -> str:
    """A digest of a stream state as a checkpoint writes it (tensors by their bytes)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return hashlib.blake2b(buffer.getvalue(), digest_size=16).hexdigest()


def state_problem(state: Any, where: str) -> str | None:
    """Why a stream's ``state_dict()`` cannot go into a checkpoint (loaded with weights_only=True), or None."""
    if type(state) not in STREAM_STATES:  # what a checkpoint's loader accepts (checkpoint/format.py)
        return f"{where} returned {show(state)}, not a dict"
    return unplain(state, where)

"""A stream's passes read by every rank together (internal, for ct.run): the agreement before each update on
whether every rank has a batch (``pass_batches``), the first batch compared across ranks, a pass opened where a run
stands (``open_pass``: new, resumed from its state, or replayed), and its state saved (``stream_record``) and
restored (``restore_stream``) with every rank raising the same error together, never one waiting for the others.
"""

from __future__ import annotations

import hashlib
import itertools
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from composetrain.core.batching import leaves, to_device
from composetrain.core.util import RUN
from composetrain.driver.streams import Stream, state_digest, state_problem
from composetrain.launch.agree import all_true, any_true, gathered, largest
from composetrain.launch.rendezvous import Process

__all__ = ["agree_on", "agreed_stream", "open_pass", "pass_batches", "restore_stream", "stream_record"]

_BATCH, _END, _ERROR = 0, 1, 2  # what a rank says before each update; the largest wins


def open_pass(
    stream: Stream, epoch: int, position: int, proc: Process, *, first: bool, waiting: Any
) -> Iterator[tuple[int, Any, float]]:
    """The pass ``epoch`` from batch ``position`` on: a new one after ``set_epoch``; one resumed from its state
    (``restore_stream``); or, under ``stream_resume="replay"``, the pass read again from its start and the batches
    already trained on dropped. ``first``: the first batch this process reads in this run (compared across ranks)."""
    replay = stream.mode == "replay" and position > 0
    read = position
    try:  # the stream's set_epoch and iter() may raise too (an __iter__ that opens its shards): on every rank alike
        if position == 0 or replay:
            stream.set_epoch(epoch)
        batches = stream.iterate()
        if replay:
            warnings.warn(
                f"{RUN}: resuming the stream {type(stream.dataset).__name__} by replay (stream_resume='replay'): "
                f"reading pass {epoch + 1} again from its start and dropping its first {position} batches, already "
                "trained on",
                stacklevel=4,
            )
            read = sum(1 for _ in itertools.islice(batches, position))
    except Exception as e:
        batches = _raising(e)  # raised by pass_batches at its first batch, where every rank learns of it
    if replay:
        problem = agree_on(None if read == position else f"rank {proc.rank}'s stream gave {read} batches", proc)
        if problem is not None:
            raise ValueError(
                f"{RUN}: cannot replay the stream {type(stream.dataset).__name__}: {problem} of the {position} its "
                f"pass {epoch + 1} had given before the checkpoint, so it does not yield the same batches again; give "
                "it state_dict() and load_state_dict() (stream_resume='state')"
            )
    return pass_batches(batches, position, proc.device, proc, check_shards=first, waiting=waiting)


def agreed_stream(build: Callable[[], Stream], proc: Process) -> Stream:
    """``build()``, the stream of this rank (which calls its dataset's ``set_rank``), on every rank or on none: a rank
    whose stream fails raises its own error, the others a RuntimeError naming it, rather than each waiting at the
    next collective for a rank that left."""
    stream, error = None, None
    try:
        stream = build()
    except Exception as e:
        error = e
    problem = agree_on(None if error is None else f"rank {proc.rank}: {type(error).__name__}: {error}", proc)
    if error is not None:
        raise error
    if problem is not None:
        raise RuntimeError(
            f"{RUN}: setting up the stream failed on {problem}; every rank stops with it, before anything is read"
        )
    assert stream is not None  # for the type checker: built where nothing failed
    return stream


def _raising(error: Exception) -> Iterator[Any]:
    raise error
    yield  # a generator: raises at its first next()


def restore_stream(
    stream: Stream, record: dict[str, Any] | None, epoch: int, position: int, proc: Process, path: Path
) -> None:
    """The stream's state as checkpoint ``path`` saved it (``record``: this rank's, or the whole job's), loaded where
    the uninterrupted run stood: inside a pass after its ``set_epoch``, at a pass's end before the next one's. A
    stream resumed by replay loads nothing: its pass is read again (``open_pass``)."""
    if stream.mode == "replay":
        return
    problem = None
    if record is None:
        problem = "it holds no state of the stream (saved by a run that did not keep it)"
    else:
        try:
            if position:
                stream.set_epoch(epoch)
            stream.restore(record)
        except Exception as e:
            problem = f"its load_state_dict() raised {type(e).__name__}: {e}"
    if problem is not None and proc.world_size > 1:
        problem = f"on rank {proc.rank}, {problem}"
    problem = agree_on(problem, proc)
    if problem is not None:
        raise ValueError(
            f"{RUN}: cannot resume the stream {type(stream.dataset).__name__} from checkpoint {path}: {problem}; "
            "nothing was trained or changed: make its load_state_dict take what its state_dict() returns, or point "
            "checkpoint_dir elsewhere to start afresh"
        )


def stream_record(
    stream: Stream, proc: Process, step: int, *, inside: bool | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What a checkpoint keeps of the stream, checked on every rank: this rank's record, and the whole job's (a
    state that is the same on every rank; compared so ``inside`` a pass: at a pass's end the ranks that had one more
    batch have read it) or None. ``inside`` None: before the first update, only checked."""
    state: Any = None
    try:
        state = stream.state_dict() if inside is not None else stream.state_to_check()
        problem = state_problem(state, "the stream's state_dict()")
    except Exception as e:
        problem = f"the stream's state_dict() raised {type(e).__name__}: {e}"
    if problem is not None and proc.world_size > 1:
        problem = f"on rank {proc.rank}, {problem}"
    problem = agree_on(problem, proc)
    when = "to checkpoint it" if inside is None else f"at step {step}"
    if problem is not None:
        raise TypeError(
            f"{RUN}: cannot save the stream {type(stream.dataset).__name__}'s state {when}: {problem}; a checkpoint "
            "holds tensors and plain types only (dict, list, tuple, str, int, float, bool, None), loaded with "
            "torch.load(weights_only=True), which runs no code: return only those from its state_dict() (a NumPy "
            "array as a tensor or a list, a generator's state as its get_state()); nothing was saved"
        )
    if not stream.global_state:
        return stream.record(state), None
    if inside and (everyone := proc.differing(state_digest(state))) is not None:
        raise ValueError(
            f"{RUN}: the stream {type(stream.dataset).__name__} says state_is_global = True, but its state_dict() "
            f"differs between ranks at step {step} (digests {everyone}): a global state is the whole job's "
            "position, the same on every rank; keep each rank's own position out of it, or drop state_is_global "
            "(the run then resumes on the same number of processes only)"
        )
    # the job's, which another world size reads anew: the pass is over once any rank saw its stream end (a rank that
    # read a short batch has nothing for the next update), and a stream that starts over by itself is then already
    # in the next pass
    return stream.record(state), {"state": state, "ended": any_true(stream.ended) if inside else False}


def pass_batches(
    batches: Iterator[Any], start: int, device: torch.device, proc: Process, *, check_shards: bool, waiting: Any
) -> Iterator[tuple[int, Any, float]]:
    """A pass's batches, agreed by every rank: (batches of the pass done with this one, batch on ``device``, wait).

    Before each update every rank says whether it has a batch: the pass ends on every rank at the first update some
    rank has none, and a stream that raised on one rank raises on every rank (its own error there, naming it on the
    others). ``check_shards``: the first batch is compared across ranks, and two ranks reading the same one are
    refused before it is trained on."""
    position = start
    while True:
        tick = time.perf_counter()
        status, batch, error = _BATCH, None, None
        try:
            batch = next(batches)
        except StopIteration:
            status = _END
        except Exception as e:  # the stream's own error: raised on this rank, named on the others
            status, error = _ERROR, e
        waiting.now(f"the agreement on the batches of update {position + 1} of the pass")
        agreed = int(largest([float(status)])[0]) if proc.world_size > 1 else status
        if agreed == _ERROR:
            if error is not None:
                gathered(f"{type(error).__name__}: {error}")
                raise error
            told = gathered(None)
            rank, what = next((r, w) for r, w in enumerate(told) if w is not None)
            raise RuntimeError(
                f"{RUN}: the stream raised on rank {rank} while reading the batch of update {position + 1} of its "
                f"pass ({what}); every rank stops with it, and the last checkpoint is left as it was"
            )
        if agreed == _END:
            return
        if check_shards:
            _refuse_shared_shards(batch, proc)
            check_shards = False
        position += 1
        yield position, to_device(batch, device), time.perf_counter() - tick


def _digest(batch: Any) -> str:
    """A digest of a batch's tensors (dtype, shape, bytes) and of its other values' reprs."""
    h = hashlib.blake2b(digest_size=16)
    for t in leaves(batch):
        t = t.detach().cpu().contiguous()
        h.update(repr((t.dtype, tuple(t.shape))).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    if not leaves(batch):
        h.update(repr(batch).encode())
    return h.hexdigest()


def _refuse_shared_shards(batch: Any, proc: Process) -> None:
    """Two ranks whose first batch is the same read the same share of the stream: refused on every rank."""
    if proc.world_size == 1:
        return
    digests = gathered(_digest(batch))
    same = [r for r, d in enumerate(digests) if digests.count(d) > 1]
    if same:
        raise ValueError(
            f"{RUN}: ranks {', '.join(map(str, same))} read the same first batch: the stream is not split among the "
            f"{proc.world_size} processes, which would train on the same data; split it by rank in the dataset "
            "(ct.run calls its set_rank(rank, world_size) before reading; torch.distributed.get_rank() works in "
            "__iter__ too), e.g. keep item i where i % world_size == rank"
        )


def agree_on(problem: str | None, proc: Process) -> str | None:
    """Any rank's problem, on every rank (the first by rank), or None."""
    if all_true(problem is None):
        return None
    return next(p for p in gathered(problem) if p is not None)  # every rank gathers, also the one that knows

"""Saves off the training path (internal to ``checkpoint/``): the state staged at an update boundary, written by
one thread while training goes on, and the I/O steps of a save, numbered, where a test can stop a process.

``stage`` copies a checkpoint's payload off the live tensors: every tensor into new host memory (pinned, and
copied without blocking, from a GPU: ``Staged.ready`` waits for those copies), every container rebuilt, so that
the updates that follow change nothing the writer reads (torchtitan #930: a save that returned before its copy
was done let the next update race it). The copy holds as many bytes as the storages it copies (what a synchronous
``torch.save`` writes): while a save is in flight the state's host memory is doubled (a GPU's state: the copy is its
size in pinned host memory), and it is freed once written.

``Writer`` runs one save's writes in a thread of its own; at most one is in flight (``Checkpoints`` waits for
the previous before it stages the next). Its outcome, the files' checksums or the exception that stopped it, is
read at an update boundary by the thread that trains.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["KILL_AT", "LOG", "Staged", "Writer", "io_step", "stage"]

KILL_AT = "CT_CHECKPOINT_KILL_AT"  # tests: SIGKILL this process at its k-th I/O step of a save
LOG = "CT_CHECKPOINT_IO_LOG"  # tests: append "k name [thread]" for each I/O step to this file
_count = itertools.count(1)
_lock = threading.Lock()


def io_step(what: str) -> None:
    """Mark the start of one I/O step of a save (a file opened, written, synced, renamed, removed): how tests
    enumerate every point where a process can die mid-save. Costs an environment lookup when no test asks."""
    kill_at, log = os.environ.get(KILL_AT), os.environ.get(LOG)
    if kill_at is None and log is None:
        return
    with _lock:
        k = next(_count)
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{k} {what} [{threading.current_thread().name}]\n")
                f.flush()
                os.fsync(f.fileno())
        if kill_at is not None and k == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)


class Staged:
    """A payload copied off the live tensors; ``ready()`` returns once its device-to-host copies are done."""

    def __init__(self, value: Any, event: Any) -> None:
        self.value, self._event = value, event

    def ready(self) -> Any:
        if self._event is not None:
            self._event.synchronize()  # the copies enqueued on the GPU's stream, done
            self._event = None
        return self.value


def stage(value: Any) -> Staged:
    """``value`` (tensors and plain types, as a checkpoint holds) with every tensor's storage copied into new host
    memory and every container rebuilt, so that ``torch.save`` writes the copy byte for byte as it writes ``value``
    (on the CPU): tensors that share a storage (tied weights, views) share the copy's, each storage copied once,
    and a tensor that appears twice appears twice as one object. A set is rebuilt from its elements: equal, but
    its iteration order (so its bytes in the file) is the one Python gives the new set. From a GPU the storages go
    into pinned memory without blocking; the ``Staged`` waits for them before it is read.
    """
    memo: dict[int, torch.Tensor] = {}  # id of a tensor of ``value`` (alive as long as it): its copy
    storages: dict[int, torch.UntypedStorage] = {}  # a storage's identity, as torch.save keys it: its copy
    cuda = False

    def copy_storage(t: torch.Tensor) -> torch.UntypedStorage:
        nonlocal cuda
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in storages:
            if t.device.type == "cuda":
                pinned = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=True).untyped_storage()
                storages[key] = pinned.copy_(storage, non_blocking=True)
                cuda = True
            else:
                storages[key] = storage.clone()
        return storages[key]

    def copy(t: torch.Tensor) -> torch.Tensor:
        if id(t) in memo:
            return memo[id(t)]
        plain = type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and not t.is_quantized
        if plain and not (t.is_conj() or t.is_neg()) and t.device.type in ("cpu", "cuda"):
            out = torch.empty(0, dtype=t.dtype).set_(copy_storage(t), t.storage_offset(), t.size(), t.stride())
            if isinstance(t, torch.nn.Parameter):
                out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
            elif t.requires_grad and t.is_leaf:
                out.requires_grad_(True)
        else:  # another layout, a subclass, another accelerator: a blocking copy of its own
            out = t.detach().to("cpu", copy=True)
        memo[id(t)] = out
        return out

    def walk(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return copy(v)
        if type(v) in (dict, OrderedDict):
            out = type(v)((k, walk(x)) for k, x in v.items())
            for name, attribute in getattr(v, "__dict__", {}).items():  # a state_dict's _metadata (versions)
                setattr(out, name, walk(attribute))
            return out
        if type(v) in (list, tuple, set):
            return type(v)(walk(x) for x in v)
        return v  # plain values (str, int, float, bool, None, dtype, device, Size) never change in place

    copied = walk(value)
    event = None
    if cuda:
        event = torch.cuda.Event()
        event.record()  # after every copy enqueued on the current stream
    return Staged(copied, event)


NICER = 10  # how much less CPU time a writer thread gets than the training's, where the cores are all busy


def yield_cpu() -> None:
    """Lower this thread's CPU priority (Linux schedules each thread on its own): a save written in the background
    takes the cores the training leaves idle, and slows it little where there are none (a CPU-only machine)."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: as it is
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + NICER))


class Writer:
    """One save's writes in a thread of their own. ``start(work)`` runs ``work()``; ``busy``, ``wait()`` and
    ``outcome()`` (its value or the exception it raised) tell how it went. The thread is a daemon: a process that
    ends (an error elsewhere, a lost rank) is not held by a write that cannot finish."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._value: Any = None
        self._error: BaseException | None = None

    def start(self, work: Callable[[], Any], name: str) -> None:
        if self.busy:
            raise RuntimeError("checkpoint writer: a save is already in flight")  # Checkpoints waits first
        self._value, self._error = None, None

        def target() -> None:
            yield_cpu()
            try:
                self._value = work()
            except BaseException as e:  # reported at the next update boundary, on the thread that trains
                self._error = e

        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the write in flight; whether it is over (False: still running after ``timeout`` seconds)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.busy

    def outcome(self) -> tuple[Any, BaseException | None]:
        """(what the write returned, None) or (None, the exception that stopped it); call once it is over."""
        return self._value, self._error

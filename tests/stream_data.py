"""Streams for the stream tests: IterableDatasets that keep their place by torchdata's Stateful protocol
(``state_dict()`` / ``load_state_dict()``), split by rank (``set_rank``) and by loader worker (``get_worker_info``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info


def _place() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class Counting(IterableDataset):
    """Items ``i = 0, 1, ...`` (``length`` of them, or without end), each ``(x, y)`` drawn from a generator seeded
    by (seed, epoch, i); rank r of W keeps the items ``i % W == r`` and its worker w of K those of its share at
    ``(i // W) % K == w``. State: the next item and the epoch. Spent at its end (an iter() then gives nothing: a
    torchdata worker restored there is asked for one more batch), it starts over when told a new epoch."""

    def __init__(self, length: int | None = 30, seed: int = 0, features: int = 6) -> None:
        self.length, self.seed, self.features = length, seed, features
        self.rank, self.world = 0, 1
        self.next, self.epoch = 0, 0
        self.epochs_set: list[int] = []  # what ct.run told it, in order (this process's copy)

    def set_rank(self, rank: int, world_size: int) -> None:
        self.rank, self.world = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.next = 0
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next, self.epoch = state["next"], state["epoch"]

    def item(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + i)
        x = torch.randn(self.features, generator=g, dtype=torch.float64)
        return x, (x[0] > 0).long()

    def mine(self, i: int) -> bool:
        worker, workers = _place()
        return i % self.world == self.rank and (i // self.world) % workers == worker

    def __iter__(self) -> Any:
        while self.length is None or self.next < self.length:
            i = self.next
            self.next += 1  # before the yield: the state after it says where the next item comes from
            if self.mine(i):
                yield self.item(i)


class Restarting(Counting):
    """A Counting stream that starts over by itself at its end (not in set_epoch): read in this process, ct.run
    resumes it exactly too (the next pass's iter() follows the state loaded at the pass's end)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __iter__(self) -> Any:
        yield from super().__iter__()
        self.next = 0


class Drawing(Counting):
    """Items drawn one after the other from a generator the stream holds; its state holds the generator's state (a
    tensor) and the count read. Not split by worker (read with num_workers=0)."""

    def __init__(self, length: int | None = 30, seed: int = 0, features: int = 6) -> None:
        super().__init__(length, seed, features)
        self.g = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next, "epoch": self.epoch, "g": self.g.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.g.set_state(state["g"])

    def item(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.features, generator=self.g, dtype=torch.float64) + i
        return x, (x[0] > i).long()


class Stateless(IterableDataset):
    """The items of a Counting stream, without state_dict: the same batches every time it is read."""

    def __init__(self, length: int | None = 30, seed: int = 0) -> None:
        self.inner = Counting(length, seed)

    def set_rank(self, rank: int, world_size: int) -> None:
        self.inner.set_rank(rank, world_size)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Any:
        self.inner.next = 0
        return iter(self.inner)


class NumpyState(Counting):
    """A state_dict holding a NumPy array: no checkpoint loaded with weights_only=True could hold it."""

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next, "epoch": self.epoch, "seen": np.arange(3)}


class Failing(Counting):
    """Raises while reading item ``at`` (an OSError, as a lost network shard would)."""

    def __init__(self, length: int | None = 30, at: int = 10, **kwargs: Any) -> None:
        super().__init__(length, **kwargs)
        self.at = at

    def item(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.at:
            raise OSError(f"shard lost at item {i}")
        return super().item(i)


class BadLoad(Counting):
    """A load_state_dict that raises (a state of another version of the stream)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise KeyError("offset")


class Global(Counting):
    """A stream whose state is the whole job's: ``next`` counts the items the job has read in all (each update
    reads batch_size items on every rank), the same on every rank. Rank r of W reads items next + r, stepping by W."""

    state_is_global = True

    def __iter__(self) -> Any:
        while self.length is None or self.next + self.rank < self.length:
            i = self.next + self.rank
            self.next += self.world
            yield self.item(i)


class Unsplit(Counting):
    """Ignores its rank: every rank reads every item (the mistake ct.run refuses)."""

    def set_rank(self, rank: int, world_size: int) -> None:
        pass


class Unreachable(Counting):
    """Fails on rank 1 outside its items: in ``set_rank``, in ``set_epoch`` of its second pass, or in ``__iter__``
    (not a generator: it opens its shards before it returns the iterator), as a lost bucket would."""

    def __init__(self, length: int | None = 30, where: str = "iter", **kwargs: Any) -> None:
        super().__init__(length, **kwargs)
        self.where = where

    def fail(self, where: str, rank: int) -> None:
        if where == self.where and rank == 1:
            raise OSError(f"bucket unreachable in {where}")

    def set_rank(self, rank: int, world_size: int) -> None:
        self.fail("set_rank", rank)
        super().set_rank(rank, world_size)

    def set_epoch(self, epoch: int) -> None:
        if epoch == 1:
            self.fail("set_epoch", self.rank)
        super().set_epoch(epoch)

    def __iter__(self) -> Any:
        self.fail("iter", self.rank)
        return super().__iter__()


class EpochSeeded(Counting):
    """Items of pass ``e`` shifted by ``1000 * (e + 1)``, a shift only ``set_epoch`` sets (as a stream that seeds its
    shard order there): a copy of it that was never told its pass raises instead of reading."""

    def __init__(self, length: int | None = 30, **kwargs: Any) -> None:
        super().__init__(length, **kwargs)
        self.shift: int | None = None

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.shift = 1000 * (epoch + 1)

    def item(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shift is None:
            raise RuntimeError("this copy of the stream was never told its pass (set_epoch)")
        x, y = super().item(i)
        return x + self.shift, y


class WorkerRandom(Counting):
    """Items with noise drawn from the global torch generator of the process reading them (a loader worker's)."""

    def item(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().item(i)
        return x + torch.rand(self.features, dtype=torch.float64), y


class GlobalRestarting(Global):
    """A Global stream that starts over by itself at its end (not in set_epoch): its state after the pass's last,
    short batch is already the next pass's."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __iter__(self) -> Any:
        yield from super().__iter__()
        self.next = 0

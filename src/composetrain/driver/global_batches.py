"""A run defined by its global batch (``ct.run(..., global_batch_size=G)``): which samples form each update, the
same on any number of processes, and which of them each process reads.

Epoch e's order is a permutation of the N samples drawn from a generator seeded with ``derive_seed(seed, "order",
epoch=e)`` (the order ``DistributedSampler`` draws; ``0..N-1`` without shuffle), the same on every process and for
every number of them. Update k of the epoch takes the samples at ``k*G`` to ``(k+1)*G`` of it; the last, short
update (the ``N mod G`` left) is kept, or dropped with ``drop_last``: no sample padded, none repeated. Of each
update, rank r of W reads a contiguous slice, the first ``size mod W`` ranks one sample more (W divides G, so only
the short update is uneven). A checkpoint's position, the updates done in the epoch, thus names the same samples on
any W, and a run resumes on any W that divides G. Which process reads a sample never changes which samples form an
update, nor does how many loader workers read them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from composetrain.core.rng import derive_seed

__all__ = ["GlobalBatches", "global_problem", "share", "world_sizes"]


def share(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """The slice ``[start, end)`` of an update of ``size`` samples that ``rank`` of ``world_size`` reads: contiguous,
    near-equal, the first ``size % world_size`` ranks one more.

    Example:
        >>> [share(4, r, 3) for r in range(3)]
        [(0, 2), (2, 3), (3, 4)]
    """
    base, extra = divmod(size, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def world_sizes(*sizes: int, at_most: int | None = None, limit: int = 1024) -> list[int]:
    """The numbers of processes (up to ``limit``, and ``at_most``) that divide every one of ``sizes``."""
    top = min(limit, min(sizes), at_most if at_most is not None else limit)
    return [w for w in range(1, top + 1) if all(s % w == 0 for s in sizes)]


def _listed(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes[:16])) + (", ..." if len(sizes) > 16 else "")


def global_problem(samples: int, global_batch_size: int, world_size: int, drop_last: bool, equal: bool) -> str | None:
    """Why ``world_size`` processes cannot run updates of ``global_batch_size`` samples over ``samples`` samples, or
    None; ``equal``: every process must read as many samples in each update (a forward that gathers from every
    rank). Found before anything is trained or saved."""
    g, w, n = global_batch_size, world_size, samples
    if g % w:
        fits = world_sizes(g)
        return (
            f"global_batch_size={g} cannot be shared evenly among {w} processes ({g} / {w} is not whole); run it "
            f"on a number of processes that divides {g} ({_listed(fits)}), or choose a global_batch_size that {w} "
            f"divides (e.g. {max(w, g // w * w)} or {(g // w + 1) * w})"
        )
    if drop_last and n < g:
        return (
            f"global_batch_size={g} needs {g} samples per update, but the dataset has {n} and drop_last=True would "
            "leave no update; lower global_batch_size or set drop_last=False"
        )
    short = 0 if drop_last else n % g
    if 0 < short < w:
        fits = world_sizes(g, at_most=short)
        return (
            f"the dataset's {n} samples make {n // g} update(s) of global_batch_size={g} and a last, short one of "
            f"{short} sample(s), too few for {w} processes (each needs one at least); set drop_last=True (that "
            f"update is dropped), or run on fewer processes: {_listed(fits)}"
        )
    if equal and short % w:
        fits = world_sizes(g, short)
        return (
            f"every process must read as many samples in each update here (each forward gathers from every rank: "
            f"ct.sharded), but the dataset's last, short update of {short} samples ({n} samples, "
            f"global_batch_size={g}) cannot be shared evenly among {w} processes; set drop_last=True (that update is "
            f"dropped), or run on a number of processes that divides both {g} and {short} ({_listed(fits)})"
        )
    return None


class GlobalBatches(Sampler[list[int]]):
    """This rank's share of each update of an epoch, as a batch sampler (a list of sample indices per update).

    Like ``ResumableSampler`` it starts part-way through an epoch: ``start`` counts the samples of the epoch this
    rank has read, a whole number of updates of ``global_batch_size / world_size`` samples each (a run stops
    between updates, and only an epoch's last update is short).

    Args:
        samples: the dataset's length.
        global_batch_size: samples per update, all ranks together (a multiple of ``world_size``: ``global_problem``).
        shuffle, seed, drop_last: as ``ct.run``'s.
        rank, world_size: this process in the job.
    """

    def __init__(
        self,
        samples: int,
        global_batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        rank: int,
        world_size: int,
    ) -> None:
        self.samples, self.global_batch_size = samples, global_batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.start = 0  # samples of this epoch already read, on this rank

    @property
    def per_rank(self) -> int:
        """Samples a rank reads in each full update."""
        return self.global_batch_size // self.world_size

    @property
    def updates_per_epoch(self) -> int:
        """Updates in an epoch, the same on every rank and for any number of ranks."""
        full, short = divmod(self.samples, self.global_batch_size)
        return full + (short > 0 and not self.drop_last)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s permutation of the samples (every rank draws the same)."""
        if not self.shuffle:
            return list(range(self.samples))
        g = torch.Generator()
        g.manual_seed(derive_seed(self.seed, "order", epoch=epoch))
        return torch.randperm(self.samples, generator=g).tolist()

    def update(self, k: int, order: list[int]) -> list[int]:
        """The samples of the epoch's update ``k`` (all ranks together), from the epoch's ``order``."""
        return order[k * self.global_batch_size : (k + 1) * self.global_batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch)
        for k in range(self.start // self.per_rank, self.updates_per_epoch):
            indices = self.update(k, order)
            start, end = share(len(indices), self.rank, self.world_size)
            yield indices[start:end]

    def __len__(self) -> int:
        return self.updates_per_epoch - self.start // self.per_rank

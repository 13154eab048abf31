"""Agreement between the processes of a group: the one owner of every decision the ranks must take alike.

A check that can fail on one rank only goes through here, so that every rank learns the same answer in
one small collective and raises the same error together, instead of one raising while the others wait
in a collective. Each function takes the process group (``None``: the default one) and puts its tensors
on the device the group's backend takes (the current GPU for nccl, the CPU otherwise). Alone (no process
group, or a group of one) each answers from this process's own value, communicating nothing.

- ``differing(value)``: every rank's ``value`` when they differ, else None (a digest all-reduce first);
- ``fewest(count)``, ``largest(values)``: the smallest count, the elementwise largest values;
- ``all_true(flag)``, ``any_true(flag)``: whether a flag holds on every rank, on any rank;
- ``from_rank0(value)``, ``from_rank(value, index)``: the group's first (or index-th) rank's value, on every rank;
- ``gathered(value)``: every rank's value, by rank.
- ``from_rank0(value)``: rank 0's value, on every rank;
- ``gathered(value)``: every rank's value, by rank;
- ``gathered_numbers(values)``: every rank's few numbers, by rank, in one small tensor collective (no pickling).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "all_true",
    "any_true",
    "collective_device",
    "differing",
    "fewest",
    "from_rank",
    "from_rank0",
    "gathered",
    "gathered_numbers",
    "largest",
    "world",
]


def world(group: Any = None) -> int:
    """The number of processes in ``group``; 1 without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def collective_device(group: Any = None) -> torch.device:
    """Where ``group``'s collectives take their tensors: the current GPU under nccl, else the CPU."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def differing(value: Any, group: Any = None) -> list[Any] | None:
    """Every rank's ``value`` (by rank) when they differ, else None; on every rank.

    One tiny all-reduce compares 7-byte digests of ``repr(value)`` (the largest and minus the smallest:
    equal only when every rank's is the same); the values themselves are gathered only when they
    differ. ``value`` must pickle and have a deterministic repr.

    Example:
        >>> everyone = differing(sorted(step.roles))
        >>> if everyone is not None:
        ...     raise ValueError(f"the ranks built different steps: {everyone}")
    """
    if world(group) == 1:
        return None
    digest = int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=7).digest(), "big")
    bounds = torch.tensor([digest, -digest], dtype=torch.int64, device=collective_device(group))
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=group)  # the largest digest and minus the smallest
    largest_, minus_smallest = bounds.tolist()
    if largest_ == -minus_smallest:
        return None
    return gathered(value, group)


def fewest(count: int, group: Any = None) -> int:
    """The smallest ``count`` over the ranks (one all-reduce).

    Uneven data must not hang DDP (PyTorch issue 38174): truncate each epoch to this many updates and
    every rank runs the same number of them.
    """
    if world(group) == 1:
        return count
    value = torch.tensor(count, dtype=torch.int64, device=collective_device(group))
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)
    return int(value.item())


def largest(values: list[float], group: Any = None) -> list[float]:
    """The elementwise maximum of ``values`` over the ranks, in float64: one small all-reduce
    (``Context.agree``: whether any rank refused the update, and why)."""
    if world(group) == 1:
        return [float(v) for v in values]
    reduced = torch.tensor(values, dtype=torch.float64, device=collective_device(group))
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)
    return [float(v) for v in reduced.tolist()]


def all_true(flag: bool, group: Any = None) -> bool:
    """Whether ``flag`` holds on every rank (one all-reduce)."""
    if world(group) == 1:
        return bool(flag)
    value = torch.tensor([int(bool(flag))], device=collective_device(group))
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)
    return bool(value.item())


def any_true(flag: bool, group: Any = None) -> bool:
    """Whether ``flag`` holds on any rank (one all-reduce)."""
    if world(group) == 1:
        return bool(flag)
    value = torch.tensor([int(bool(flag))], device=collective_device(group))
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


def from_rank0(value: Any, group: Any = None) -> Any:
    """Rank 0's ``value`` (the group's first rank), on every rank: what rank 0 alone could look at."""
    return from_rank(value, 0, group)


def from_rank(value: Any, index: int, group: Any = None) -> Any:
    """The ``value`` of the group's ``index``-th rank, on every rank (what only that rank computed: a pipeline's
    loss, on its last stage)."""
    if world(group) == 1:
        return value
    box = [value]
    source = index if group is None else dist.get_global_rank(group, index)
    dist.broadcast_object_list(box, src=source, group=group, device=collective_device(group))
    return box[0]


def gathered(value: Any, group: Any = None) -> list[Any]:
    """Every rank's ``value``, by rank, on every rank."""
    if world(group) == 1:
        return [value]
    values: list[Any] = [None] * world(group)
    dist.all_gather_object(values, value, group=group)
    return values


def gathered_numbers(values: list[float], group: Any = None) -> list[list[float]]:
    """Every rank's ``values`` (the same count on every rank), by rank, in float64: one all-gather of one small
    tensor, nothing pickled (``gathered`` pickles objects).

    ``ct.run`` gathers each rank's timings at its log points in one call, to name a rank the others wait for;
    ``ct.skip_spikes`` gathers the ranks' losses, so that every rank judges the same global loss.

    Example:
        >>> times = gathered_numbers([update_s, data_wait_s])   # [[rank 0's two], [rank 1's two], ...]
    """
    if world(group) == 1:
        return [[float(v) for v in values]]
    mine = torch.tensor(values, dtype=torch.float64, device=collective_device(group))
    every = torch.empty(world(group) * len(values), dtype=torch.float64, device=mine.device)
    dist.all_gather_single(every, mine, group=group)
    return every.view(world(group), len(values)).tolist()

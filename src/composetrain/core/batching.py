"""Split nested batches along their leading (batch) dimension, and count their units.

A batch is any nesting of tensors, tuples (named or not), lists, mappings and
dataclasses. Tensors with at least one dimension are split; 0-dim tensors and
non-tensor leaves (strings, numbers, None, ...) are passed unchanged to every
piece. Pieces are views (``torch.tensor_split``): splitting copies no data.

A batch's *units* are what its mean loss averages over: samples by default
(``samples``), or what a ``weight`` function counts (tokens, ...).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from composetrain.core.util import check_int, show

__all__ = [
    "check_weights",
    "concat_batches",
    "leading_size",
    "leaves",
    "map_tensors",
    "samples",
    "split_batch",
    "split_weighted",
    "to_device",
    "warn_if_batchnorm",
]

_Rebuild = Callable[[Iterator[Any]], Any]


class Weighing(Protocol):
    """What ``split_weighted`` reads of a step's ``Context`` (protocol.py, which builds on this module):
    the composition's unit counter, and the units of the batch being split."""

    @property
    def weight(self) -> Callable[[Any], Any] | None: ...

    @property
    def piece_weight(self) -> float | torch.Tensor: ...


def _flatten(obj: Any, leaves: list[torch.Tensor]) -> _Rebuild:
    """Append obj's tensor leaves to ``leaves``; return a function that rebuilds
    obj from an iterator over replacement leaves (in the same order)."""
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return next
    if isinstance(obj, (tuple, list)):
        rebuilds = [_flatten(item, leaves) for item in obj]
        kind = type(obj)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
            return lambda it: kind(*[r(it) for r in rebuilds])
        return lambda it: kind([r(it) for r in rebuilds])
    if isinstance(obj, Mapping):
        keys = list(obj)
        rebuilds = [_flatten(obj[k], leaves) for k in keys]

        def rebuild_mapping(it: Iterator[Any]) -> Any:
            values = [r(it) for r in rebuilds]
            if isinstance(obj, MutableMapping):
                # copy.copy keeps the mapping's own type (OrderedDict, defaultdict's
                # factory, UserDict subclasses such as tokenizer outputs).
                out = copy.copy(obj)
                for k, v in zip(keys, values, strict=True):
                    out[k] = v
                return out
            return dict(zip(keys, values, strict=True))

        return rebuild_mapping
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = [f.name for f in dataclasses.fields(obj) if f.init]
        rebuilds = [_flatten(getattr(obj, name), leaves) for name in names]
        return lambda it: dataclasses.replace(obj, **{n: r(it) for n, r in zip(names, rebuilds, strict=True)})
    return lambda it: obj


def _paths(obj: Any, prefix: str = "batch") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor leaf, in _flatten's order; used for error messages."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from _paths(item, f"{prefix}[{i}]")
    elif isinstance(obj, Mapping):
        for k in obj:
            yield from _paths(obj[k], f"{prefix}[{k!r}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            if f.init:
                yield from _paths(getattr(obj, f.name), f"{prefix}.{f.name}")


def _leading(leaves: list[torch.Tensor], batch: Any, who: object) -> int | None:
    sizes = {t.shape[0] for t in leaves if t.dim() > 0}
    if len(sizes) > 1:
        listing = ", ".join(f"{p} has {t.shape[0]}" for p, t in _paths(batch) if t.dim() > 0)
        raise ValueError(
            f"{who}: the batch's tensors disagree on the leading (batch) size: {listing}; "
            "every tensor with a batch dimension must have the same first size"
        )
    return sizes.pop() if sizes else None


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """The batch with ``fn`` applied to every tensor leaf, structure kept.

    Example:
        >>> map_tensors({"x": torch.zeros(2), "name": "a"}, lambda t: t + 1)
        {'x': tensor([1., 1.]), 'name': 'a'}
    """
    leaves: list[torch.Tensor] = []
    rebuild = _flatten(batch, leaves)
    return rebuild(iter([fn(t) for t in leaves]))


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a nested batch to ``device`` (those already there stay as they are),
    without blocking when its memory is pinned; non-tensor leaves pass through."""
    return map_tensors(batch, lambda t: t if t.device == device else t.to(device, non_blocking=True))


def leaves(batch: Any) -> list[torch.Tensor]:
    """The batch's tensors, in a fixed order (the one ``map_tensors`` and ``split_batch`` use)."""
    found: list[torch.Tensor] = []
    _flatten(batch, found)
    return found


def leading_size(batch: Any, who: object = "leading_size") -> int | None:
    """The shared first dimension of the batch's tensors, or None if it has none.

    Args:
        batch: a nested batch (tensors in tuples, lists, mappings, dataclasses).
        who: the name used in error messages.

    Returns:
        The leading size, or None when no tensor in the batch has a dimension.

    Raises:
        ValueError: the tensors disagree on their leading size.

    Example:
        >>> leading_size({"x": torch.zeros(8, 3), "y": torch.zeros(8)})
        8
    """
    leaves: list[torch.Tensor] = []
    _flatten(batch, leaves)
    return _leading(leaves, batch, who)


def split_batch(batch: Any, n: int, who: object = "split_batch") -> list[Any]:
    """Split a nested batch into ``min(n, size)`` pieces of near-equal size.

    Sizes follow ``torch.tensor_split``: a batch of 10 in 4 pieces gives 3, 3, 2, 2.
    No piece is ever empty.

    Args:
        batch: a nested batch whose tensors share a leading size.
        n: the largest number of pieces wanted (positive).
        who: the name used in error messages.

    Returns:
        A list of batches with the same structure as ``batch``.

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n`` is not positive, the batch is empty, holds no tensor with
            a batch dimension, or its tensors disagree on the leading size.

    Example:
        >>> [b[0].shape[0] for b in split_batch((torch.zeros(10, 2), "tag"), 4)]
        [3, 3, 2, 2]
    """
    n = check_int(n, str(who), "n", example="split_batch(batch, 4)")
    return _split(batch, n, who, "pieces")[0]


def _split(batch: Any, n: int, who: object, plural: str, by_size: bool = False) -> tuple[list[Any], list[int]]:
    """split_batch's pieces and their sizes; ``plural`` names the pieces in messages. With ``by_size``, ``n``
    is the pieces' size: consecutive pieces of ``n`` samples, the last one short."""
    leaves: list[torch.Tensor] = []
    rebuild = _flatten(batch, leaves)
    size = _leading(leaves, batch, who)
    if size is None and by_size:  # one sample, as ``samples`` counts it: nothing to cut
        return [batch], [1]
    if size is None:
        raise ValueError(
            f"{who}: cannot split the batch into {n} {plural}: it holds no tensor with a batch dimension "
            f"(got {show(batch)}); give the per-sample data a leading batch dimension, or do not split it"
        )
    if size == 0:
        raise ValueError(f"{who}: the batch is empty (leading size 0); skip empty batches before the step")
    k = -(-size // n) if by_size else min(n, size)  # by size: the ceiling of size / n
    if k == 1:
        return [batch], [size]
    if by_size:  # as a loop over slices cuts them: 10 by 4 gives 4, 4, 2
        pieces = [t.split(n) if t.dim() > 0 else (t,) * k for t in leaves]
        sizes = [min(n, size - i * n) for i in range(k)]
        return [rebuild(iter([p[i] for p in pieces])) for i in range(k)], sizes
    pieces = [t.tensor_split(k) if t.dim() > 0 else (t,) * k for t in leaves]
    return [rebuild(iter([p[i] for p in pieces])) for i in range(k)], [size // k + (i < size % k) for i in range(k)]


def split_weighted(
    batch: Any, n: int, ctx: Weighing, who: object, what: str, *, by_size: bool = False
) -> tuple[list[Any], list[float]]:
    """Split a batch into at most ``n`` pieces and count each one's units: the one owner of
    splitting and weighting for the transforms that split (accumulate, data_parallel).

    With ``by_size``, ``n`` is the size of the pieces, not their number (``accumulate(micro_batch=n)``):
    consecutive pieces of ``n`` samples, the last one short (10 by 4: 4, 4, 2); a batch of at most ``n``
    samples, or without a batch dimension (one sample), stays whole.

    Units are the pieces' sizes for samples (``ctx.weight`` is None), else what
    ``ctx.weight`` counts; each piece's mean loss is scaled by them, so they must add
    up to the whole batch's, ``ctx.piece_weight``, or the update would be mis-scaled.
    A batch that stays whole (``n == 1``, one sample) passes through as the plain
    step takes it, unchecked and unweighed. ``what`` names a piece in messages.

    Returns:
        The pieces (as ``split_batch``) and their units, all checked before any forward.

    Raises:
        ValueError: the batch cannot be split, or the units are not positive, finite
            and adding up. TypeError: ``ctx.weight`` did not return a number.
    """
    whole = float(ctx.piece_weight)
    if n == 1 and not by_size:
        return [batch], [whole]
    plural = f"{what}es" if what.endswith("ch") else f"{what}s"  # micro-batches, shards
    pieces, sizes = _split(batch, n, who, plural, by_size)
    if len(pieces) == 1:
        return pieces, [whole]
    if ctx.weight is None:
        weights = [float(s) for s in sizes]
    else:
        weights = check_weights([ctx.weight(p) for p in pieces], who, what)
    if abs(sum(weights) - whole) > 1e-6 * whole:
        raise ValueError(
            f"{who}: weight gave {sum(weights)} units over the {plural} {weights} but {whole} for the whole "
            "batch; weight must count units (samples, tokens) so that the counts add up over a split"
        )
    return pieces, weights


def concat_batches(pieces: list[Any], device: torch.device | None = None) -> Any:
    """Undo ``split_batch``: concatenate the pieces' tensors along dim 0 (on ``device``, if given).

    Non-tensor leaves and 0-dim tensors are taken from the first piece.

    Raises:
        ValueError: the pieces do not share one structure.

    Example:
        >>> concat_batches(split_batch((torch.arange(5), "tag"), 2))
        (tensor([0, 1, 2, 3, 4]), 'tag')
    """
    columns: list[list[torch.Tensor]] = []
    rebuild: _Rebuild | None = None
    for piece in pieces:
        leaves: list[torch.Tensor] = []
        shape = _flatten(piece, leaves)
        rebuild = rebuild or shape
        if columns and len(leaves) != len(columns):
            raise ValueError(
                f"concat_batches: the pieces hold {len(columns)} and {len(leaves)} tensors; "
                "give pieces of one structure"
            )
        columns = columns or [[] for _ in leaves]
        for column, leaf in zip(columns, leaves, strict=True):
            column.append(leaf if device is None else leaf.to(device))
    assert rebuild is not None, "concat_batches: no pieces"
    return rebuild(iter([c[0] if c[0].dim() == 0 else torch.cat(c) for c in columns]))


def samples(batch: Any, who: object = "samples") -> int:
    """The default unit count: the batch's leading size (1 for a batch without tensors).

    Raises:
        ValueError: the batch is empty, or its tensors disagree on the leading size.
    """
    size = leading_size(batch, who)
    if size == 0:
        raise ValueError(
            f"{who}: the batch is empty (leading size 0); skip empty batches before the step, "
            "e.g. DataLoader(..., drop_last=True)"
        )
    return 1 if size is None else size


def check_weights(values: Sequence[Any], who: object, what: str) -> list[float]:
    """Turn unit counts (numbers or one-element tensors) into positive, finite floats.

    Tensors are read with one host transfer for all of them (on an accelerator, one
    host sync). ``what`` names the batches in messages ("micro-batch", "the batch").

    Raises:
        TypeError: a value is not a real number or a one-element tensor.
        ValueError: a value is zero, negative, NaN or infinite.
    """
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.numel() == 1]
    if tensors:
        if len({t.device for t in tensors}) == 1:
            read = iter(torch.stack([t.detach().reshape(()).double() for t in tensors]).tolist())
        else:
            read = iter([t.item() for t in tensors])
        values = [next(read) if isinstance(v, torch.Tensor) and v.numel() == 1 else v for v in values]
    out = []
    for i, v in enumerate(values):
        where = f"{what} {i + 1} of {len(values)}" if len(values) > 1 else what
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(
                f"{who}: weight must return a number or a one-element tensor, got {show(v)} for "
                f"{where}; return the count of units, e.g. (labels != -100).sum()"
            )
        if not math.isfinite(v) or v <= 0:
            raise ValueError(
                f"{who}: weight returned {v} for {where}; every batch must hold a positive, finite "
                "number of units (samples, tokens), or its mean loss is undefined: drop the samples that "
                "hold none (sequences whose labels are all ignored) from the data, or use fewer micro-batches"
            )
        out.append(float(v))
    return out


_batchnorms: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = weakref.WeakKeyDictionary()


def warn_if_batchnorm(model: nn.Module, who: object) -> None:
    """Warn that a split batch is not exactly the whole batch for BatchNorm in training mode.

    Which modules are BatchNorm is found once per model (a derived fact, not training state).
    """
    if model not in _batchnorms:
        _batchnorms[model] = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    if any(m.training for m in _batchnorms[model]):
        warnings.warn(
            f"{who}: the model has BatchNorm layers in training mode; they normalise each micro-batch (or "
            "data_parallel shard) with its own statistics, so the update is close to, not exactly, the whole "
            "batch's (PyTorch issue 46516). Use GroupNorm/LayerNorm for exactness.",
            stacklevel=3,
        )

"""Helpers for argument checks and error messages (internal)."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

__all__ = [
    "ACCUMULATE",
    "ADAPTIVE_CLIP_GRAD",
    "CACHE",
    "CHECKPOINT_ACTIVATIONS",
    "CLIP_GRAD_NORM",
    "CLIP_GRAD_VALUE",
    "COMPILE",
    "DATA_PARALLEL",
    "DISTRIBUTED",
    "DOCUMENT_MASK",
    "EMA",
    "EMA_MODEL",
    "HDF5",
    "LOAD_STATE",
    "MIXED_PRECISION",
    "PACK",
    "PIPELINE",
    "PIPELINE_SPLIT",
    "RUN",
    "SCALED_LR",
    "SHARDED",
    "SKIP_SPIKES",
    "TENSOR_PARALLEL",
    "TOKENS",
    "WARMUP",
    "WRITE_TOKENS",
    "check_bool",
    "check_int",
    "check_real",
    "name",
    "show",
]

# How public entry points name themselves in their messages, also in the parts below them that serve only them
RUN = "run"  # ct.run: its options, loop, checkpoint files
LOAD_STATE = "TrainState.load_state_dict"  # its checks and its rollback
CACHE = "cache"  # ct.cache: its store's files, lock, writer and reader
HDF5 = "ct.hdf5"  # ct.hdf5: its file checks and readers
TOKENS = "ct.tokens"  # ct.tokens: its file checks and reader
WRITE_TOKENS = "ct.write_tokens"
PACK = "ct.pack"
DOCUMENT_MASK = "ct.document_mask"  # and ct.document_block_mask
# the transforms (and ct.ema_model, ct.scaled_lr, ct.warmup): their argument checks, messages and reprs
ACCUMULATE = "accumulate"
ADAPTIVE_CLIP_GRAD = "adaptive_clip_grad"
CHECKPOINT_ACTIVATIONS = "checkpoint_activations"
CLIP_GRAD_NORM = "clip_grad_norm"
CLIP_GRAD_VALUE = "clip_grad_value"
COMPILE = "compile"
DATA_PARALLEL = "data_parallel"
DISTRIBUTED = "distributed"
EMA = "ema"
EMA_MODEL = "ema_model"
MIXED_PRECISION = "mixed_precision"
PIPELINE = "pipeline"
PIPELINE_SPLIT = "pipeline_split"
SCALED_LR = "scaled_lr"
SHARDED = "sharded"
TENSOR_PARALLEL = "tensor_parallel"
SKIP_SPIKES = "skip_spikes"
WARMUP = "warmup"


def show(value: Any) -> str:
    """A one-line description of a value for error messages: short repr and type."""
    text = " ".join(repr(value).split())
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def name(fn: Any) -> str:
    """How a function is named in reprs and messages."""
    return getattr(fn, "__name__", None) or repr(fn)


def check_int(
    value: Any, who: str, arg: str, *, minimum: int = 1, maximum: int | None = None, example: str = ""
) -> int:
    """``value`` as an int of at least ``minimum`` (and at most ``maximum``): the one rule for integer arguments.

    Anything that is not an integer (a bool, a float, a tensor, a string) is a
    TypeError; an integer out of range is a ValueError. Integer-like values such
    as ``numpy.int64`` are accepted.

    Example:
        >>> check_int(0, "accumulate", "n", example="accumulate(4)")
        Traceback (most recent call last):
        ValueError: accumulate: n must be a positive int, got 0 (int); e.g. accumulate(4)
    """
    hint = f"; e.g. {example}" if example else ""
    kind = "a positive int" if minimum == 1 else "a non-negative int" if minimum == 0 else f"an int >= {minimum}"
    if (minimum, maximum) == (-(2**63), 2**63 - 1):  # a seed that NumPy and torch hold as an int64
        kind = f"a 64-bit int (-2**63 <= {arg} < 2**63)"
    elif maximum is not None:
        kind = f"an int from {minimum} to {maximum}"
    index = None
    if not isinstance(value, bool) and isinstance(value, numbers.Integral):
        index = operator.index(value)
    if index is None:
        raise TypeError(f"{who}: {arg} must be {kind}, got {show(value)}{hint}")
    if index < minimum or (maximum is not None and index > maximum):
        raise ValueError(f"{who}: {arg} must be {kind}, got {show(value)}{hint}")
    return index


def check_real(
    value: Any, who: str, arg: str, *, positive: bool = True, finite: bool = True, example: str = ""
) -> float:
    """``value`` as a float: the one rule for real-number arguments.

    A non-number (a bool, a string, a tensor) is a TypeError; NaN, an infinity when
    ``finite``, or a value that is not positive when ``positive`` is a ValueError.
    """
    hint = f"; e.g. {example}" if example else ""
    kind = "a " + ", ".join(w for w, on in (("positive", positive), ("finite", finite)) if on) + " number"
    kind = kind.replace("a  ", "a ")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{who}: {arg} must be {kind}, got {show(value)}{hint}")
    try:
        number = float(value)
    except OverflowError:  # an int past 1e308: no float holds it
        number = math.inf
    if math.isnan(number) or (finite and math.isinf(number)) or (positive and not number > 0):
        raise ValueError(f"{who}: {arg} must be {kind}, got {show(value)}{hint}")
    return number


def check_bool(value: Any, who: str, arg: str, *, example: str = "") -> bool:
    """``value`` if it is True or False: the one rule for flags.

    Anything else (1, ``"yes"``, None, a one-element tensor) is a TypeError: a flag
    that merely looks true would hide a mistaken argument.

    Example:
        >>> check_bool(1, "distributed", "static_graph")
        Traceback (most recent call last):
        TypeError: distributed: static_graph must be True or False, got 1 (int); e.g. static_graph=True
    """
    if not isinstance(value, bool):
        hint = example or f"{arg}=True"
        raise TypeError(f"{who}: {arg} must be True or False, got {show(value)}; e.g. {hint}")
    return value

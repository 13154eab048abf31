"""``same_item``: whether two items are equal in structure, type, dtype, shape and every bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["same_item"]


def same_item(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same item: the same container and leaf types, dtypes, shapes and bytes
    (so NaNs with the same bits are equal, and 0.0 differs from -0.0).

    Example:
        >>> same_item((torch.ones(2), 3), (torch.ones(2), 3)), same_item(1, 1.0)
        (True, False)
    """
    if _kind(a) is not _kind(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same_item(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_item(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if not a.numel():  # nothing to compare (and an empty tensor's strides may forbid .view)
            return True
        size = a.element_size()
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[size]
        flat_a, flat_b = (t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1) for t in (a, b))
        if size == 16:  # complex128: two int64 per element
            return torch.equal(flat_a.view(torch.float64).view(ints), flat_b.view(torch.float64).view(ints))
        return torch.equal(flat_a.view(ints), flat_b.view(ints))
    if isinstance(a, np.ndarray | np.generic):
        return a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return bool(a == b)


def _kind(x: Any) -> type:
    """``x``'s type; a NumPy memmap counted as the array it is, NumPy scalars by their dtype (compared next:
    ``np.longlong`` and ``np.int64`` are both int64)."""
    if isinstance(x, np.generic):
        return np.generic
    return np.ndarray if type(x) is np.memmap else type(x)

"""How an item maps onto named flat arrays: the item's structure as a tree of ``Field`` leaves, and its JSON form.

An item is a tensor, a NumPy array or scalar, a Python ``int``/``float``/``bool``, or a tuple, list or dict
(string keys) of these, nested. Each leaf becomes one field: an array whose first axis is the item index (or,
for a ragged field, a flat array plus per-item offsets and shapes). Nothing else is stored: no pickle, so that
reading a store never runs code.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["DEPTH", "KINDS", "Field", "from_json", "leaf_kind", "numpy_dtype", "to_json", "torch_dtype", "unflatten"]

KINDS = ("tensor", "numpy", "int", "float", "bool")
DEPTH = 64  # the deepest a leaf may lie in an item's containers: the writer refuses deeper, as the reader does
NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")  # an array's name: also its file name, so never a path
_NUMPY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: the dtypes a buffer holds as plain bytes
_SCALARS = {"int": np.dtype("<i8"), "float": np.dtype("<f8"), "bool": np.dtype("bool")}
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}  # data plus scale
_BY_SIZE = {1: "<u1", 2: "<i2", 4: "<i4", 8: "<i8"}  # how a tensor dtype NumPy lacks (bfloat16, ...) is held


@dataclass(frozen=True)
class Field:
    """One leaf of an item: where its values live and what they read back as.

    Args:
        kind: "tensor", "numpy" (array or scalar), "int", "float" or "bool" (Python numbers).
        dtype: the torch dtype's name for a tensor ("float32", "bfloat16"), the NumPy dtype string for the others.
        shape: every item's shape for this leaf, or None when it differs between items (ragged).
        data: the name of the array holding the values: ``(items, *shape)``, or flat when ragged.
        offsets: ragged only: the array of ``items + 1`` element offsets into ``data``.
        shapes: ragged only: the ``(items, ndim)`` array of each item's shape.
        scalar: a NumPy scalar (``np.float32(1)``), rather than an array of shape ().
    """

    kind: str
    dtype: str
    shape: tuple[int, ...] | None
    data: str
    offsets: str | None = None
    shapes: str | None = None
    scalar: bool = False

    @property
    def storage(self) -> np.dtype[Any]:
        """The NumPy dtype of the stored bytes."""
        return storage_dtype(self.kind, self.dtype)


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def numpy_dtype(name: str) -> np.dtype[Any]:
    dtype = np.dtype(name)
    if dtype.kind not in _NUMPY_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"a {dtype} array holds no plain numbers")
    return dtype


@functools.lru_cache(maxsize=256)  # called for every leaf written: the answer depends on the names only
def storage_dtype(kind: str, dtype: str) -> np.dtype[Any]:
    if kind == "tensor":
        t = torch_dtype(dtype)
        if t in _QUANTIZED:
            raise ValueError(f"a {dtype} tensor cannot be stored (its scale and zero point are not data)")
        try:
            return np.dtype(torch.empty(0, dtype=t).numpy().dtype).newbyteorder("<")
        except TypeError:  # bfloat16, float8, complex32, ...: held as integers of the same width
            size = t.itemsize
            if size not in _BY_SIZE:
                raise ValueError(
                    f"a {dtype} tensor cannot be stored; convert it to another dtype in __getitem__"
                ) from None
            return np.dtype(_BY_SIZE[size])
    if kind == "numpy":
        return numpy_dtype(dtype)
    if kind in _SCALARS:
        return _SCALARS[kind]
    raise ValueError(f"unknown kind {kind!r}")


def leaf_kind(value: Any, where: str) -> tuple[str, str, tuple[int, ...], bool]:
    """(kind, dtype name, shape, numpy scalar?) of a leaf, or a ValueError saying why it cannot be stored."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor or value.layout != torch.strided or value.device.type != "cpu":
            raise ValueError(
                f"{where} is a {type(value).__name__} ({value.layout}, on {value.device}): only dense "
                "CPU tensors are stored; return plain CPU tensors from __getitem__"
            )
        name = str(value.dtype).removeprefix("torch.")
        if value.is_quantized:
            raise ValueError(
                f"{where} is a quantized tensor ({name}): its scale and zero point would be lost; return "
                "value.int_repr() (and the scale) or value.dequantize() from __getitem__"
            )
        storage_dtype("tensor", name)
        return "tensor", name, tuple(value.shape), False
    if isinstance(value, np.ndarray) and type(value) not in (np.ndarray, np.memmap):
        raise ValueError(
            f"{where} is a NumPy {type(value).__name__}: it would come back as a plain array (a "
            "mask or subclass lost); return np.asarray(value), or value.filled(...) for a masked "
            "array, from __getitem__"
        )
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.kind not in _NUMPY_KINDS or value.dtype.fields is not None:
            raise ValueError(
                f"{where} is a NumPy {value.dtype} value: only numbers and booleans are stored; "
                "convert it in __getitem__ (strings to integer ids)"
            )
        if not value.dtype.isnative:
            native = value.dtype.newbyteorder("=").str
            raise ValueError(
                f"{where} is a NumPy {value.dtype.str} value, not in this machine's byte order: "
                f"return value.astype({native!r}) from __getitem__"
            )
        return "numpy", value.dtype.str, tuple(value.shape), isinstance(value, np.generic)
    if type(value) is bool:
        return "bool", "|b1", (), False
    if type(value) is int:
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"{where} is the int {value}, outside int64: store it as a tensor or float")
        return "int", "<i8", (), False
    if type(value) is float:
        return "float", "<f8", (), False
    raise ValueError(
        f"{where} is a {type(value).__name__}: only tensors, NumPy numbers, int, float and bool, in "
        "tuples, lists and dicts with string keys, can be stored; convert it in __getitem__"
    )


def to_json(tree: Any) -> Any:
    """The item structure as JSON: {"tuple": [...]}, {"list": [...]}, {"dict": [[key, ...], ...]}, {"field": {...}}."""
    if isinstance(tree, Field):
        shape = None if tree.shape is None else list(tree.shape)
        return {
            "field": {
                "kind": tree.kind,
                "dtype": tree.dtype,
                "shape": shape,
                "data": tree.data,
                "offsets": tree.offsets,
                "shapes": tree.shapes,
                "scalar": tree.scalar,
            }
        }
    if isinstance(tree, tuple | list):
        return {type(tree).__name__: [to_json(t) for t in tree]}
    return {"dict": [[k, to_json(v)] for k, v in tree.items()]}


def from_json(node: Any, depth: int = 0) -> Any:
    """The tree ``to_json`` wrote, every value checked (a store's manifest is input: a crafted one must fail here)."""
    if depth > DEPTH or not isinstance(node, dict) or len(node) != 1:
        raise ValueError("the item structure is malformed")
    ((tag, body),) = node.items()
    if tag in ("tuple", "list") and isinstance(body, list):
        children = [from_json(c, depth + 1) for c in body]
        return tuple(children) if tag == "tuple" else children
    if tag == "dict" and isinstance(body, list):
        if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in body):
            raise ValueError("a dict of the item structure is malformed")
        return {k: from_json(v, depth + 1) for k, v in body}
    if tag == "field" and isinstance(body, dict):
        return _field(body)
    raise ValueError(f"the item structure has an unknown node {tag!r}")


def _field(body: dict[str, Any]) -> Field:
    keys = {"kind", "dtype", "shape", "data", "offsets", "shapes", "scalar"}
    if set(body) != keys or body["kind"] not in KINDS or not isinstance(body["dtype"], str):
        raise ValueError("a field of the item structure is malformed")
    shape = body["shape"]
    if shape is not None and not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise ValueError(f"a field's shape is malformed: {shape!r}")
    names = [body["data"]] + ([body["offsets"], body["shapes"]] if shape is None else [])
    if not all(isinstance(n, str) and NAME.match(n) for n in names) or (
        shape is not None and (body["offsets"] or body["shapes"])
    ):
        raise ValueError(f"a field names arrays that are not plain names: {names!r}")
    if type(body["scalar"]) is not bool:
        raise ValueError("a field's scalar flag is malformed")
    field = Field(
        body["kind"],
        body["dtype"],
        None if shape is None else tuple(shape),
        body["data"],
        body["offsets"],
        body["shapes"],
        body["scalar"],
    )
    field.storage  # noqa: B018 (raises for a dtype that holds no plain numbers)
    return field


def unflatten(tree: Any, leaf: Any) -> Any:
    """``tree`` with each Field replaced by ``leaf(field)``; tuples and lists as ``kind``: tuple or list."""
    if isinstance(tree, Field):
        return leaf(tree)
    if isinstance(tree, tuple):
        return tuple(unflatten(t, leaf) for t in tree)
    if isinstance(tree, list):
        return [unflatten(t, leaf) for t in tree]
    return {k: unflatten(v, leaf) for k, v in tree.items()}

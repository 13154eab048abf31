"""``ct.pack``: variable-length token sequences (documents) packed once into fixed-length rows, with what a model needs
to keep them apart: labels that never predict across a document boundary, positions that restart per document, and
document ids for a block-causal attention mask (``document_masks.py``).

Packing is deterministic (no random draw: the same documents give the same rows) and is done when ``ct.pack`` is
called; the rows are then an ordinary map-style Dataset, so ``ct.run``'s order over them, and its resume, are exact.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from composetrain.core.util import PACK, check_bool, check_int, show

__all__ = ["FIELDS", "IGNORE", "METHODS", "PackedDataset", "pack", "place"]

IGNORE = -100  # the label of a position that predicts nothing (cross_entropy's default ignore_index)
FIELDS = ("input_ids", "labels", "position_ids", "document_ids")
METHODS = ("first_fit", "greedy")


class PackedDataset(Dataset[dict[str, torch.Tensor]]):
    """What ``ct.pack`` returns: ``len(self)`` rows of ``seq_len`` positions, each a dict of int64 tensors
    ``input_ids``, ``labels``, ``position_ids`` and ``document_ids`` of shape ``(seq_len,)``.

    Attributes:
        rows: each field's ``(rows, seq_len)`` tensor, by name.
        pieces: ``(pieces, 5)`` int64 tensor, one line per placed piece of a document: ``document, start`` (its
            first token in the document), ``length, row, column`` (where it lies): the packing as recorded.
        tokens: document tokens placed (every token of every document, once).
        padding: the share of positions that are padding.
    """

    def __init__(self, rows: dict[str, torch.Tensor], pieces: torch.Tensor, method: str) -> None:
        self.rows, self.pieces, self.method = rows, pieces, method
        self.seq_len = rows["input_ids"].shape[1]
        self.tokens = int(pieces[:, 2].sum())
        positions = rows["input_ids"].numel()
        self.padding = 1 - self.tokens / positions if positions else 0.0

    def __len__(self) -> int:
        return self.rows["input_ids"].shape[0]

    def _index(self, i: Any) -> int:
        """Row ``i`` as a list indexes (ints, NumPy ints, 0-dim integer tensors; negative from the end); never a
        bool, a float or a slice, which a tensor would read as other rows (``t[True]`` adds a dimension)."""
        whole = not isinstance(i, bool | np.bool_) and not (
            isinstance(i, torch.Tensor) and (i.ndim or i.dtype == torch.bool)
        )
        try:
            index = operator.index(i) if whole else None
        except TypeError:
            index = None
        if index is None:
            raise TypeError(
                f"{PACK}: a row index must be an int, got {show(i)}; index one row (packed[3]), or several with "
                "packed.__getitems__([3, 4])"
            )
        if not -len(self) <= index < len(self):
            raise IndexError(
                f"{PACK}: row {index} is out of range for {len(self)} rows; give an index from {-len(self)} to "
                f"{len(self) - 1}"
            )
        return index % len(self)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = self._index(i)
        return {name: t[i] for name, t in self.rows.items()}

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """The rows at ``indices``: one gather per field, then each row's views."""
        index = torch.tensor([self._index(i) for i in indices], dtype=torch.int64)
        gathered = {name: t.index_select(0, index) for name, t in self.rows.items()}
        return [{name: t[n] for name, t in gathered.items()} for n in range(len(index))]

    def __repr__(self) -> str:
        return (
            f"{PACK}({self.method}): {len(self)} rows of {self.seq_len} positions, {self.tokens} tokens, "
            f"{self.padding:.1%} padding"
        )


def _document(doc: Any, n: int) -> np.ndarray[Any, Any]:
    if isinstance(doc, Mapping):  # a dataset's row (Hugging Face's): its ids are one of its fields
        raise TypeError(
            f"{PACK}: document {n} is a {type(doc).__name__} with keys {list(doc)[:5]}, not a sequence of token ids; "
            "give the ids alone, e.g. ct.pack([row['input_ids'] for row in dataset], seq_len)"
        )
    try:
        values = doc.detach().cpu().numpy() if isinstance(doc, torch.Tensor) else np.asarray(doc)
    except ValueError:  # nested lists of different lengths
        values = np.asarray(doc, dtype=object)
    if values.size == 0:
        return np.zeros(0, np.int64)
    if values.dtype.kind not in "ui" or values.ndim != 1 or values.dtype == np.uint64:
        raise TypeError(
            f"{PACK}: document {n} must be a flat sequence of integer token ids, got {values.dtype} of shape "
            f"{values.shape}; give each document as a list or 1-D array of ids"
        )
    if int(values.min()) < 0:
        raise ValueError(
            f"{PACK}: document {n} holds the negative id {int(values.min())}; give token ids (>= 0), and no "
            "labels: ct.pack makes them"
        )
    return values.astype(np.int64, copy=False)


def _documents(documents: Any) -> list[np.ndarray[Any, Any]]:
    """Every document, read once in order: a map-style dataset or sequence by index, any other iterable by iterating."""
    if isinstance(documents, str | bytes | dict | np.ndarray | torch.Tensor) or not (
        (hasattr(documents, "__len__") and hasattr(documents, "__getitem__")) or hasattr(documents, "__iter__")
    ):
        raise TypeError(
            f"{PACK}: documents must be a list (or dataset, or iterable) of token-id sequences, got "
            f"{show(documents)}; e.g. ct.pack([[5, 7, 2], [9, 4]], 1024)"
        )
    if hasattr(documents, "__len__") and hasattr(documents, "__getitem__"):
        items: Any = (documents[i] for i in range(len(documents)))
    else:
        items = iter(documents)
    return [_document(doc, n) for n, doc in enumerate(items)]


def place(lengths: Sequence[int], seq_len: int, method: str) -> list[tuple[int, int]]:
    """The ``(row, column)`` of each piece, in order: ``"first_fit"`` puts a piece in the first row (rows opened in
    order) with room for it; ``"greedy"`` in the last row opened, or in a new one where it does not fit there."""
    spots: list[tuple[int, int]] = []
    if method == "greedy":
        row, used = -1, seq_len
        for length in lengths:
            if used + length > seq_len:
                row, used = row + 1, 0
            spots.append((row, used))
            used += length
        return spots
    size = 1 << max(0, (len(lengths) - 1).bit_length())  # a max-tree over each row's room: the first fit in log time
    room = [0] * size + [seq_len] * size
    for i in range(size - 1, 0, -1):
        room[i] = max(room[2 * i], room[2 * i + 1])
    for length in lengths:
        i = 1
        while i < size:
            i = 2 * i if room[2 * i] >= length else 2 * i + 1
        spots.append((i - size, seq_len - room[i]))
        room[i] -= length
        while i > 1:
            i //= 2
            room[i] = max(room[2 * i], room[2 * i + 1])
    return spots


def pack(
    documents: Any, seq_len: int, *, method: str = "first_fit", split: bool = False, pad_id: int = 0
) -> PackedDataset:
    """Pack variable-length documents of token ids into rows of ``seq_len`` positions, once and deterministically.

    Each row is a dict of int64 tensors of shape ``(seq_len,)``: ``input_ids`` (the documents' tokens, ``pad_id``
    after the last one), ``labels`` (the next token of the same document, already shifted as ``ct.tokens``'
    targets: ``labels[i]`` is what position ``i`` predicts; ``-100`` after each document's last token and on
    padding, so no label crosses a document boundary), ``position_ids`` (0, 1, ... restarting at every document;
    0 on padding) and ``document_ids`` (the document's index in ``documents``; -1 on padding). Attention must be kept
    inside documents too: ``ct.document_mask(batch["document_ids"])`` is the block-causal mask.

    Args:
        documents: token-id sequences (lists, arrays, tensors), as a list, a map-style dataset or an iterable; each
            is read once. Empty ones are left out.
        seq_len: positions per row.
        method: ``"first_fit"``: each document, in the order given, goes into the first row (rows opened in order)
            with room for it, so later short documents fill earlier gaps (least padding); ``"greedy"``: into the last
            row opened, or a new one (documents stay in order; more padding).
        split: a document longer than ``seq_len`` is refused (False), or cut into pieces of ``seq_len`` tokens
            (the last shorter), each placed as a document of its own: its positions restart at 0 and it attends to
            nothing of the pieces before; the label of a piece's last token is still the document's next token.
        pad_id: the input id of padding positions (never a label).

    Returns:
        A ``PackedDataset``; ``.padding`` is the share of padding positions, ``.pieces`` where each piece went.

    Example:
        >>> packed = ct.pack([[5, 7, 2], [9, 4], [3, 3, 3, 1]], 5)
        >>> [packed[r]["input_ids"].tolist() for r in range(len(packed))]
        [[5, 7, 2, 9, 4], [3, 3, 3, 1, 0]]
        >>> packed[0]["labels"].tolist(), packed[0]["position_ids"].tolist()
        ([7, 2, -100, 4, -100], [0, 1, 2, 0, 1])
    """
    seq_len = check_int(seq_len, PACK, "seq_len", example="ct.pack(documents, 1024)")
    if method not in METHODS:
        raise ValueError(f"{PACK}: method must be 'first_fit' or 'greedy', got {show(method)}; e.g. method='greedy'")
    split = check_bool(split, PACK, "split", example="split=True")
    pad_id = check_int(pad_id, PACK, "pad_id", minimum=0, maximum=2**63 - 1, example="pad_id=0")  # int64 rows
    docs = _documents(documents)
    pieces: list[tuple[int, int, int]] = []  # document, start, length
    for n, doc in enumerate(docs):
        if len(doc) > seq_len and not split:
            raise ValueError(
                f"{PACK}: document {n} has {len(doc)} tokens, more than seq_len={seq_len}; pass split=True (it is "
                "cut into pieces of seq_len tokens, each attending only to itself), or give a larger seq_len"
            )
        pieces += [(n, start, min(seq_len, len(doc) - start)) for start in range(0, len(doc), seq_len)]
    if not pieces:
        raise ValueError(
            f"{PACK}: documents hold no tokens ({len(docs)} documents, all empty): there is nothing to pack; give "
            "documents with token ids"
        )
    spots = place([length for _, _, length in pieces], seq_len, method)
    count = 1 + max((row for row, _ in spots), default=-1)
    rows = {
        "input_ids": np.full((count, seq_len), pad_id, np.int64),
        "labels": np.full((count, seq_len), IGNORE, np.int64),
        "position_ids": np.zeros((count, seq_len), np.int64),
        "document_ids": np.full((count, seq_len), -1, np.int64),
    }
    for (n, start, length), (row, column) in zip(pieces, spots, strict=True):
        doc, end = docs[n], column + length
        rows["input_ids"][row, column:end] = doc[start : start + length]
        following = doc[start + 1 : start + length + 1]  # the next tokens; one fewer at the document's end
        rows["labels"][row, column : column + len(following)] = following
        rows["position_ids"][row, column:end] = np.arange(length)
        rows["document_ids"][row, column:end] = n
    table = torch.tensor([[*p, *s] for p, s in zip(pieces, spots, strict=True)], dtype=torch.int64).reshape(-1, 5)
    return PackedDataset({name: torch.from_numpy(rows[name]) for name in FIELDS}, table, method)

"""Block-causal attention masks from ``ct.pack``'s document ids: a position attends to the positions of its own
document up to itself, never to another document's (nor padding to a document, which has its own id, -1)."""

from __future__ import annotations

from typing import Any

import torch

from composetrain.core.util import DOCUMENT_MASK, check_int, show

__all__ = ["document_block_mask", "document_mask"]


def _ids(document_ids: Any, who: str) -> torch.Tensor:
    if (
        not isinstance(document_ids, torch.Tensor)
        or document_ids.ndim not in (1, 2)
        or document_ids.is_floating_point()
        or document_ids.is_complex()
        or document_ids.dtype == torch.bool
    ):
        got = (
            f"a {document_ids.dtype} tensor of shape {tuple(document_ids.shape)}"
            if isinstance(document_ids, torch.Tensor)
            else show(document_ids)
        )
        raise TypeError(
            f"{who}: document_ids must be an integer tensor of shape (seq_len,) or (batch, seq_len), got {got}; "
            'give a packed batch\'s batch["document_ids"]'
        )
    return document_ids


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """The block-causal boolean mask of packed rows, for ``F.scaled_dot_product_attention(..., attn_mask=)``.

    ``mask[..., i, j]`` is True where position ``i`` may attend to position ``j``: the same document and ``j <= i``.

    Args:
        document_ids: ``(batch, seq_len)`` (or ``(seq_len,)``) integer ids, as ``ct.pack`` gives them.

    Returns:
        A bool tensor of shape ``(batch, 1, seq_len, seq_len)`` (broadcast over heads), or ``(seq_len, seq_len)``
        for one row; on the ids' device. It takes ``batch * seq_len**2`` bytes: for long rows use
        ``document_block_mask`` with ``flex_attention``.

    Example:
        >>> ct.document_mask(torch.tensor([0, 0, 1])).int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    ids = _ids(document_ids, DOCUMENT_MASK)
    length = ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
    mask = (ids.unsqueeze(-1) == ids.unsqueeze(-2)) & causal
    return mask.unsqueeze(1) if ids.ndim == 2 else mask


def document_block_mask(document_ids: torch.Tensor, *, block_size: int = 128) -> Any:
    """The same mask as ``document_mask``, as a ``flex_attention`` ``BlockMask`` (blocks no position attends to are
    skipped, and nothing of ``seq_len**2`` is kept): ``flex_attention(q, k, v, block_mask=...)``.

    Args:
        document_ids: ``(batch, seq_len)`` (or ``(seq_len,)``) integer ids, as ``ct.pack`` gives them.
        block_size: the block's side, in positions (flex_attention's ``BLOCK_SIZE``).

    Returns:
        A ``torch.nn.attention.flex_attention.BlockMask`` for every head, on the ids' device (torch 2.5 or later;
        on the CPU flex_attention runs eagerly, or compiled by ``torch.compile``).

    Example:
        >>> mask = ct.document_block_mask(batch["document_ids"])  # doctest: +SKIP
        >>> out = flex_attention(q, k, v, block_mask=mask)  # doctest: +SKIP
    """
    who = "ct.document_block_mask"
    ids = _ids(document_ids, who)
    block_size = check_int(block_size, who, "block_size", example="block_size=128")
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError:  # torch before 2.5
        raise RuntimeError(
            f"{who}: this torch ({torch.__version__}) has no flex_attention; install torch 2.5 or later, or use "
            "ct.document_mask with scaled_dot_product_attention"
        ) from None
    if ids.shape[-1] == 0:  # flex_attention's block count divides by it
        raise ValueError(
            f"{who}: document_ids has no positions (shape {tuple(ids.shape)}): there is nothing to attend; give rows "
            "of at least one position"
        )
    # a copy: mask_mod reads the ids whenever attention runs, while the blocks skipped are fixed now; ids changed in
    # place later (a reused batch buffer) would otherwise mix two masks
    rows = (ids if ids.ndim == 2 else ids.unsqueeze(0)).clone()

    def same_document(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (rows[b, q] == rows[b, kv]) & (q >= kv)

    length = rows.shape[1]
    return create_block_mask(
        same_document, rows.shape[0], None, length, length, device=str(rows.device), BLOCK_SIZE=block_size
    )

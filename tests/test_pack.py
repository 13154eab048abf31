"""ct.pack: every token of every document placed once, labels that predict only the next token of the same
document, positions restarting per document, the same rows every time; first fit and greedy placement as documented;
ct.document_mask and ct.document_block_mask keep attention inside a document."""

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from torch.utils.data import Dataset

import composetrain as ct
from composetrain.data.packing import place

documents = st.lists(st.lists(st.integers(0, 999), max_size=30), min_size=1, max_size=25).filter(lambda docs: any(docs))
methods = st.sampled_from(["first_fit", "greedy"])


@given(documents, st.integers(1, 12), methods, st.integers(0, 5))
def test_every_token_is_placed_once_and_labels_never_cross_a_document(docs, seq_len, method, pad_id):
    packed = ct.pack(docs, seq_len, method=method, split=True, pad_id=pad_id)
    rows = {k: v.tolist() for k, v in packed.rows.items()}
    seen = {n: [] for n in range(len(docs))}  # each document's (index in it, token) as found in the rows
    for r in range(len(packed)):
        assert all(len(rows[k][r]) == seq_len for k in rows)
        for c in range(seq_len):
            d, token, label, pos = (rows[k][r][c] for k in ("document_ids", "input_ids", "labels", "position_ids"))
            if d == -1:  # padding predicts nothing and is nothing
                assert (token, label, pos) == (pad_id, -100, 0)
                continue
            piece = [p for p in packed.pieces.tolist() if p[0] == d and p[3] == r and p[4] <= c < p[4] + p[2]]
            assert len(piece) == 1  # a position lies in exactly one piece
            _, start, _, _, column = piece[0]
            i = start + c - column  # its index in the document
            assert pos == c - column and token == docs[d][i]
            assert label == (docs[d][i + 1] if i + 1 < len(docs[d]) else -100)  # the next token of this document
            seen[d].append((i, token))
    for n, doc in enumerate(docs):
        assert sorted(seen[n]) == list(enumerate(doc))  # every token, once
    assert packed.tokens == sum(map(len, docs))
    assert packed.padding == pytest.approx(1 - packed.tokens / (len(packed) * seq_len))


@given(documents, st.integers(1, 12), methods)
def test_packing_is_deterministic_and_reads_a_dataset_as_its_list(docs, seq_len, method):
    class Documents(Dataset):
        def __len__(self):
            return len(docs)

        def __getitem__(self, i):
            return torch.tensor(docs[i], dtype=torch.int32)

    packs = [
        ct.pack(docs, seq_len, method=method, split=True),
        ct.pack(Documents(), seq_len, method=method, split=True),
        ct.pack(iter([np.array(d, np.uint16) for d in docs]), seq_len, method=method, split=True),
    ]
    for other in packs[1:]:
        assert all(torch.equal(packs[0].rows[k], other.rows[k]) for k in packs[0].rows)
        assert torch.equal(packs[0].pieces, other.pieces)


@given(st.lists(st.integers(1, 10), min_size=1, max_size=40), st.integers(10, 14))
def test_first_fit_puts_each_piece_in_the_first_row_with_room_and_greedy_in_the_last(lengths, seq_len):
    room: list[int] = []
    for length, (row, column) in zip(lengths, place(lengths, seq_len, "first_fit"), strict=True):
        first = next((r for r, free in enumerate(room) if free >= length), len(room))
        assert row == first and column == (seq_len - room[row] if row < len(room) else 0)
        if row == len(room):
            room.append(seq_len)
        room[row] -= length
    last, used = -1, seq_len
    for length, (row, column) in zip(lengths, place(lengths, seq_len, "greedy"), strict=True):
        if used + length > seq_len:
            last, used = last + 1, 0
        assert (row, column) == (last, used)
        used += length


def test_first_fit_fills_gaps_that_greedy_leaves():
    docs = [[1] * 6, [2] * 6, [3] * 3, [4] * 3]
    assert len(ct.pack(docs, 9, method="first_fit")) == 2  # 6+3 | 6+3
    assert ct.pack(docs, 9)[0]["document_ids"].tolist() == [0, 0, 0, 0, 0, 0, 2, 2, 2]
    assert len(ct.pack(docs, 9, method="greedy")) == 3  # 6 | 6+3 | 3
    assert ct.pack(docs, 9).padding < ct.pack(docs, 9, method="greedy").padding


def test_a_document_longer_than_seq_len_is_refused_unless_split_and_split_keeps_its_next_token_labels():
    with pytest.raises(ValueError, match=r"^ct\.pack: document 1 has 7 tokens, more than seq_len=4; pass split=True"):
        ct.pack([[1, 2], [3, 4, 5, 6, 7, 8, 9]], 4)
    packed = ct.pack([[1, 2], [3, 4, 5, 6, 7, 8, 9]], 4, split=True)
    assert packed.pieces.tolist() == [[0, 0, 2, 0, 0], [1, 0, 4, 1, 0], [1, 4, 3, 2, 0]]  # the 3 fits no gap
    row = packed[1]
    assert row["input_ids"].tolist() == [3, 4, 5, 6] and row["labels"].tolist() == [4, 5, 6, 7]  # 6 predicts 7
    assert row["position_ids"].tolist() == [0, 1, 2, 3]


def test_a_document_of_exactly_seq_len_tokens_fills_a_row_unsplit():
    packed = ct.pack([[1, 2], [3, 4, 5, 6], [7]], 4)
    assert packed.pieces.tolist() == [[0, 0, 2, 0, 0], [1, 0, 4, 1, 0], [2, 0, 1, 0, 2]]
    assert packed[1]["labels"].tolist() == [4, 5, 6, -100] and packed[1]["position_ids"].tolist() == [0, 1, 2, 3]


def test_empty_documents_are_left_out_and_no_tokens_at_all_is_refused():
    packed = ct.pack([[], [5, 6], []], 4)
    assert len(packed) == 1 and packed.pieces[:, 0].tolist() == [1]
    with pytest.raises(ValueError, match=r"^ct\.pack: documents hold no tokens \(2 documents, all empty\)"):
        ct.pack([[], []], 4)


@pytest.mark.parametrize(
    ("docs", "error", "said"),
    [
        ("abc", TypeError, r"^ct\.pack: documents must be a list \(or dataset, or iterable\) of token-id sequences"),
        (5, TypeError, r"documents must be a list"),
        (torch.zeros(3, 4, dtype=torch.int64), TypeError, r"documents must be a list"),
        ([[1.5, 2.0]], TypeError, r"document 0 must be a flat sequence of integer token ids, got float64"),
        ([[1], [[1, 2]]], TypeError, r"document 1 must be a flat sequence of integer token ids, got int64 of shape"),
        ([[3, -100, 4]], ValueError, r"document 0 holds the negative id -100; give token ids \(>= 0\), and no labels"),
        ([[1], [1, [2, 3]]], TypeError, r"document 1 must be a flat sequence of integer token ids, got object"),
        (
            [{"input_ids": [1, 2]}],
            TypeError,
            r"document 0 is a dict with keys \['input_ids'\], not a sequence of token",
        ),
    ],
)
def test_documents_that_are_not_token_id_sequences_are_refused(docs, error, said):
    with pytest.raises(error, match=said):
        ct.pack(docs, 8)


def test_options_are_checked():
    with pytest.raises(ValueError, match=r"^ct\.pack: method must be 'first_fit' or 'greedy', got 'best' \(str\)"):
        ct.pack([[1]], 4, method="best")
    with pytest.raises(TypeError, match=r"^ct\.pack: split must be True or False, got 1 \(int\)"):
        ct.pack([[1]], 4, split=1)
    with pytest.raises(ValueError, match=r"^ct\.pack: seq_len must be a positive int, got 0"):
        ct.pack([[1]], 0)
    with pytest.raises(ValueError, match=r"^ct\.pack: pad_id must be an int from 0 to 9223372036854775807, got -1"):
        ct.pack([[1]], 4, pad_id=-1)
    with pytest.raises(ValueError, match=r"^ct\.pack: pad_id must be an int from 0 to .* got 9223372036854775808"):
        ct.pack([[1]], 4, pad_id=2**63)  # rows are int64: it was NumPy's bare OverflowError


def test_rows_read_whole_as_ct_run_reads_them():
    packed = ct.pack([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], 4)
    items = packed.__getitems__([2, 0])
    for got, i in zip(items, [2, 0], strict=True):
        assert got.keys() == packed[i].keys() and all(torch.equal(got[k], packed[i][k]) for k in got)
    assert repr(packed) == "ct.pack(first_fit): 3 rows of 4 positions, 10 tokens, 16.7% padding"


def test_rows_are_indexed_as_a_list_is_and_anything_else_is_refused():
    packed = ct.pack([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], 4)
    last = packed[len(packed) - 1]
    for i in (-1, np.int64(-1), torch.tensor(-1)):
        assert all(torch.equal(packed[i][k], last[k]) for k in last)
        assert all(torch.equal(packed.__getitems__([i])[0][k], last[k]) for k in last)  # read whole alike
    for bad in (True, 0.0, 1.7, slice(0, 2), torch.tensor([0]), "0"):
        with pytest.raises(TypeError, match=r"^ct\.pack: a row index must be an int, got "):
            packed[bad]  # a tensor indexed by True gains a dimension; by 1.7, as_tensor reads row 1
        with pytest.raises(TypeError, match=r"^ct\.pack: a row index must be an int, got "):
            packed.__getitems__([0, bad])
    for bad in (len(packed), -len(packed) - 1):
        with pytest.raises(
            IndexError, match=rf"^ct\.pack: row {bad} is out of range for 3 rows; give an index from -3"
        ):
            packed[bad]
        with pytest.raises(IndexError, match=rf"^ct\.pack: row {bad} is out of range for 3 rows"):
            packed.__getitems__([bad])


# -- masks ---------------------------------------------------------------------------------------------------
@given(
    st.lists(st.lists(st.integers(-1, 3), min_size=1, max_size=12), min_size=1, max_size=3).filter(
        lambda rows: len({len(r) for r in rows}) == 1
    )
)
def test_document_mask_lets_a_position_see_its_own_document_up_to_itself(rows):
    ids = torch.tensor(rows)
    mask = ct.document_mask(ids)
    assert mask.shape == (len(rows), 1, len(rows[0]), len(rows[0])) and mask.dtype == torch.bool
    for b, row in enumerate(rows):
        for i in range(len(row)):
            for j in range(len(row)):
                assert bool(mask[b, 0, i, j]) == (row[i] == row[j] and j <= i)
    assert torch.equal(ct.document_mask(ids[0]), mask[0, 0])


def test_the_block_mask_attends_as_the_boolean_mask():
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    packed = ct.pack([[1] * 5, [2] * 9, [3] * 3, [4] * 7, [5] * 2], 12)
    ids = packed.rows["document_ids"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(len(packed), 2, 12, 4, dtype=torch.float64, generator=g) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=ct.document_mask(ids))
    got = flex_attention(q, k, v, block_mask=ct.document_block_mask(ids, block_size=4))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    dense = ct.document_block_mask(ids, block_size=4).to_dense()  # blocks no query attends to are skipped
    assert dense.shape == (len(packed), 1, 3, 3) and not bool(dense[:, :, 0, 2].any())


def test_the_block_mask_keeps_the_ids_it_was_built_from():
    """flex_attention calls mask_mod whenever attention runs, while the blocks it skips were fixed at the build: ids
    changed in place afterwards (a batch buffer reused) must change neither."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    ids = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [3, 3, 3, 3, 3, 3, 4, -1]])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4, dtype=torch.float64, generator=g) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=ct.document_mask(ids))
    buffer = ids.clone()
    mask = ct.document_block_mask(buffer, block_size=4)
    buffer.fill_(0)  # the next batch written into the same buffer
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=mask), expected, rtol=1e-12, atol=1e-12)


def test_rows_without_positions_are_refused_by_the_block_mask():
    with pytest.raises(ValueError, match=r"^ct\.document_block_mask: document_ids has no positions \(shape \(2, 0\)\)"):
        ct.document_block_mask(torch.zeros(2, 0, dtype=torch.int64))  # was a ZeroDivisionError inside torch


@pytest.mark.parametrize(
    "ids", [torch.zeros(2, 3, 4, dtype=torch.int64), torch.zeros(4), [0, 1], torch.zeros(3).bool()]
)
def test_document_ids_that_are_not_an_integer_row_or_batch_are_refused(ids):
    with pytest.raises(TypeError, match=r"^ct\.document_mask: document_ids must be an integer tensor of shape"):
        ct.document_mask(ids)
    with pytest.raises(TypeError, match=r"^ct\.document_block_mask: document_ids must be an integer tensor"):
        ct.document_block_mask(ids)


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-4, ValueError), (2.0, TypeError), (True, TypeError)])
def test_block_size_follows_the_rule_for_ints(value, error):
    with pytest.raises(error, match=r"^ct\.document_block_mask: block_size must be a positive int, got "):
        ct.document_block_mask(torch.zeros(8, dtype=torch.int64), block_size=value)


def test_packed_rows_cache_into_a_memory_mapped_store_read_a_batch_at_a_time(tmp_path):
    packed = ct.pack([[1, 2, 3], [4, 5], [6, 7, 8, 9], [3]], 4)
    cached = ct.cache(packed, tmp_path / "store", progress=False)
    batch = cached.read_batch([2, 0])
    for name in packed.rows:
        assert torch.equal(batch[name], packed.rows[name][[2, 0]])

from collections import OrderedDict, UserDict, defaultdict

import pytest
import torch
from helpers import STRUCTURES, Pair, get_xy, make_batch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from composetrain import leading_size, split_batch
from composetrain.core.batching import split_weighted
from composetrain.core.protocol import Context


@given(size=st.integers(1, 40), n=st.integers(1, 16), structure=st.sampled_from(STRUCTURES))
def test_split_covers_the_batch_in_order_with_near_equal_nonempty_pieces(size, n, structure):
    batch = make_batch(size, structure)
    pieces = split_batch(batch, n)
    sizes = [leading_size(p) for p in pieces]
    assert len(pieces) == min(n, size)
    assert all(s >= 1 for s in sizes) and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # torch.tensor_split: larger pieces first
    x, y = get_xy(batch)
    assert torch.equal(torch.cat([get_xy(p)[0] for p in pieces]), x)
    assert torch.equal(torch.cat([get_xy(p)[1] for p in pieces]), y)
    assert all(type(p) is type(batch) for p in pieces)


def test_pieces_are_views_and_passthrough_leaves_are_shared():
    x = torch.randn(6, 2)
    scale = torch.tensor(2.0)
    pieces = split_batch({"x": x, "scale": scale, "name": "abc", "ids": None}, 3)
    for i, p in enumerate(pieces):
        assert p["x"]._base is x  # a view: no copy
        assert torch.equal(p["x"], x[2 * i : 2 * i + 2])
        assert p["scale"] is scale and p["name"] == "abc" and p["ids"] is None


def test_container_types_survive_the_split():
    dd = defaultdict(list, x=torch.arange(4))
    ud = UserDict(x=torch.arange(4))
    od = OrderedDict(b=torch.arange(4), a=torch.arange(4))
    p_dd, p_ud, p_od, p_dc = (split_batch(b, 2)[1] for b in (dd, ud, od, Pair(torch.arange(4), torch.arange(4), "t")))
    assert isinstance(p_dd, defaultdict) and p_dd.default_factory is list and p_dd["x"].tolist() == [2, 3]
    assert isinstance(p_ud, UserDict) and p_ud["x"].tolist() == [2, 3]
    assert list(p_od) == ["b", "a"]
    assert isinstance(p_dc, Pair) and p_dc.tag == "t" and p_dc.y.tolist() == [2, 3]
    assert dd["x"].tolist() == [0, 1, 2, 3] and ud["x"].tolist() == [0, 1, 2, 3]  # originals unchanged


def test_leading_size_of_batches_without_tensors_is_none():
    assert leading_size(("a", 3, None)) is None
    assert leading_size({"t": torch.tensor(1.0)}) is None
    assert leading_size((torch.zeros(3, 2), torch.tensor(0.5))) == 3


def test_disagreeing_leading_sizes_name_every_tensor():
    with pytest.raises(ValueError, match=r"split_batch: .*batch\['x'\] has 8, batch\['y'\]\[0\] has 7"):
        split_batch({"x": torch.zeros(8, 2), "y": [torch.zeros(7)]}, 2)


def test_a_list_of_one_value_per_sample_that_no_piece_could_follow_is_refused():
    """Strings collated into a list (default_collate), one per sample: every piece would get all of them. Every
    splitter refuses them alike (accumulate, data_parallel, split_batch), naming where they are."""
    batch = {"x": torch.zeros(6, 2), "meta": {"names": list("abcdef")}}
    with pytest.raises(ValueError, match=r"split_batch: batch\['meta'\]\['names'\] is a list of 6 values, one"):
        split_batch(batch, 2)
    with pytest.raises(ValueError, match=r"data_parallel.*batch\[1\] is a list of 4 values, one per sample"):
        split_weighted((torch.zeros(4, 3), [None] * 4), 2, context((torch.zeros(4, 3),)), "data_parallel", "shard")
    assert split_batch(batch, 1) == [batch]  # a batch left whole is the step's as it came
    assert [p["names"] for p in split_batch({"x": torch.zeros(6, 2), "names": tuple("abcdef")}, 2)] == [
        tuple("abcdef")
    ] * 2


def test_unsplittable_and_empty_batches_are_clear_errors():
    with pytest.raises(ValueError, match="no tensor with a batch dimension"):
        split_batch(["a", "b"], 2)
    with pytest.raises(ValueError, match="empty"):
        split_batch((torch.zeros(0, 3), torch.zeros(0)), 2)


def context(batch, weight=None):
    units = float(leading_size(batch) if weight is None else weight(batch))
    return Context(nn.Identity(), weight, total_weight=units, piece_weight=units)


def count_ones(batch):
    return batch["mask"].sum()


@given(size=st.integers(1, 40), n=st.integers(1, 16), weighted=st.booleans(), seed=st.integers(0, 999))
def test_split_weighted_gives_each_piece_its_units_and_they_add_up(size, n, weighted, seed):
    g = torch.Generator().manual_seed(seed)
    batch = {"x": torch.randn(size, 3, generator=g), "mask": torch.randint(1, 4, (size,), generator=g)}
    weight = count_ones if weighted else None
    pieces, units = split_weighted(batch, n, context(batch, weight), "test", "micro-batch")
    assert [leading_size(p) for p in pieces] == [leading_size(p) for p in split_batch(batch, n)]
    expected = [float(count_ones(p) if weighted else leading_size(p)) for p in pieces]
    assert units == expected and sum(units) == context(batch, weight).piece_weight


def test_split_weighted_passes_a_batch_that_stays_whole_through_unweighed():
    calls = []

    def weight(batch):
        calls.append(1)
        return 5

    scalars = {"scale": torch.tensor(2.0)}
    ctx = Context(nn.Identity(), weight, total_weight=5.0, piece_weight=5.0)
    assert split_weighted(scalars, 1, ctx, "test", "shard") == ([scalars], [5.0])
    one = (torch.zeros(1, 3),)
    assert split_weighted(one, 4, ctx, "test", "shard") == ([one], [5.0])
    assert calls == []  # the whole batch was weighed by the caller already


def test_split_weighted_refuses_counts_that_do_not_add_up_or_batches_it_cannot_split():
    batch = {"x": torch.zeros(6, 2), "mask": torch.ones(6)}
    ctx = Context(nn.Identity(), lambda b: 1, total_weight=1.0, piece_weight=1.0)
    with pytest.raises(ValueError, match=r"^who: weight gave 3.0 units over the shards \[1.0, 1.0, 1.0\] but 1.0 for"):
        split_weighted(batch, 3, ctx, "who", "shard")
    with pytest.raises(ValueError, match=r"^who: cannot split the batch into 2 micro-batches: it holds no tensor"):
        split_weighted((torch.tensor(1.0), "tag"), 2, ctx, "who", "micro-batch")

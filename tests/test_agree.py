"""launch.agree: what the ranks decide alike (differing, fewest, largest, all_true, any_true, from_rank0,
gathered), on the default group and on a group of their own, on two real gloo processes; and alone.

The functions named in ``pool.run`` are this module's own: each spawned rank imports it by name.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from composetrain.launch import agree

_groups: dict[str, Any] = {}


def _group(which: str) -> Any:
    """None (the default group) or a gloo group of every rank, made once per rank (every rank makes it)."""
    if which == "default":
        return None
    if which not in _groups:
        _groups[which] = dist.new_group(backend="gloo")
    return _groups[which]


def every_answer(rank: int, world: int, which: str) -> dict[str, Any]:
    """Each function once on values that differ by rank, and on values every rank shares."""
    group = _group(which)
    return {
        "world": agree.world(group),
        "fewest": agree.fewest(10 + 3 * rank, group),
        "fewest_negative": agree.fewest(-rank, group),
        "largest": agree.largest([float(rank), -float(rank), 0.5, -2.0 + 3 * rank], group),
        "all_true_mixed": agree.all_true(rank == 0, group),
        "all_true_all": agree.all_true(True, group),
        "all_true_none": agree.all_true(False, group),
        "any_true_mixed": agree.any_true(rank == world - 1, group),
        "any_true_all": agree.any_true(True, group),
        "any_true_none": agree.any_true(False, group),
        "from_rank0": agree.from_rank0({"rank": rank, "names": [f"w{rank}"]}, group),
        "gathered": agree.gathered((rank, f"r{rank}"), group),
        "differing_same": agree.differing(("roles", ["accumulate", "clip"]), group),
        "differing_rank": agree.differing(("rank", rank), group),
        "differing_type": agree.differing(1 if rank == 0 else 1.0, group),  # equal, but not to every check
        "device": str(agree.collective_device(group)),
    }


def differing_of(rank: int, world: int, values: list[Any]) -> list[Any] | None:
    return agree.differing(values[rank])


def test_two_ranks_agree_alike_on_the_default_group_and_on_their_own(pool):
    for which in ("default", "own"):
        answers = pool.run(__name__, "every_answer", which)
        assert answers[0] == answers[1], which  # every rank learns the same
        got = answers[0]
        assert got["world"] == 2
        assert got["fewest"] == 10 and got["fewest_negative"] == -1
        assert got["largest"] == [1.0, 0.0, 0.5, 1.0]
        assert (got["all_true_mixed"], got["all_true_all"], got["all_true_none"]) == (False, True, False)
        assert (got["any_true_mixed"], got["any_true_all"], got["any_true_none"]) == (True, True, False)
        assert got["from_rank0"] == {"rank": 0, "names": ["w0"]}
        assert got["gathered"] == [(0, "r0"), (1, "r1")]
        assert got["differing_same"] is None
        assert got["differing_rank"] == [("rank", 0), ("rank", 1)]
        assert got["differing_type"] == [1, 1.0]
        assert got["device"] == "cpu"  # gloo takes CPU tensors


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner),
    max_leaves=6,
)


@settings(max_examples=25)
@given(first=values, second=values, same=st.booleans())
def test_differing_gathers_exactly_when_the_reprs_differ(pool, first, second, same):
    chosen = [first, first if same else second]
    answers = pool.run(__name__, "differing_of", chosen)
    assert answers[0] == answers[1]
    if repr(chosen[0]) == repr(chosen[1]):
        assert answers[0] is None
    else:
        assert answers[0] == chosen


def test_alone_every_function_answers_with_this_process_value():
    assert not dist.is_initialized()
    assert agree.world() == 1
    assert agree.differing(object()) is None
    assert agree.fewest(7) == 7
    assert agree.largest([1, 2.5]) == [1.0, 2.5]
    assert (agree.all_true(False), agree.all_true(True), agree.any_true(False), agree.any_true(True)) == (
        False,
        True,
        False,
        True,
    )
    mine = {"a": [1]}
    assert agree.from_rank0(mine) is mine
    assert agree.gathered(mine) == [mine]
    assert str(agree.collective_device()) == "cpu"

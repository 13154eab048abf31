import itertools
import math

import pytest
import torch
from helpers import (
    assert_states_close,
    assert_states_equal,
    assert_untouched,
    classify,
    composed,
    make_batch,
    make_state,
    snapshot,
)
from hypothesis import given
from hypothesis import strategies as st
from test_precision import batch32, poisoned, state32

import composetrain as ct


def hand_clipped_update(state, batch, max_norm, norm_type=2.0):
    loss, _ = classify(state.model, batch)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(state.model.parameters(), max_norm, norm_type=norm_type)
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    return norm


@given(
    max_norm=st.floats(0.01, 10.0),
    norm_type=st.sampled_from([2.0, 1.0, math.inf]),
    n=st.integers(1, 6),
    size=st.integers(1, 24),
    seed=st.integers(0, 999),
)
def test_clipping_equals_clip_grad_norm_by_hand(max_norm, norm_type, n, size, seed):
    """float64: the clipped update of accumulated gradients equals the textbook loop's."""
    ours, theirs = make_state(seed), make_state(seed)
    train = ct.clip_grad_norm(max_norm, norm_type=norm_type)(ct.accumulate(n)(classify))
    for i in range(3):
        batch = make_batch(size, seed=seed + i)
        out = train(ours, batch)
        norm = hand_clipped_update(theirs, batch, max_norm, norm_type)
        torch.testing.assert_close(out.metrics["grad_norm"], norm, rtol=1e-10, atol=1e-12)
    assert_states_close(ours, theirs)


def test_without_a_split_clipping_is_bit_exact():
    ours, theirs = make_state(1), make_state(1)
    for i in range(4):
        out = ct.clip_grad_norm(0.1)(classify)(ours, make_batch(16, seed=i))
        assert torch.equal(out.metrics["grad_norm"], hand_clipped_update(theirs, make_batch(16, seed=i), 0.1))
    assert_states_equal(ours, theirs)


PARTS = {
    "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
    "mixed_precision(dtype='fp16')": ct.mixed_precision(dtype="fp16"),
    "accumulate(3)": ct.accumulate(3),
}
ORDERS = [  # every nesting of clip, mixed_precision(fp16) and accumulate(3), as the composed step prints
    "".join(p + "(" for p in order) + "step" + ")" * 3 for order in itertools.permutations(PARTS)
]


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_clipping_sees_unscaled_gradients_in_every_order(order):
    """Every nesting gives the same updates, norms and skips, bit for bit, overflows included."""
    bad = {3, 4, 5}  # the micro-batches of the second update
    reference, ours = state32(2, scheduler=False), state32(2, scheduler=False)
    ref_step, our_step = composed(ORDERS[0], PARTS, poisoned(bad)), composed(order, PARTS, poisoned(bad))
    for i in range(4):
        batch = batch32(12, seed=i)
        expected, got = ref_step(reference, batch), our_step(ours, batch)
        assert got.skipped == expected.skipped == (i == 1)
        norms = got.metrics["grad_norm"], expected.metrics["grad_norm"]
        torch.testing.assert_close(*norms, rtol=0, atol=0, equal_nan=True)
        assert bool(got.metrics["grad_norm"].isfinite()) is not got.skipped  # a skipped update reports inf/nan
    assert_states_equal(ours, reference)


def test_the_reported_norm_is_before_clipping_and_the_update_uses_the_clipped_gradients():
    state = make_state(scheduler=False)
    seen = []
    original = state.optimizer.step

    def step_spy(*a, **k):
        seen.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in state.model.parameters()])))
        return original(*a, **k)

    state.optimizer.step = step_spy
    out = ct.clip_grad_norm(1e-3)(classify)(state, make_batch(16))
    assert out.metrics["grad_norm"] > 1e-3
    torch.testing.assert_close(seen[0], torch.tensor(1e-3, dtype=torch.float64), rtol=1e-5, atol=0)


@pytest.mark.parametrize(
    ("args", "error", "pattern"),
    [
        ((0,), ValueError, r"clip_grad_norm: max_norm must be a positive, finite number, got 0"),
        ((-1.0,), ValueError, r"got -1.0"),
        ((math.inf,), ValueError, r"got inf"),
        ((math.nan,), ValueError, r"got nan"),
        (("1",), TypeError, r"clip_grad_norm: max_norm must be a positive, finite number, got '1' \(str\)"),
        ((True,), TypeError, r"got True \(bool\)"),
    ],
)
def test_bad_max_norm_is_a_clear_error(args, error, pattern):
    with pytest.raises(error, match=pattern):
        ct.clip_grad_norm(*args)


def test_bad_norm_type_and_metric_clashes_are_clear_errors():
    with pytest.raises(ValueError, match=r"norm_type must be a positive number, got 0"):
        ct.clip_grad_norm(1.0, norm_type=0)

    def step(model, batch):
        loss, _ = classify(model, batch)
        return loss, {"grad_norm": 1.0}

    state = make_state()
    before = snapshot(state)
    with pytest.raises(ValueError, match=r"returns metrics \['grad_norm'\] that a transform reports as well"):
        ct.clip_grad_norm(1.0)(ct.accumulate(2)(step))(state, make_batch(4))
    assert_untouched(state, before)
    assert repr(ct.clip_grad_norm(1.0, norm_type=math.inf)(step)) == "clip_grad_norm(1.0, norm_type=inf)(step)"

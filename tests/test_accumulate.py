import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import STRUCTURES, assert_states_close, assert_untouched, classify, make_batch, make_state, snapshot
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import composetrain as ct

UPDATES = 3


def run_both(train, reference, batches, seed=0, **state_kw):
    """Apply ``train`` and ``reference`` to twin states; return both states and outputs."""
    a, b = make_state(seed, **state_kw), make_state(seed, **state_kw)
    outs = [(train(a, batch), reference(b, batch)) for batch in batches]
    return a, b, outs


def assert_outputs_close(out, ref, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(out.loss, ref.loss, rtol=rtol, atol=atol)
    assert out.metrics.keys() == ref.metrics.keys()
    for k in out.metrics:
        torch.testing.assert_close(out.metrics[k], ref.metrics[k], rtol=rtol, atol=atol, check_dtype=False)


# -- exact large-batch equivalence (float64) ---------------------------------------------------------
@given(
    size=st.integers(1, 40),
    n=st.integers(1, 16),
    structure=st.sampled_from(STRUCTURES),
    optimizer=st.sampled_from(["sgd", "adamw"]),
    seed=st.integers(0, 2**16),
)
def test_accumulate_equals_the_plain_step_on_the_whole_batch(size, n, structure, optimizer, seed):
    batches = [make_batch(size, structure, seed=seed + i) for i in range(UPDATES)]
    a, b, outs = run_both(ct.accumulate(n)(classify), ct.train_step(classify), batches, seed, optimizer=optimizer)
    for out, ref in outs:
        assert_outputs_close(out, ref)
    assert_states_close(a, b)
    assert a.step == UPDATES and a.scheduler.last_epoch == UPDATES


@given(outer=st.integers(1, 5), inner=st.integers(1, 5), size=st.integers(1, 30), seed=st.integers(0, 999))
def test_nested_accumulation_is_still_the_large_batch_update(outer, inner, size, seed):
    batches = [make_batch(size, "nested", seed=seed + i) for i in range(UPDATES)]
    train = ct.compose(ct.accumulate(outer), ct.accumulate(inner))(classify)
    a, b, outs = run_both(train, ct.train_step(classify), batches, seed)
    for out, ref in outs:
        assert_outputs_close(out, ref)
    assert_states_close(a, b)


@given(size=st.integers(1, 5), extra=st.integers(1, 11))
def test_a_batch_smaller_than_n_makes_one_micro_batch_per_sample(size, extra):
    seen = []

    def step(model, batch):
        seen.append(batch[0].shape[0])
        return classify(model, batch)

    a, b, outs = run_both(ct.accumulate(size + extra)(step), ct.train_step(classify), [make_batch(size)])
    assert seen == [1] * size
    assert_outputs_close(*outs[0])
    assert_states_close(a, b)


def test_the_short_last_batch_is_weighted_by_its_real_size():
    """Lightning issue 19987: a 10-sample batch in 4 micro-batches is 3+3+2+2, not 4 equal quarters."""
    seen = []

    def step(model, batch):
        seen.append(batch[0].shape[0])
        return classify(model, batch)

    a, b, (pair,) = run_both(ct.accumulate(4)(step), ct.train_step(classify), [make_batch(10)])
    assert seen == [3, 3, 2, 2]
    assert_outputs_close(*pair)
    assert_states_close(a, b)


# -- token-level losses ---------------------------------------------------------------------------
VOCAB, PAD = 7, -100


def token_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(VOCAB, 6), nn.Tanh(), nn.Linear(6, VOCAB)).double()


def padded_batch(lengths, width, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (len(lengths), width), generator=g)
    labels = torch.randint(0, VOCAB, (len(lengths), width), generator=g)
    for row, length in enumerate(lengths):
        labels[row, length:] = PAD
    return {"tokens": tokens, "labels": labels}


def token_step(model, batch):
    """Mean cross-entropy over the real (non-padded) tokens of the batch."""
    logits = model(batch["tokens"])
    real = batch["labels"] != PAD
    acc = (logits.argmax(-1) == batch["labels"])[real].double().mean()
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=PAD), {"token_acc": acc}


def real_tokens(batch):
    return (batch["labels"] != PAD).sum()


@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=24),
    n=st.integers(1, 8),
    seed=st.integers(0, 999),
)
def test_token_weighted_accumulation_is_exact_with_random_padding(lengths, n, seed):
    batches = [padded_batch(lengths, 12, seed + i) for i in range(UPDATES)]
    a = make_state(model=token_model(seed))
    b = make_state(model=token_model(seed))
    train = ct.accumulate(n, weight=real_tokens)(token_step)
    for batch in batches:
        assert_outputs_close(train(a, batch), ct.train_step(token_step)(b, batch))
    assert_states_close(a, b)


@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=24),
    outer=st.integers(1, 4),
    inner=st.integers(1, 4),
    weighted=st.sampled_from(["outer", "inner"]),
    seed=st.integers(0, 999),
)
def test_one_weight_serves_every_accumulate_of_a_composition(lengths, outer, inner, weighted, seed):
    """weight= on either accumulate of a nesting counts units for both."""
    w_outer, w_inner = (real_tokens, None) if weighted == "outer" else (None, real_tokens)
    train = ct.accumulate(outer, weight=w_outer)(ct.accumulate(inner, weight=w_inner)(token_step))
    a, b = make_state(model=token_model(seed)), make_state(model=token_model(seed))
    for i in range(UPDATES):
        batch = padded_batch(lengths, 12, seed + i)
        assert_outputs_close(train(a, batch), ct.train_step(token_step)(b, batch))
    assert_states_close(a, b)


def test_averaging_micro_batch_means_is_wrong_for_token_losses():
    """transformers PR 34191: without weight=, unequal token counts give a different (wrong) update."""
    batch = padded_batch([12, 12, 1, 1], 12, seed=0)
    exact, naive, ref = (make_state(model=token_model(0)) for _ in range(3))
    ct.accumulate(2, weight=real_tokens)(token_step)(exact, batch)
    ct.accumulate(2)(token_step)(naive, batch)
    ct.train_step(token_step)(ref, batch)
    assert_states_close(exact, ref)
    with pytest.raises(AssertionError):
        assert_states_close(naive, ref, rtol=1e-6, atol=1e-8)


# -- float32 ----------------------------------------------------------------------------------
@given(size=st.integers(2, 40), n=st.integers(2, 16), seed=st.integers(0, 999))
def test_float32_agrees_to_float32_rounding(size, n, seed):
    def state32(s):
        return make_state(model=make_state(s).model.float())

    batches = [make_batch(size, seed=seed + i, dtype=torch.float32) for i in range(UPDATES)]
    a, b = state32(seed), state32(seed)
    for batch in batches:
        assert_outputs_close(ct.accumulate(n)(classify)(a, batch), ct.train_step(classify)(b, batch), 1e-5, 1e-6)
    assert_states_close(a, b, rtol=1e-5, atol=1e-6)


# -- counting -----------------------------------------------------------------------------------
@given(n=st.integers(1, 8), updates=st.integers(1, 5))
def test_step_counts_optimizer_updates_not_micro_batches(n, updates):
    state = make_state(optimizer="adamw")
    for i in range(updates):
        ct.accumulate(n)(classify)(state, make_batch(16, seed=i))
    assert state.step == updates
    assert state.scheduler.last_epoch == updates
    assert all(s["step"] == updates for s in state.optimizer.state_dict()["state"].values())


# -- BatchNorm ----------------------------------------------------------------------------------
def test_batchnorm_in_training_mode_is_detected_and_reported():
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).double()
    state = make_state(model=model)
    with pytest.warns(UserWarning, match=r"accumulate\(2\)\(classify\): the model has BatchNorm.*issue 46516"):
        ct.accumulate(2)(classify)(state, make_batch(8))
    model.eval()  # eval-mode BatchNorm uses running statistics: accumulation is exact again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.accumulate(2)(classify)(state, make_batch(8))


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "error", "shown"),
    [
        (0, ValueError, "got 0"),
        (-3, ValueError, "got -3"),
        (2.5, TypeError, r"got 2.5 \(float\)"),
        ("4", TypeError, r"got '4' \(str\)"),
        (True, TypeError, r"got True \(bool\)"),
        (None, TypeError, r"got None \(NoneType\)"),
    ],
)
def test_bad_n_is_a_clear_error(n, error, shown):
    with pytest.raises(error, match=rf"^accumulate: n must be a positive int, {shown}.*(e\.g\.|use) accumulate\("):
        ct.accumulate(n)


def test_accumulate_used_bare_says_what_to_write():
    with pytest.raises(TypeError, match=r"^accumulate: n is required, got a step instead: <function classify.*"):
        ct.accumulate(classify)
    with pytest.raises(TypeError, match=r"give n first, then the step: accumulate\(4\)\(step\)$"):
        ct.accumulate(ct.train_step(classify))


def test_numpy_numbers_are_accepted_for_n_and_weights():
    np = pytest.importorskip("numpy")
    assert repr(ct.accumulate(np.int64(3))(classify)) == "accumulate(3)(classify)"
    a, b = make_state(), make_state()
    ct.accumulate(3, weight=lambda m: np.int64(m[0].shape[0]))(classify)(a, make_batch(7))
    ct.train_step(classify)(b, make_batch(7))
    assert_states_close(a, b)


def test_a_batch_without_units_is_refused_before_any_forward():
    state = make_state()
    before = snapshot(state)
    with pytest.raises(ValueError, match=r"weight returned 0 for the batch; .*positive, finite"):
        ct.accumulate(2, weight=lambda b: 0)(classify)(state, make_batch(6))
    assert_untouched(state, before)


def test_weight_must_be_callable():
    with pytest.raises(TypeError, match=r"accumulate: weight must be a function .*got 3 \(int\)"):
        ct.accumulate(2, weight=3)


@pytest.mark.parametrize(
    ("value", "error", "pattern"),
    [
        (0, ValueError, r"weight returned 0 for micro-batch 3 of 4; .*positive, finite"),
        (-2, ValueError, r"weight returned -2 for micro-batch 3 of 4"),
        (math.nan, ValueError, r"weight returned nan for micro-batch 3 of 4"),
        (math.inf, ValueError, r"weight returned inf for micro-batch 3 of 4"),
        ("3", TypeError, r"weight must return a number or a one-element tensor, got '3' \(str\) for micro-batch 3"),
        (torch.ones(2), TypeError, r"weight must return a number or a one-element tensor, got tensor\(\[1., 1.\]\)"),
    ],
)
def test_bad_weights_are_clear_errors_and_change_nothing(value, error, pattern):
    calls = []

    def weight(micro):
        calls.append(1)
        # the whole batch is weighed first (call 1), then micro-batches 1..4 (calls 2..5)
        return value if len(calls) == 4 else torch.tensor(float(micro[0].shape[0]))

    state = make_state()
    before = snapshot(state)
    with pytest.raises(error, match=r"^accumulate\(4, weight=weight\)\(classify\): " + pattern):
        ct.accumulate(4, weight=weight)(classify)(state, make_batch(8))
    assert_untouched(state, before)


def test_a_weight_that_does_not_add_up_is_refused():
    state = make_state()
    before = snapshot(state)
    with pytest.raises(ValueError, match=r"weight gave 4.0 units over the micro-batches \[1.0, 1.0, 1.0, 1.0\] but 1"):
        ct.accumulate(4, weight=lambda b: 1)(classify)(state, make_batch(8))
    assert_untouched(state, before)


def test_two_different_weights_in_one_composition_are_refused():
    with pytest.raises(ValueError, match=r"accumulate\(2, weight=<lambda>\): the step inside already counts units"):
        ct.accumulate(2, weight=lambda b: 1)(ct.accumulate(2, weight=real_tokens)(token_step))
    # an accumulate without weight= inherits the one inside
    train = ct.accumulate(2)(ct.accumulate(2, weight=real_tokens)(token_step))
    assert train.weight is real_tokens


# -- batches that stay whole ----------------------------------------------------------------------
def scalar_step(model, batch):
    scale = batch["scale"] * batch["shift"] if isinstance(batch, dict) else batch[0]
    return (model(torch.ones(2, 5, dtype=torch.float64) * scale) ** 2).mean()


@pytest.mark.parametrize(
    "batch", [(torch.tensor(2.0),), {"scale": torch.tensor(0.5), "shift": torch.tensor(3.0)}], ids=["tuple", "dict"]
)
def test_a_batch_of_scalars_passes_through_accumulate_1_as_the_plain_step_takes_it(batch):
    a, b, (pair,) = run_both(ct.accumulate(1)(scalar_step), ct.train_step(scalar_step), [batch])
    assert_outputs_close(*pair)
    assert_states_close(a, b)
    # a weight is asked once, for the whole batch: nothing is split
    a, b, (pair,) = run_both(ct.accumulate(1, weight=lambda b: 3)(scalar_step), ct.train_step(scalar_step), [batch])
    assert_states_close(a, b)


def test_splitting_a_batch_of_scalars_is_a_clear_error_that_changes_nothing():
    state = make_state()
    before = snapshot(state)
    with pytest.raises(
        ValueError,
        match=r"^accumulate\(2\)\(scalar_step\): cannot split the batch into 2 micro-batches: it holds no tensor "
        r"with a batch dimension \(got \(tensor\(2.\),\) \(tuple\)\); give the per-sample data a leading batch "
        r"dimension, or do not split",
    ):
        ct.accumulate(2)(scalar_step)(state, (torch.tensor(2.0),))
    assert_untouched(state, before)

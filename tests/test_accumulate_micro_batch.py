"""accumulate(micro_batch=m): the micro-batch size instead of the count, the last micro-batch short and weighted
exactly, so that memory per process stays bounded whatever batch each process gets."""

import warnings

import pytest
import torch
from helpers import (
    STRUCTURES,
    assert_states_close,
    assert_states_equal,
    assert_untouched,
    classify,
    get_xy,
    make_batch,
    make_state,
    snapshot,
)
from hypothesis import given
from hypothesis import strategies as st
from test_accumulate import assert_outputs_close, padded_batch, real_tokens, token_model, token_step
from test_precision import LOW, batch32, state32
from torch import nn

import composetrain as ct

UPDATES = 3
EXACT = {"rtol": 1e-12, "atol": 1e-14}  # float64: the whole batch's update, to rounding


def cuts(size, m):
    """The micro-batch sizes a loop over slices of m makes: b=10, m=4 -> 4, 4, 2."""
    return [min(m, size - start) for start in range(0, size, m)]


def recording(seen):
    def step(model, batch):
        seen.append(batch)
        return classify(model, batch)

    return step


# -- exact large-batch equivalence (float64) ---------------------------------------------------------
@given(
    size=st.integers(1, 40),
    m=st.integers(1, 16),
    structure=st.sampled_from(STRUCTURES),
    optimizer=st.sampled_from(["sgd", "adamw"]),
    seed=st.integers(0, 2**16),
)
def test_micro_batch_equals_the_plain_step_on_the_whole_batch(size, m, structure, optimizer, seed):
    a, b = make_state(seed, optimizer=optimizer), make_state(seed, optimizer=optimizer)
    train = ct.accumulate(micro_batch=m)(classify)
    for i in range(UPDATES):
        batch = make_batch(size, structure, seed=seed + i)
        assert_outputs_close(train(a, batch), ct.train_step(classify)(b, batch), **EXACT)
    assert_states_close(a, b, **EXACT)
    assert a.step == UPDATES and a.scheduler.last_epoch == UPDATES


def test_the_short_last_micro_batch_is_weighted_by_its_real_size():
    """b=10, m=4: 4, 4, 2, the last one weighted 2/10, not 1/3."""
    seen = []
    a, b = make_state(3), make_state(3)
    batch = make_batch(10, seed=5)
    assert_outputs_close(ct.accumulate(micro_batch=4)(recording(seen))(a, batch), ct.train_step(classify)(b, batch))
    assert [len(get_xy(s)[1]) for s in seen] == [4, 4, 2]
    assert_states_close(a, b, **EXACT)


def test_a_timm_style_loop_sees_the_same_consecutive_chunks():
    """timm and nanoGPT slice the batch as x[0:4], x[4:8], x[8:10]: the step sees exactly those, in order."""
    seen = []
    x, y = make_batch(10, seed=1)
    ct.accumulate(micro_batch=4)(recording(seen))(make_state(), (x, y))
    assert len(seen) == 3
    for (sx, sy), (start, stop) in zip(seen, [(0, 4), (4, 8), (8, 10)], strict=True):
        assert torch.equal(sx, x[start:stop]) and torch.equal(sy, y[start:stop])


@given(size=st.integers(1, 60), m=st.integers(1, 20))
def test_the_count_follows_the_batch_and_no_micro_batch_exceeds_m(size, m):
    """A process given half the batch (a job resumed on twice the processes) runs half the micro-batches, each of
    at most m samples; a batch of at most m samples is one micro-batch."""
    seen = []
    ct.accumulate(micro_batch=m)(recording(seen))(make_state(), make_batch(size))
    assert [len(get_xy(s)[1]) for s in seen] == cuts(size, m)
    assert max(len(get_xy(s)[1]) for s in seen) == min(m, size)


@given(size=st.integers(1, 12), extra=st.integers(0, 8))
def test_a_batch_of_at_most_m_samples_is_the_plain_step_bit_for_bit(size, extra):
    a, b = make_state(1), make_state(1)
    for i in range(UPDATES):
        out = ct.accumulate(micro_batch=size + extra)(classify)(a, make_batch(size, seed=i))
        ref = ct.train_step(classify)(b, make_batch(size, seed=i))
        assert torch.equal(out.loss, ref.loss)
    assert_states_equal(a, b)


def scalar_step(model, batch):
    return (model(torch.ones(2, 5, dtype=torch.float64) * batch[0]) ** 2).mean()


def test_a_batch_without_a_batch_dimension_is_one_sample_and_stays_whole():
    """As the plain step counts it (one sample): nothing to cut, whatever m."""
    a, b = make_state(), make_state()
    out = ct.accumulate(micro_batch=2)(scalar_step)(a, (torch.tensor(2.0),))
    ref = ct.train_step(scalar_step)(b, (torch.tensor(2.0),))
    assert torch.equal(out.loss, ref.loss)
    assert_states_equal(a, b)


def test_per_sample_values_that_are_not_tensors_are_refused_before_any_pass():
    """default_collate makes a batch's strings a list, one per sample: cut into micro-batches of 4, each would get
    all 10 beside its own 4 inputs, and a step that pairs them (zip, indexing) would pair samples with others'."""
    x, y = make_batch(10)
    state, seen = make_state(), []

    def step(model, batch):
        seen.append((len(batch["x"]), len(batch["names"])))
        return classify(model, batch)

    before = snapshot(state)
    for names in ([f"sample {i}" for i in range(10)], [[i, i + 1] for i in range(10)]):  # strings, token lists
        with pytest.raises(ValueError, match=r"batch\['names'\] is a list of 10 values, one per sample"):
            ct.accumulate(micro_batch=4)(step)(state, {"x": x, "y": y, "names": names})
        assert seen == []
        assert_untouched(state, before)
    # what is not one value per sample passes whole to every micro-batch, as documented: a tuple, a list of
    # another length, a list that holds tensors (a structure: each tensor is cut), and any batch left whole
    for names in (tuple(f"s{i}" for i in range(10)), ["a", "b", "c"], [y, "tag"] * 5):
        seen.clear()
        ct.accumulate(micro_batch=4)(step)(make_state(), {"x": x, "y": y, "names": names})
        assert [n for _, n in seen] == [len(names)] * 3
    seen.clear()
    ct.accumulate(micro_batch=10)(step)(make_state(), {"x": x, "y": y, "names": [str(i) for i in range(10)]})
    assert seen == [(10, 10)]


def test_forward_size_says_how_large_the_compositions_forwards_are():
    """What ct.run reads to evaluate a run defined by its global batch in batches no larger than its training's."""
    from composetrain.transforms._auto_accumulate import MicroBatchMemory

    state = make_state()
    assert ct.train_step(classify).forward_size(state, 10) == 10
    assert ct.accumulate(micro_batch=4)(classify).forward_size(state, 10) == 4
    assert ct.accumulate(micro_batch=4)(classify).forward_size(state, 3) == 3
    assert ct.accumulate(4)(classify).forward_size(state, 10) == 3  # 3, 3, 2, 2
    assert ct.accumulate(4)(classify).forward_size(state, 2) == 1
    assert ct.compose(ct.accumulate(2), ct.accumulate(micro_batch=3))(classify).forward_size(state, 10) == 3
    assert ct.data_parallel(["cpu", "cpu"])(classify).forward_size(state, 7) == 4
    assert ct.distributed(ct.accumulate(micro_batch=2)(classify)).forward_size(state, 9) == 2
    auto = ct.accumulate("auto")(classify)
    assert auto.forward_size(state, 10) == 10  # nothing ran out of memory yet: whole batches
    state.transform_state("accumulate_auto", MicroBatchMemory).micro_batch = 3
    assert auto.forward_size(state, 10) == 3  # 4 micro-batches: 3, 3, 2, 2


FORWARDS = {  # compositions of accumulate's two forms, by p and q
    "size": lambda p, q: ct.accumulate(micro_batch=p),
    "count": lambda p, q: ct.accumulate(p),
    "size(count)": lambda p, q: ct.compose(ct.accumulate(micro_batch=p), ct.accumulate(q)),
    "count(size)": lambda p, q: ct.compose(ct.accumulate(p), ct.accumulate(micro_batch=q)),
    "size(size)": lambda p, q: ct.compose(ct.accumulate(micro_batch=p), ct.accumulate(micro_batch=q)),
}


@given(nesting=st.sampled_from(sorted(FORWARDS)), p=st.integers(1, 7), q=st.integers(1, 5), size=st.integers(1, 30))
def test_forward_size_is_the_largest_batch_the_plain_step_is_called_with(nesting, p, q, size):
    """micro_batch=4 cuts 9 samples 4, 4, 1: its forwards hold min(m, b) samples (it said 3)."""
    seen = []

    def step(model, batch):
        seen.append(len(batch[0]))
        return classify(model, batch)

    train = FORWARDS[nesting](p, q)(step)
    state = make_state()
    train(state, make_batch(size))
    assert train.forward_size(state, size) == max(seen)


# -- nestings --------------------------------------------------------------------------------------
NESTINGS = {
    "size(size)": lambda p, q: ct.compose(ct.accumulate(micro_batch=p), ct.accumulate(micro_batch=q)),
    "size(count)": lambda p, q: ct.compose(ct.accumulate(micro_batch=p), ct.accumulate(q)),
    "count(size)": lambda p, q: ct.compose(ct.accumulate(p), ct.accumulate(micro_batch=q)),
    "auto(size)": lambda p, q: ct.compose(ct.accumulate("auto"), ct.accumulate(micro_batch=q)),
}


@given(
    nesting=st.sampled_from(sorted(NESTINGS)),
    outer=st.integers(1, 7),
    inner=st.integers(1, 5),
    size=st.integers(1, 30),
    seed=st.integers(0, 999),
)
def test_nested_accumulation_is_still_the_large_batch_update(nesting, outer, inner, size, seed):
    train = NESTINGS[nesting](outer, inner)(classify)
    a, b = make_state(seed), make_state(seed)
    for i in range(UPDATES):
        batch = make_batch(size, "nested", seed=seed + i)
        out = train(a, batch)
        out.metrics.pop("micro_batch", None)  # accumulate('auto')'s report
        assert_outputs_close(out, ct.train_step(classify)(b, batch), **EXACT)
    assert_states_close(a, b, **EXACT)


# -- token-level losses ----------------------------------------------------------------------------
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=24),
    m=st.integers(1, 9),
    nesting=st.sampled_from(["alone", "outer", "inner"]),
    seed=st.integers(0, 999),
)
def test_token_weighted_micro_batches_are_exact_with_random_padding(lengths, m, nesting, seed):
    """The short last micro-batch holds its own number of real tokens: weighted by it, not by its samples."""
    train = {
        "alone": lambda: ct.accumulate(micro_batch=m, weight=real_tokens)(token_step),
        "outer": lambda: ct.accumulate(micro_batch=m, weight=real_tokens)(ct.accumulate(2)(token_step)),
        "inner": lambda: ct.accumulate(3)(ct.accumulate(micro_batch=m, weight=real_tokens)(token_step)),
    }[nesting]()
    a, b = make_state(model=token_model(seed)), make_state(model=token_model(seed))
    for i in range(UPDATES):
        batch = padded_batch(lengths, 12, seed + i)
        assert_outputs_close(train(a, batch), ct.train_step(token_step)(b, batch), **EXACT)
    assert_states_close(a, b, **EXACT)


def test_without_weight_a_short_last_micro_batch_of_long_sequences_is_misweighed():
    """The same cut weighted by samples is a different (wrong) token-level update: weight= is what makes it exact."""
    batch = padded_batch([1, 1, 1, 1, 12, 12], 12, seed=0)
    exact, naive, ref = (make_state(model=token_model(0)) for _ in range(3))
    ct.accumulate(micro_batch=4, weight=real_tokens)(token_step)(exact, batch)
    ct.accumulate(micro_batch=4)(token_step)(naive, batch)
    ct.train_step(token_step)(ref, batch)
    assert_states_close(exact, ref, **EXACT)
    with pytest.raises(AssertionError):
        assert_states_close(naive, ref, rtol=1e-6, atol=1e-8)


# -- with the other transforms ---------------------------------------------------------------------
@given(dtype=st.sampled_from(LOW), m=st.integers(1, 6), size=st.integers(1, 24), seed=st.integers(0, 999))
def test_mixed_precision_either_side_agrees_bit_for_bit(dtype, m, size, seed):
    outer = ct.mixed_precision(dtype=dtype)(ct.accumulate(micro_batch=m)(classify))
    inner = ct.accumulate(micro_batch=m)(ct.mixed_precision(dtype=dtype)(classify))
    a, b = state32(seed), state32(seed)
    for i in range(UPDATES):
        out_a, out_b = outer(a, batch32(size, seed + i)), inner(b, batch32(size, seed + i))
        assert torch.equal(out_a.loss, out_b.loss) and out_a.skipped == out_b.skipped
    assert_states_equal(a, b)


@given(dtype=st.sampled_from(LOW), m=st.integers(1, 6), count=st.integers(1, 5), seed=st.integers(0, 999))
def test_under_mixed_precision_equal_cuts_are_accumulate_n_bit_for_bit(dtype, m, count, seed):
    """When m divides the batch, micro_batch=m cuts it as accumulate(b // m) does: the same 16-bit update."""
    by_size = ct.mixed_precision(dtype=dtype)(ct.accumulate(micro_batch=m)(classify))
    by_count = ct.mixed_precision(dtype=dtype)(ct.accumulate(count)(classify))
    a, b = state32(seed), state32(seed)
    for i in range(UPDATES):
        out_a, out_b = by_size(a, batch32(m * count, seed + i)), by_count(b, batch32(m * count, seed + i))
        assert torch.equal(out_a.loss, out_b.loss)
    assert_states_equal(a, b)
    assert a.state_dict()["transforms"] == b.state_dict()["transforms"]  # the loss scale too


@given(
    max_norm=st.floats(0.01, 2.0),
    m=st.integers(1, 6),
    size=st.integers(1, 24),
    outside=st.booleans(),
    seed=st.integers(0, 999),
)
def test_clipping_sees_the_whole_batchs_gradient(max_norm, m, size, outside, seed):
    """float64: the clipped update (and the norm reported) of the micro-batches is the whole batch's."""
    clip = ct.clip_grad_norm(max_norm)
    train = clip(ct.accumulate(micro_batch=m)(classify)) if outside else ct.accumulate(micro_batch=m)(clip(classify))
    a, b = make_state(seed), make_state(seed)
    for i in range(UPDATES):
        batch = make_batch(size, seed=seed + i)
        assert_outputs_close(train(a, batch), clip(classify)(b, batch), **EXACT)
    assert_states_close(a, b, **EXACT)


def test_batchnorm_in_training_mode_is_reported():
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).double()
    with pytest.warns(UserWarning, match=r"^accumulate\(micro_batch=4\)\(classify\): the model has BatchNorm"):
        ct.accumulate(micro_batch=4)(classify)(make_state(model=model), make_batch(10))
    with warnings.catch_warnings():  # one micro-batch: the whole batch's statistics
        warnings.simplefilter("error")
        ct.accumulate(micro_batch=10)(classify)(make_state(model=model), make_batch(10))


# -- state -----------------------------------------------------------------------------------------
def test_a_resumed_state_continues_exactly():
    """The size is configuration, not state: a checkpoint holds nothing of it, and a state loaded from one
    continues as if never interrupted (on any batch size)."""
    train = ct.accumulate(micro_batch=3)(classify)
    whole, first = make_state(2, optimizer="adamw"), make_state(2, optimizer="adamw")
    sizes = [10, 7, 8, 5]
    for i, size in enumerate(sizes):
        train(whole, make_batch(size, seed=i))
    for i, size in enumerate(sizes[:2]):
        train(first, make_batch(size, seed=i))
    saved = first.state_dict()
    assert saved["transforms"] == {}
    resumed = make_state(9, optimizer="adamw")
    resumed.load_state_dict(saved)
    for i, size in enumerate(sizes[2:], start=2):
        train(resumed, make_batch(size, seed=i))
    assert_states_equal(resumed, whole)


def test_out_metrics_are_the_plain_steps():
    """Unlike accumulate('auto'), whose size changes, micro_batch= reports nothing: the size is in the label."""
    out = ct.accumulate(micro_batch=4)(classify)(make_state(), make_batch(10))
    assert out.metrics.keys() == ct.train_step(classify)(make_state(), make_batch(10)).metrics.keys()
    assert ct.accumulate(micro_batch=4)(classify).reported == frozenset()


# -- how it prints and compares --------------------------------------------------------------------
def test_it_prints_as_written_and_compares_by_its_size():
    assert repr(ct.accumulate(micro_batch=4)) == "accumulate(micro_batch=4)"
    assert repr(ct.accumulate(micro_batch=4)(classify)) == "accumulate(micro_batch=4)(classify)"
    assert (
        repr(ct.accumulate(micro_batch=4, weight=real_tokens)(token_step))
        == "accumulate(micro_batch=4, weight=real_tokens)(token_step)"
    )
    assert repr(ct.compose(ct.accumulate(2), ct.accumulate(micro_batch=8))(classify)) == (
        "accumulate(2)(accumulate(micro_batch=8)(classify))"
    )
    assert repr(ct.accumulate(4)(classify)) == "accumulate(4)(classify)"  # accumulate(4) keeps meaning n=4
    one, again = ct.accumulate(micro_batch=2)(classify), ct.accumulate(micro_batch=2)(classify)
    assert one == again and hash(one) == hash(again)
    assert one != ct.accumulate(2)(classify) and one != ct.accumulate(micro_batch=3)(classify)
    np = pytest.importorskip("numpy")
    assert repr(ct.accumulate(micro_batch=np.int64(3))) == "accumulate(micro_batch=3)"


def test_it_is_refused_inside_accumulate_auto_as_accumulate_n_is():
    with pytest.raises(ValueError, match=r"^accumulate\(micro_batch=2\): cannot wrap a step that applies "):
        ct.accumulate(micro_batch=2)(ct.accumulate("auto")(classify))


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("m", "error", "shown"),
    [
        (0, ValueError, r"got 0 \(int\)"),
        (-3, ValueError, r"got -3 \(int\)"),
        (2.5, TypeError, r"got 2.5 \(float\)"),
        ("4", TypeError, r"got '4' \(str\)"),
        (True, TypeError, r"got True \(bool\)"),
        (torch.tensor(4), TypeError, r"got tensor\(4\)"),
    ],
)
def test_bad_micro_batch_is_a_clear_error(m, error, shown):
    with pytest.raises(error, match=rf"^accumulate: micro_batch must be a positive int, {shown}.*accumulate\(micro"):
        ct.accumulate(micro_batch=m)


@pytest.mark.parametrize("n", [4, 1, 0])
def test_n_and_micro_batch_together_are_refused_naming_both(n):
    fix = r"give one: the number of micro-batches, accumulate\(4\), or their size, accumulate\(micro_batch=8\)"
    with pytest.raises(TypeError, match=rf"^accumulate: n={n} and micro_batch=8 are both given; {fix}$"):
        ct.accumulate(n, micro_batch=8)


def test_auto_with_a_starting_size_is_refused_with_what_to_use():
    with pytest.raises(TypeError) as caught:
        ct.accumulate("auto", micro_batch=8)
    said = str(caught.value)
    assert "accumulate(micro_batch=8)" in said and "accumulate('auto')" in said, said


def test_neither_n_nor_micro_batch_is_refused_naming_both():
    for call in (lambda: ct.accumulate(), lambda: ct.accumulate(None, micro_batch=None)):
        with pytest.raises(TypeError) as caught:
            call()
        assert str(caught.value) == (
            "accumulate: n must be a positive int, got None (NoneType), and micro_batch is not given either; give "
            "one: the number of micro-batches, e.g. accumulate(4), or their size, e.g. accumulate(micro_batch=8)"
        )

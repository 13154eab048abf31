"""ct.check: a user's composition against the plain step on copies: right ones agree (within their dtype's
tolerance), a planted wrong one is found and its layer named, the user's state and batch are never touched."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_untouched, classify, make_batch, make_state, snapshot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import composetrain as ct


class Twice(ct.TrainStep):
    """A planted bug: a transform that scales the loss for backward a second time (gradients doubled)."""

    label = "twice"

    def grads(self, state, batch, ctx):
        return self._inner().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda loss: loss * 2)))


def summed(model, batch):
    """A planted bug: a step whose loss is the batch's sum, not its mean (accumulate weighs means)."""
    loss, _ = classify(model, batch)
    return loss * len(batch[0])


def blocks(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


RIGHT = {
    "accumulate": lambda: ct.accumulate(3)(classify),
    "clip": lambda: ct.clip_grad_norm(0.05)(ct.accumulate(2)(classify)),
    "fp16": lambda: ct.compose(ct.clip_grad_norm(0.5), ct.mixed_precision(dtype="fp16"), ct.accumulate(4))(classify),
    "checkpoint_activations": lambda: ct.checkpoint_activations(["0", "3"])(ct.accumulate(2)(classify)),
    "data_parallel": lambda: ct.data_parallel(["cpu", "cpu"])(ct.accumulate(2)(classify)),
    "distributed (one process)": lambda: ct.distributed(ct.accumulate(2)(classify)),
    "pipeline_split": lambda: ct.pipeline_split(
        {"0": "cpu", "1": "cpu", "2": "cpu", "3": "cpu", "4": "cpu", "5": "cpu"}, chunks=2
    )(classify),
}


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_right_compositions_agree_in_float64_and_leave_the_users_state_and_batch_alone(name):
    state = make_state(1, model=blocks().to(torch.float32))  # float32: check casts its copies
    state.model.eval()  # dropout off: the reference and the composition draw differently under data_parallel
    batch = make_batch(12, seed=3, dtype=torch.float32)
    ct.accumulate(2)(classify)(state, make_batch(12, seed=2, dtype=torch.float32))  # momentum, a scheduler step
    before, kept = snapshot(state), copy.deepcopy(batch)
    result = ct.check(RIGHT[name](), state, batch)
    assert result and result.ok and result.dtype is torch.float64, result
    assert result.diverges_at is None and result.layers == ()
    assert result.grads.largest <= 1e-12 and result.params.largest <= 1e-12 and result.grads.scale > 0
    assert_untouched(state, before)
    assert state.model.training is False and next(state.model.parameters()).dtype is torch.float32
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(batch, kept, strict=True))


def test_both_sides_draw_the_same_random_numbers_and_the_users_generators_stay_as_they_were():
    """Dropout in training mode: the plain step and the composition start from the same generator states (one
    mask for 12 samples is three masks for 4 in turn), and the user's stream goes on as if check never ran."""
    state = make_state(1, model=blocks())
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    for train in (ct.checkpoint_activations(["3"])(classify), ct.accumulate(3)(classify)):
        result = ct.check(train, state, make_batch(12))
        assert result and result.params.largest < 1e-15, result
    assert torch.equal(torch.rand(3), expected)


def test_mixed_precision_is_checked_in_its_own_precision_with_its_tolerance():
    state = make_state(2, model=blocks().eval().to(torch.float32))
    batch = make_batch(16, seed=1, dtype=torch.float32)
    for dtype, rtol in (("bf16", 5e-2), ("fp16", 1e-2)):
        result = ct.check(ct.mixed_precision(dtype=dtype)(ct.accumulate(2)(classify)), state, batch, dtype=None)
        assert result, result
        assert result.dtype is torch.float32 and result.rtol == rtol and result.grads.largest > 0  # rounded
    assert ct.check(ct.mixed_precision(dtype="bf16")(classify), state, batch).dtype is torch.float64
    tight = ct.check(ct.mixed_precision(dtype="bf16")(classify), state, batch, dtype=None, rtol=1e-6, atol=0)
    assert not tight and tight.diverges_at == "mixed_precision(dtype='bf16')"


def test_mixed_precision_in_fp32_is_a_no_op_judged_at_the_models_precision():
    """mixed_precision("fp32") enters no autocast (a config's toggle): nothing rounds lower than float32, so a
    1% wrong composition inside it is named, not passed at bf16's 5e-2."""
    state = make_state(2, model=blocks().eval().to(torch.float32))
    batch = make_batch(16, seed=1, dtype=torch.float32)

    class Percent(Twice):
        label = "percent"

        def grads(self, state, batch, ctx):
            return self._inner().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda v: v * 1.01)))

    for dtype in ("fp32", torch.float32):
        right = ct.check(ct.mixed_precision(dtype=dtype)(ct.accumulate(2)(classify)), state, batch, dtype=None)
        assert right and right.lowest is torch.float32 and right.rtol == 1e-4, right
        wrong = ct.check(ct.mixed_precision(dtype=dtype)(Percent(ct.train_step(classify))), state, batch, dtype=None)
        assert not wrong and wrong.diverges_at == "percent" and wrong.rtol == 1e-4, wrong


@pytest.mark.parametrize(
    ("build", "layer"),
    [
        (
            lambda: ct.compose(ct.clip_grad_norm(1.0), ct.mixed_precision(dtype="fp16"), ct.accumulate(2))(
                Twice(ct.train_step(classify))
            ),
            "twice",
        ),
        (lambda: ct.accumulate(2)(Twice(ct.data_parallel(["cpu", "cpu"])(classify))), "twice"),
        (lambda: ct.clip_grad_norm(10.0)(ct.accumulate(3)(summed)), "accumulate(3)"),
        (lambda: ct.data_parallel(["cpu", "cpu"])(summed), "data_parallel(['cpu', 'cpu'])"),
    ],
    ids=["loss scaled twice", "loss scaled twice, inside", "summed loss", "summed loss, data_parallel"],
)
def test_a_planted_wrong_composition_is_found_and_its_layer_named(build, layer):
    state = make_state(4, model=blocks().eval())
    before = snapshot(state)
    result = ct.check(build(), state, make_batch(12, seed=5))
    assert not result and result.diverges_at == layer, result
    assert result.grads.relative > 1e-3 and result.params.relative > 1e-6
    assert result.layers[-1] == (result.layers[-1][0], False) and all(ok for _, ok in result.layers[:-1])
    assert result.layers[-1][0].startswith(layer)
    assert f"first diverging layer: {layer}" in repr(result) and "DIFFERS from" in repr(result)
    assert_untouched(state, before)


def test_the_reference_keeps_the_transforms_that_change_the_update():
    """clip_grad_norm changes the update: the reference clips too; the gradients compared are before clipping."""
    state = make_state(3, model=blocks().eval())
    result = ct.check(ct.accumulate(2)(ct.clip_grad_norm(1e-3)(classify)), state, make_batch(12))
    assert result and result.reference == "clip_grad_norm(0.001)(classify)"
    assert result.grads.scale > 1e-2  # unclipped gradients (a norm of 1e-3 would bound them)

    class Halve(Twice):  # a user's own transform that means to change the update, and says so
        label = "halve"
        changes_update = True

        def grads(self, state, batch, ctx):
            return self._inner().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda v: v / 2)))

    result = ct.check(ct.accumulate(2)(Halve(ct.train_step(classify))), state, make_batch(12))
    assert result and result.reference == "halve(classify)"


def test_a_model_that_refuses_float64_is_checked_in_its_own_precision():
    def float32_only(model, batch):
        x, y = batch
        if x.dtype is not torch.float32:
            raise TypeError("this kernel takes float32 only")
        return F.cross_entropy(model(x), y)

    state = make_state(model=blocks().eval().float())
    result = ct.check(ct.accumulate(2)(float32_only), state, make_batch(12, dtype=torch.float32))
    assert result and result.dtype is torch.float32 and (result.rtol, result.atol) == (1e-4, 1e-6), result


def test_bad_arguments_are_clear_errors():
    state = make_state()
    with pytest.raises(TypeError, match=r"check: state must be a ct.TrainState, got"):
        ct.check(classify, state.model, make_batch(4))
    with pytest.raises(TypeError, match=r"check: dtype must be a floating torch.dtype or None, got torch.int64"):
        ct.check(classify, state, make_batch(4), dtype=torch.int64)
    with pytest.raises(TypeError, match=r"check: train_step must be a function step\(model, batch\)"):
        ct.check(ct.accumulate(2), state, make_batch(4))
    state.unusable = "a transform failed half-way"
    with pytest.raises(RuntimeError, match=r"check: a transform failed half-way"):
        ct.check(classify, state, make_batch(4))


def test_the_result_reads_well():
    result = ct.check(ct.accumulate(2)(classify), make_state(), make_batch(8))
    text = repr(result).splitlines()
    assert (
        text[0] == "check: accumulate(2)(classify) agrees with train_step(classify) in float64 (rtol=1e-09, atol=1e-12)"
    )
    assert [line.split(":")[0].strip() for line in text[1:]] == ["loss", "gradients", "parameters"]


def test_a_composition_of_several_processes_is_refused_under_a_group_and_the_rest_checked(pool):
    a, b = pool.run(__name__, "under_a_group")
    assert a == b
    assert a["refused"].startswith("check: distributed(accumulate(2)(classify)) synchronises the 2 processes")
    assert a["inside"] is True


def test_a_non_finite_update_is_a_difference():
    class Poison(Twice):
        label = "poison"

        def grads(self, state, batch, ctx):
            return self._inner().grads(state, batch, ctx._replace(scale_loss=(lambda v: v * float("nan"),)))

    result = ct.check(ct.accumulate(2)(Poison(ct.train_step(classify))), make_state(), make_batch(8))
    assert not result and result.diverges_at == "poison" and result.grads.largest != result.grads.largest  # NaN


PARTS = {
    "accumulate": lambda: ct.accumulate(3),
    "clip": lambda: ct.clip_grad_norm(0.05),
    "fp16": lambda: ct.mixed_precision(dtype="fp16"),
    "checkpoint": lambda: ct.checkpoint_activations(["3"]),
    "data_parallel": lambda: ct.data_parallel(["cpu", "cpu"]),
}


@settings(max_examples=15)
@given(order=st.permutations(sorted(PARTS)), keep=st.integers(1, len(PARTS)), planted=st.integers(0, 5))
def test_any_accepted_order_agrees_and_a_planted_layer_is_found_wherever_it_sits(order, keep, planted):
    """Compositions drawn from the transforms, in any order the library accepts: check agrees; with Twice planted
    at any depth (0: around the plain step), it names Twice."""
    chosen = [PARTS[name]() for name in order[:keep]]
    try:
        right = ct.compose(*chosen)(classify)
    except ValueError:  # an order refused when built (data_parallel around mixed_precision)
        assume(False)
    state = make_state(6, model=blocks().eval())
    assert ct.check(right, state, make_batch(10, seed=planted)), right
    at = min(planted, len(chosen))
    wrong = ct.compose(*chosen[: len(chosen) - at])(Twice(ct.compose(*chosen[len(chosen) - at :])(classify)))
    result = ct.check(wrong, state, make_batch(10, seed=planted))
    assert not result and result.diverges_at == "twice", result


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.check under a process group.


def under_a_group(rank, world):
    """A composition that synchronises the group is refused; the part inside it is checked on each rank."""
    state = make_state(rank)
    try:
        ct.check(ct.distributed(ct.accumulate(2)(classify)), state, make_batch(8, seed=rank))
        refused = "no error"
    except ValueError as e:
        refused = str(e)
    return {"refused": refused, "inside": bool(ct.check(ct.accumulate(2)(classify), state, make_batch(8, seed=rank)))}

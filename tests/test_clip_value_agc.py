"""ct.clip_grad_value and ct.adaptive_clip_grad: timm's dispatch_clip_grad modes "value" and "agc" as transforms,
bit for bit timm's functions on the unscaled, whole-batch gradients (float64, float32 and bf16 autocast), in the
update phase as clip_grad_norm, so in any nesting order; AGC's exclusions (timm's head) checked before the update."""

import pytest
import torch
from helpers import assert_states_equal, assert_untouched, classify, make_batch, make_state, mlp, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

import composetrain as ct

timm_utils = pytest.importorskip("timm.utils")


def by_hand(state, batch, mode, value, *, head=False, autocast=None, **options):
    """timm's train.py: backward, dispatch_clip_grad(model_parameters(model, exclude_head='agc' in mode)), step."""
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        loss, _ = classify(state.model, batch)
    loss.backward()
    params = list(state.model.parameters())
    timm_utils.dispatch_clip_grad(params[:-2] if head else params, value, mode=mode, **options)
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1


def head(state):
    return [n for n, _ in state.model.named_parameters()][-2:]  # timm's model_parameters(exclude_head=True)


@settings(max_examples=20, deadline=None)
@given(
    mode=st.sampled_from(["value", "agc"]),
    value=st.sampled_from([1e-3, 0.01, 0.05, 0.5]),
    norm_type=st.sampled_from([2.0, 1.0]),
    exclude_head=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 999),
)
def test_each_mode_is_timms_dispatch_clip_grad_bit_for_bit(mode, value, norm_type, exclude_head, dtype, seed):
    ours, theirs = (make_state(seed, model=mlp(seed, dtype)) for _ in range(2))
    if mode == "value":
        clip, options, exclude_head = ct.clip_grad_value(value), {}, False
    else:
        names = head(ours) if exclude_head else None
        clip, options = ct.adaptive_clip_grad(value, norm_type=norm_type, exclude=names), {"norm_type": norm_type}
    train = clip(classify)
    for i in range(3):
        batch = make_batch(16, seed=seed + i, dtype=dtype)
        train(ours, batch)
        by_hand(theirs, batch, mode, value, head=exclude_head, **options)
    assert_states_equal(ours, theirs)


@pytest.mark.parametrize("mode", ["value", "agc"])
def test_under_bf16_autocast_it_clips_the_gradients_timm_does(mode):
    """mixed_precision("bf16") checks the gradients at scale 1 (multiplying them by 1): the same bits."""
    ours, theirs = (make_state(3, model=mlp(3, torch.float32)) for _ in range(2))
    clip = ct.clip_grad_value(0.01) if mode == "value" else ct.adaptive_clip_grad(0.02, exclude=head(ours))
    train = clip(ct.mixed_precision("bf16")(classify))
    for i in range(3):
        batch = make_batch(16, seed=i, dtype=torch.float32)
        train(ours, batch)
        by_hand(theirs, batch, mode, 0.01 if mode == "value" else 0.02, head=mode == "agc", autocast=torch.bfloat16)
    assert_states_equal(ours, theirs)


def test_they_clip_what_they_say():
    """The test above compares against something that clips: some gradients change, some do not."""
    state = make_state(0)
    batch = make_batch(16)
    classify(state.model, batch)[0].backward()
    grads = [p.grad.clone() for p in state.model.parameters()]
    state.optimizer.zero_grad()
    for clip in (ct.clip_grad_value(0.01), ct.adaptive_clip_grad(0.01)):
        seen = []
        spy = ct.train_step(classify)
        original = spy.update

        def update(st, ctx, seen=seen, original=original):
            seen.extend(p.grad.clone() for p in st.model.parameters())
            return original(st, ctx)

        spy.update = update
        clip(spy)(make_state(0), batch)
        assert any(not torch.equal(a, b) for a, b in zip(seen, grads, strict=True))
    assert max(g.abs().max() for g in seen) <= max(g.abs().max() for g in grads)


@given(order=st.permutations(["clip", "accumulate", "mixed_precision"]), mode=st.sampled_from(["value", "agc"]))
@settings(max_examples=12, deadline=None)
def test_any_nesting_order_clips_the_whole_batchs_unscaled_gradients(order, mode):
    transforms = {
        "clip": ct.clip_grad_value(0.01) if mode == "value" else ct.adaptive_clip_grad(0.02),
        "accumulate": ct.accumulate(micro_batch=4),
        "mixed_precision": ct.mixed_precision("fp16"),
    }
    reference = ct.compose(transforms["clip"], transforms["mixed_precision"], transforms["accumulate"])(classify)
    train = ct.compose(*(transforms[t] for t in order))(classify)
    a, b = make_state(2, model=mlp(2, torch.float32)), make_state(2, model=mlp(2, torch.float32))
    for i in range(3):
        batch = make_batch(10, seed=i, dtype=torch.float32)
        train(a, batch)
        reference(b, batch)
    assert_states_equal(a, b)


# -- refusals ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "error", "pattern"),
    [
        (lambda: ct.clip_grad_value(0), ValueError, r"^clip_grad_value: clip_value must be a positive, finite number"),
        (lambda: ct.clip_grad_value("1"), TypeError, r"^clip_grad_value: clip_value must be a positive, finite"),
        (lambda: ct.adaptive_clip_grad(-1.0), ValueError, r"^adaptive_clip_grad: clip_factor must be a positive"),
        (lambda: ct.adaptive_clip_grad(0.01, eps=0), ValueError, r"^adaptive_clip_grad: eps must be a positive"),
        (lambda: ct.adaptive_clip_grad(0.01, exclude=3), TypeError, r"^adaptive_clip_grad: exclude must be "),
        (lambda: ct.adaptive_clip_grad(0.01, exclude="fc.weight"), TypeError, r"exclude must be .*got 'fc.weight'"),
        (lambda: ct.adaptive_clip_grad(0.01, exclude=[1]), TypeError, r"exclude must be .*got \[1\]"),
    ],
)
def test_bad_arguments_are_refused_when_built(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


def test_an_excluded_name_the_model_lacks_is_refused_before_anything_changes():
    state = make_state(0)
    before = snapshot(state)
    train = ct.adaptive_clip_grad(0.01, exclude=["2.weight", "head.bias"])(classify)
    with pytest.raises(ValueError) as e:
        train(state, make_batch(8))
    said = str(e.value)
    assert said.startswith("adaptive_clip_grad(0.01, exclude=['2.weight', 'head.bias'])(classify): exclude names ")
    assert "['head.bias']" in said and "'0.weight'" in said
    assert_untouched(state, before)


def test_a_predicate_excludes_by_name():
    ours, theirs = make_state(1), make_state(1)
    train = ct.adaptive_clip_grad(0.01, exclude=lambda name: name.startswith("2."))(classify)
    for i in range(2):
        train(ours, make_batch(16, seed=i))
        by_hand(theirs, make_batch(16, seed=i), "agc", 0.01, head=True)
    assert_states_equal(ours, theirs)


def test_they_print_and_compare_as_configured():
    assert repr(ct.clip_grad_value(0.5)) == "clip_grad_value(0.5)"
    assert (
        repr(ct.adaptive_clip_grad(0.01, eps=1e-4, norm_type=1.0))
        == "adaptive_clip_grad(0.01, eps=0.0001, norm_type=1.0)"
    )
    assert repr(ct.adaptive_clip_grad(0.01)(classify)) == "adaptive_clip_grad(0.01)(classify)"
    assert ct.clip_grad_value(0.5)(classify) == ct.clip_grad_value(0.5)(classify)
    assert ct.clip_grad_value(0.5)(classify) != ct.clip_grad_value(0.25)(classify)
    assert ct.adaptive_clip_grad(0.01, exclude=["a"])(classify) == ct.adaptive_clip_grad(0.01, exclude=("a",))(classify)


def test_each_may_appear_once_and_beside_clip_grad_norm():
    with pytest.raises(ValueError, match="use clip_grad_value once in a composition"):
        ct.clip_grad_value(1.0)(ct.clip_grad_value(2.0)(classify))
    both = ct.clip_grad_norm(1.0)(ct.clip_grad_value(0.01)(classify))  # clipped by value after the norm: order
    state = make_state(0)
    out = both(state, make_batch(8))
    assert "grad_norm" in out.metrics


def test_the_reported_loss_is_the_plain_steps():
    a, b = make_state(0), make_state(0)
    out = ct.adaptive_clip_grad(0.01)(classify)(a, make_batch(8))
    ref = ct.train_step(classify)(b, make_batch(8))
    assert torch.equal(out.loss, ref.loss) and out.metrics.keys() == ref.metrics.keys()

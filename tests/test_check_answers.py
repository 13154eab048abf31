"""ct.check's answers where it misled (issues 29 and 30): a step that is not deterministic, a reference that does
not fit in memory, a small tensor's wrong update beside a large one, zero tolerance, mixed half and single
precision parameters. Each asserts what check says, against the update worked out by hand where it matters."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_untouched, classify, make_batch, make_state, snapshot
from torch import nn

import composetrain as ct


def test_a_step_drawing_from_its_own_generator_is_said_to_be_not_deterministic():
    """Its own generator is not the user's global ones, which check replays: the plain step disagrees with
    itself, so no layer is to blame (accumulate was named)."""
    own = torch.Generator().manual_seed(0)

    def noisy(model, batch):
        x, y = batch
        return F.cross_entropy(model(x + 0.1 * torch.randn(x.shape, generator=own, dtype=x.dtype)), y)

    state = make_state()
    before = snapshot(state)
    for train in (noisy, ct.accumulate(2)(noisy)):
        result = ct.check(train, state, make_batch(8))
        assert not result and result.diverges_at is None and result.layers == (), result
        assert result.reason is not None and "train_step(noisy) is not deterministic" in result.reason
        assert "a generator of its own" in result.reason and result.reason in repr(result)
    assert_untouched(state, before)
    assert ct.check(ct.accumulate(2)(classify), state, make_batch(8)).reason is None


def fits(limit):
    """classify, out of memory above ``limit`` samples (as tests/test_auto_accumulate.py injects it)."""

    def step(model, batch):
        if batch[0].shape[0] > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return classify(model, batch)

    return step


def test_a_batch_the_plain_step_cannot_fit_is_refused_saying_to_check_a_smaller_one():
    """accumulate("auto") fits the batch by splitting it; the reference is the plain step on the whole batch."""
    state = make_state()
    before = snapshot(state)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    refused = r"check: the plain step train_step\(step\) runs out of memory"
    with pytest.raises(torch.OutOfMemoryError, match=refused) as e:
        ct.check(ct.accumulate("auto")(fits(4)), state, make_batch(12))
    assert "check on a smaller batch" in str(e.value) and "injected" in str(e.value)
    assert torch.equal(torch.rand(3), expected)
    assert_untouched(state, before)
    assert ct.check(ct.accumulate("auto")(fits(4)), state, make_batch(4))


class BigAndSmall(nn.Module):
    """A large weight (1e4, scaled down in the forward) beside a small offset whose update is 1e-6."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(5, 3, dtype=torch.float64)
        self.offset = nn.Parameter(torch.full((3,), 0.1, dtype=torch.float64))
        with torch.no_grad():
            self.linear.weight.mul_(1e4)

    def forward(self, x):
        return self.linear(x) * 1e-4 + self.offset * 1e-3


class FlipOffset(ct.TrainStep):
    """A planted bug: the offset's update goes the wrong way (its gradient negated before the update)."""

    label = "flip"

    def update(self, state, ctx):
        state.model.offset.grad.neg_()
        return self._inner().update(state, ctx)


def test_a_small_tensors_wrong_update_is_a_difference_beside_a_large_one():
    """The tolerance is per tensor: the offset's flipped update (2e-6) was within 1e-9 of the weight's 1e4."""
    model = BigAndSmall()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01))
    result = ct.check(ct.accumulate(2)(FlipOffset(ct.train_step(classify))), state, make_batch(8))
    assert not result and result.diverges_at == "flip" and result.params.where == "offset", result
    assert result.params.scale == pytest.approx(0.1, rel=1e-3) and result.params.relative > 1e-6
    assert ct.check(ct.accumulate(2)(classify), state, make_batch(8))


def test_an_exact_composition_agrees_at_zero_tolerance():
    """issue 30.4: equal is within a tolerance of zero (<=, not <)."""
    state = make_state()
    for train in (classify, ct.accumulate(1)(classify)):
        result = ct.check(train, state, make_batch(8), rtol=0, atol=0)
        assert result and result.grads.largest == 0 and result.params.largest == 0, result
    assert not ct.check(ct.accumulate(2)(classify), state, make_batch(8), rtol=0, atol=0)  # rounded: not bit-exact


class HalfAndSingle(nn.Module):
    def __init__(self, half):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(5, 8).to(half), nn.Linear(8, 3)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x.to(self.first.weight.dtype))).to(self.second.weight.dtype))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_a_model_holding_half_and_single_precision_is_judged_at_the_half(half):
    """issue 30.5: with dtype=None the copies keep both; the first layer's own rounding is no divergence."""
    model = HalfAndSingle(half)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    result = ct.check(ct.accumulate(3)(classify), state, make_batch(12, dtype=torch.float32), dtype=None)
    assert result and result.dtype is half and result.lowest is half, result
    assert result.grads.largest > 0  # rounded differently, within the half's tolerance
    assert ct.check(ct.accumulate(3)(classify), state, make_batch(12, dtype=torch.float32)).dtype is torch.float64


class PoisonLast(ct.TrainStep):
    """A planted bug: the last layer's bias updated with a NaN gradient (every other tensor right)."""

    label = "poison"

    def update(self, state, ctx):
        state.model[2].bias.grad.fill_(float("nan"))
        return self._inner().update(state, ctx)


def test_a_nan_in_one_tensor_is_what_is_reported_not_a_finite_one_beside_it():
    result = ct.check(ct.accumulate(2)(PoisonLast(ct.train_step(classify))), make_state(), make_batch(8))
    assert not result and result.diverges_at == "poison", result
    assert result.params.where == "2.bias" and result.params.largest != result.params.largest, result  # NaN


class HalfThenSingle(HalfAndSingle):
    """Casts between its layers to fixed dtypes: copies that cast every parameter to one dtype fail in it."""

    def forward(self, x):
        return self.second(torch.tanh(self.first(x.to(torch.bfloat16))).float())


class Twice(ct.TrainStep):
    """A planted bug: the loss scaled for backward a second time (gradients doubled)."""

    label = "twice"

    def grads(self, state, batch, ctx):
        return self._inner().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda loss: loss * 2)))


@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_a_model_of_half_and_single_layers_is_peeled_in_the_precisions_it_was_compared_in(dtype):
    """The first comparison keeps each parameter's own dtype (dtype=None, or float64 failing); the comparisons
    after it (the plain step against itself, each layer) cast them all to the lowest one, and the model failed."""
    model = HalfThenSingle(torch.bfloat16)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    batch = make_batch(8, dtype=torch.float32)
    before = snapshot(state)
    result = ct.check(ct.accumulate(2)(Twice(ct.train_step(classify))), state, batch, dtype=dtype)
    assert not result and result.diverges_at == "twice" and result.dtype is torch.bfloat16, result
    assert result.reason is None and [ok for _, ok in result.layers] == [False], result
    assert_untouched(state, before)
    assert ct.check(ct.accumulate(2)(classify), state, batch, dtype=dtype)


def test_a_plain_update_that_is_not_finite_is_said_to_be_so_not_nondeterministic():
    """Adam on a float16 model: its eps (1e-8) is 0 in float16, so a zero second moment divides 0 by 0 and the plain
    update itself holds NaN; NaN differs from NaN, which check took for a step that differs from itself."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).half()
    with torch.no_grad():
        model[0].weight[0].zero_()  # a row whose gradient is exactly 0: 0 / (sqrt(0) + 0) in float16
        model[0].bias[0] = -1.0  # a dead unit: its row's gradient stays 0
    state = ct.TrainState(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    x, y = torch.randn(8, 4).half(), torch.randint(0, 3, (8,))
    result = ct.check(ct.accumulate(2)(classify), state, (x, y), dtype=None)
    assert not result and result.reason is not None, result
    assert "not deterministic" not in result.reason and "not finite" in result.reason, result.reason

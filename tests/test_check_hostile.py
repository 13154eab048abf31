"""ct.check against hostile inputs: a model that fails in float64 after drawing random numbers, complex
parameters, nonsense tolerances, buffers a composition updates wrongly."""

import copy

import pytest
import torch
from helpers import classify, make_batch, make_state
from torch import nn

import composetrain as ct


class DropoutThenFloat32(nn.Module):
    """Dropout draws, then a float32-only path: the float64 attempt fails after using the generator."""

    def __init__(self):
        super().__init__()
        self.drop, self.linear = nn.Dropout(0.5), nn.Linear(5, 3)

    def forward(self, x):
        return self.linear(self.drop(x).float())


def test_the_users_generators_stay_as_they_were_when_float64_fails_half_way():
    torch.manual_seed(0)
    state = make_state(model=DropoutThenFloat32())
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    result = ct.check(ct.accumulate(2)(classify), state, make_batch(12, dtype=torch.float32))
    assert result and result.dtype is torch.float32, result
    assert torch.equal(torch.rand(3), expected)


class Complex(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 3, dtype=torch.complex64))

    def forward(self, x):
        return (x.to(self.w.dtype) @ self.w).abs()


def test_complex_parameters_are_checked_in_complex128_not_cast_to_real():
    """Module.to(float64) casts a complex parameter to real (dropping its imaginary part, with only torch's
    warning): check would compare another model. Its copies are complex128."""
    torch.manual_seed(0)
    state = make_state(model=Complex(), scheduler=False)
    batch = make_batch(12, dtype=torch.float32)
    plain = copy.deepcopy(state)
    ct.train_step(classify)(plain, batch)
    with torch.autograd.set_grad_enabled(True):
        result = ct.check(ct.accumulate(3)(classify), state, batch)
    assert result and result.dtype is torch.float64, result
    assert state.model.w.dtype is torch.complex64 and state.model.w.imag.abs().sum() > 0  # the user's, untouched
    # the reference's update is the complex model's (float32 ~ complex64 digits), not a real-projected one's
    moved = (plain.model.w - state.model.w).abs().max().item()
    assert result.params.scale == pytest.approx(plain.model.w.abs().max().item(), rel=1e-5)
    assert moved > 0


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("rtol", "abc", TypeError),
        ("rtol", -1.0, ValueError),
        ("atol", float("nan"), ValueError),
        ("atol", float("inf"), ValueError),
        ("rtol", True, TypeError),
        ("atol", torch.tensor([1e-3, 1e-3]), TypeError),
    ],
)
def test_nonsense_tolerances_are_clear_errors(option, value, error):
    with pytest.raises(error, match=rf"check: {option} must be a non-negative, finite number, got"):
        ct.check(classify, make_state(), make_batch(4), **{option: value})

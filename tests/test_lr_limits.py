"""scaled_lr and warmup at their edges: results that are not a learning rate, a `then` that returns none."""

import math
import re

import pytest
import torch

import composetrain as ct


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        ((1e300, 10**10, 1), "linear"),  # overflows to inf
        ((0.1, 10**400, 1), "linear"),  # the ratio itself is too large for a float
        ((0.1, 10**400, 1), "sqrt"),
        ((1e-300, 1, 10**300), "linear"),  # underflows to 0
    ],
)
def test_a_scaled_rate_that_is_not_a_positive_finite_number_is_refused(args, rule):
    base_lr, batch, base_batch = args
    pattern = (
        rf"scaled_lr: base_lr={base_lr!r} scaled from base_batch={base_batch} to batch={batch} by the "
        rf"{rule!r} rule is not a positive finite learning rate"
    )
    with pytest.raises(ValueError, match=pattern[:120].replace("(", r"\(").replace("+", r"\+")):
        ct.scaled_lr(base_lr, batch, base_batch, rule=rule)


def test_scaled_rates_within_range_are_unchanged():
    assert ct.scaled_lr(1e300, 100, 10) == 1e300 * 10.0
    assert ct.scaled_lr(0.1, 10**30, 10**28, rule="sqrt") == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        (-0.5, "-0.5 (float)"),
        (math.nan, "nan (float)"),
        (math.inf, "inf (float)"),
        ("1.0", "'1.0' (str)"),
        (None, "None"),
        (True, "True (bool)"),
        (torch.ones(2), "tensor"),
    ],
)
def test_a_then_that_returns_no_multiplier_is_refused_at_its_call(returned, shown):
    multiplier = ct.warmup(2, then=lambda i: returned)
    assert multiplier(0) == 0.5 and multiplier(1) == 1.0  # warming up: `then` not called yet
    with pytest.raises(
        ValueError, match=rf"warmup: then\(0\) returned {re.escape(shown)}.*; it must return a finite number >= 0"
    ):
        multiplier(2)


def test_a_then_that_goes_negative_later_is_caught_when_it_does():
    multiplier = ct.warmup(0, then=lambda i: 1.0 - i / 10)
    assert [multiplier(i) for i in (0, 5, 10)] == [1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match=r"warmup: then\(11\) returned -0.1"):
        multiplier(11)
    assert ct.warmup(0, then=lambda i: torch.tensor(0.25))(3) == 0.25  # a one-element tensor is a number

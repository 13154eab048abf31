"""scaled_lr and warmup at their edges: results that are not a learning rate, a `then` that returns none."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- numbers Python holds but a float does not, and the textbook formulas ---------------------------------------------


def test_a_base_rate_too_large_for_a_float_is_refused_by_name():
    with pytest.raises(ValueError, match=r"scaled_lr: base_lr must be a positive, finite number, got 1000"):
        ct.scaled_lr(10**400, 1, 1)


def test_a_start_too_large_for_a_float_is_refused_by_name():
    with pytest.raises(ValueError, match=r"warmup: start must be a finite number, got 1000"):
        ct.warmup(10, start=10**400)


@pytest.mark.parametrize("steps", [2**53 + 1, 10**400])
def test_a_warmup_too_long_for_a_float_is_refused_when_built(steps):
    with pytest.raises(ValueError, match=r"warmup: steps must be at most 2\*\*53"):
        ct.warmup(steps)
    assert ct.warmup(2**53)(2**53 - 1) == 1.0  # the longest warmup whose count a float holds exactly


def test_a_then_returning_an_int_too_large_for_a_float_is_refused_by_name():
    multiplier = ct.warmup(0, then=lambda i: 10**400)
    with pytest.raises(ValueError, match=r"warmup: then\(0\) returned 1000.* it must return a finite number >= 0"):
        multiplier(0)


@settings(max_examples=300, deadline=None)
@given(
    base_lr=st.floats(min_value=1e-12, max_value=1e3),
    batch=st.integers(1, 2**40),
    base_batch=st.integers(1, 2**40),
    rule=st.sampled_from(["linear", "sqrt"]),
)
def test_scaled_lr_is_the_textbook_formula(base_lr, batch, base_batch, rule):
    ratio = batch / base_batch
    expected = base_lr * (ratio if rule == "linear" else math.sqrt(ratio))
    assert ct.scaled_lr(base_lr, batch, base_batch, rule=rule) == expected


@settings(max_examples=200, deadline=None)
@given(steps=st.integers(0, 10**6), start=st.floats(0, 1, exclude_max=True), update=st.integers(0, 2 * 10**6))
def test_warmup_is_the_textbook_formula(steps, start, update):
    expected = start + (1 - start) * (update + 1) / steps if update < steps else 1.0
    assert ct.warmup(steps, start=start)(update) == expected


def test_warmup_in_lambda_lr_matches_a_hand_written_loop_in_float64():
    torch.manual_seed(0)
    w0 = torch.randn(5, dtype=torch.float64)
    data = [torch.randn(5, dtype=torch.float64) for _ in range(12)]
    cosine = lambda i: 0.5 * (1 + math.cos(math.pi * min(i, 6) / 6))  # noqa: E731
    lr = ct.scaled_lr(0.05, batch=256, base_batch=64)

    w = w0.clone().requires_grad_()
    opt = torch.optim.SGD([w], lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, ct.warmup(4, start=0.1, then=cosine))
    for x in data:
        opt.zero_grad()
        ((w * x).sum() ** 2).backward()
        opt.step()
        sched.step()

    v, buf = w0.clone(), torch.zeros(5, dtype=torch.float64)
    for i, x in enumerate(data):
        rate = 0.05 * (256 / 64) * (0.1 + 0.9 * (i + 1) / 4 if i < 4 else cosine(i - 4))  # LambdaLR: base * factor
        grad = 2 * (v * x).sum() * x
        buf = grad.clone() if i == 0 else buf.mul(0.9).add(grad)  # SGD's own ops, so that only the rates can differ
        v = v.add(buf, alpha=-rate)
    torch.testing.assert_close(w.detach(), v, rtol=0, atol=0)

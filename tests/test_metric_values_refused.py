"""Metric names and values that ct.run cannot log exactly are refused with a clear error, before the update
when the step's own output shows it, never cut, merged or crashed on at a log point (found by probing)."""

import fractions
import json

import numpy as np
import pytest
import run_script
import torch
from helpers import assert_untouched, snapshot

import composetrain as ct

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5}


class Name(str):
    """A str subclass that hashes as itself (an identifier type, a tag): a dict holds it beside its text."""

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    def __repr__(self):
        return f"Name({str.__str__(self)!r})"


def train(step, tmp=None, state=None, **options):
    state = state or run_script.state()
    result = ct.run(step, state, run_script.dataset(), checkpoint_dir=tmp, **{**OPTIONS, **options})
    return state, result


def with_metrics(extra):
    def step(model, batch):
        loss, metrics = run_script.step(model, batch)
        return loss, extra(metrics)

    return step


def test_two_training_metrics_that_name_the_same_text_are_refused_not_merged():
    step = with_metrics(lambda m: {Name("acc"): m["acc"], "acc": 1 - m["acc"]})
    twice = r"train_step\(step\): the step returns two metrics named 'acc' \(Name\('acc'\) and 'acc'\)"
    with pytest.raises(ValueError, match=twice):
        train(step, max_steps=2, log_every=1)


def test_two_eval_metrics_that_name_the_same_text_are_refused_not_merged():
    evaluate = lambda model, batch: {Name("acc"): 0.25, "acc": 0.75}  # noqa: E731
    with pytest.raises(ValueError, match=r"run: eval_step returns two metrics named 'acc'"):
        train(run_script.step, max_steps=2, eval_every=2, eval_step=evaluate, eval_data=run_script.dataset(24))


@pytest.mark.parametrize(
    "value",
    [
        np.complex128(1 + 2j),
        np.array([1 + 2j]),
        np.str_("0.5x"),
        np.str_("0.5"),
        np.array(None, dtype=object),
        10**400,
        np.array([0.5, 0.5]),
    ],
    ids=["np-complex", "np-complex-array", "np-str", "np-str-of-a-number", "np-object", "huge-int", "np-2-elements"],
)
def test_a_training_metric_that_is_no_real_number_is_refused_before_the_update(value):
    state = run_script.state()
    before = snapshot(state)
    step = with_metrics(lambda m: {**m, "z": value})
    with pytest.raises(TypeError, match=r"train_step\(step\): metric 'z' must be a scalar tensor or a number, got "):
        train(step, state=state, max_steps=2, log_every=1)
    assert_untouched(state, before)  # refused before backward and optimizer.step


def test_a_training_metric_on_the_meta_device_is_refused_at_its_update_not_at_the_log_point():
    calls = []

    def step(model, batch):
        calls.append(1)
        loss, metrics = run_script.step(model, batch)
        return loss, {**metrics, "m": torch.tensor(1.0, device="meta")}

    meta = r"train_step\(step\): the step returns metric 'm' on the 'meta' device, which holds no value"
    with pytest.raises(TypeError, match=meta):
        train(step, max_steps=4, log_every=4)
    assert len(calls) == 1


def test_an_eval_metric_too_large_for_a_float_is_refused_with_the_metric_named():
    evaluate = lambda model, batch: {"big": 10**400}  # noqa: E731
    with pytest.raises(ValueError, match=r"run: eval_step's metric 'big' must be a scalar"):
        train(run_script.step, max_steps=2, eval_every=2, eval_step=evaluate, eval_data=run_script.dataset(24))


def test_eval_data_given_as_a_dict_is_refused_up_front():
    state = run_script.state()
    before = snapshot(state)
    evaluate = lambda model, batch: {"a": 1.0}  # noqa: E731
    with pytest.raises(TypeError, match=r"run: eval_data must be a Dataset or DataLoader, got \{'x'"):
        train(run_script.step, state=state, max_steps=2, eval_every=2, eval_step=evaluate, eval_data={"x": 1})
    assert_untouched(state, before)


@pytest.mark.parametrize("lr", [torch.tensor(0.05, dtype=torch.float64), np.float32(0.05)], ids=["tensor", "np"])
def test_a_learning_rate_that_is_not_a_python_float_is_logged_as_one(tmp_path, lr):
    """torch.optim takes a tensor lr (Adam(capturable=True), compiled optimizers); the log point wrote it to JSON."""
    state = run_script.state()
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    _, result = train(run_script.step, state=state, max_steps=2, log_every=1, log_file=tmp_path / "m.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in lines] == [r["lr"] for r in result.history] == [float(lr)] * 2
    assert all(type(r["lr"]) is float for r in result.history)


@pytest.mark.parametrize(
    "value",
    [np.float32(0.25), np.int64(3), np.bool_(True), np.array([0.5]), np.array(2.0), True, 7, fractions.Fraction(1, 4)],
    ids=["np-float32", "np-int64", "np-bool", "np-1-element", "np-0-dim", "bool", "int", "fraction"],
)
def test_real_numbers_of_every_kind_are_logged_as_their_value(value):
    _, result = train(with_metrics(lambda m: {**m, "v": value}), max_steps=2, log_every=2)
    assert result.history[0]["v"] == float(np.asarray(value).item())


def test_eval_data_beside_a_loader_that_does_not_batch_says_so():
    loader = torch.utils.data.DataLoader(run_script.dataset(), batch_size=None)
    evaluate = lambda model, batch: {"a": 1.0}  # noqa: E731
    with pytest.raises(ValueError, match=r"has none \(batch_size=None: each item is a batch\)"):
        ct.run(run_script.step, run_script.state(), loader, eval_step=evaluate, eval_data=run_script.dataset(24))


@pytest.mark.parametrize("whose", ["the step", "eval_step"])
def test_a_metric_name_that_utf8_cannot_encode_is_refused_at_the_first_update(tmp_path, whose):
    """A lone surrogate (a file name decoded with surrogateescape) crashed TensorBoard's writer at the log point."""
    bad = "acc\udcff"
    calls = []

    def step(model, batch):
        calls.append(1)
        loss, metrics = run_script.step(model, batch)
        return loss, ({bad: metrics["acc"]} if whose == "the step" else metrics)

    evaluate = lambda model, batch: {bad: 1.0} if whose == "eval_step" else {"e": 1.0}  # noqa: E731
    who = r"train_step\(step\)" if whose == "the step" else "run"  # the step's is refused in its pass
    with pytest.raises(ValueError, match=rf"{who}: {whose} returns metric 'acc\\udcff', which UTF-8 cannot encode"):
        train(
            step,
            tmp_path,
            max_steps=4,
            log_every=2,
            eval_every=1,
            eval_step=evaluate,
            eval_data=run_script.dataset(24),
            tensorboard=True,
        )
    assert len(calls) == 1

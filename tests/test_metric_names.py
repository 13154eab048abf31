"""Metric names: one rule (plain str, not a field of the record), checked where the step returns them,
the same at save and at load; what the driver writes in a record is never overwritten."""

import enum
import json

import numpy as np
import pytest
import run_script
import torch
from helpers import assert_states_equal, assert_untouched, snapshot

import composetrain as ct

# every field ct.run writes in a record of metrics.jsonl (and RunResult): no metric may take one's name
TRAIN_FIELDS = {"step", "epoch", "loss", "lr", "skipped", "updates_per_s", "data_wait", "global_batch", "eval"}
TRAIN_FIELDS |= {"samples_per_s", "flops_per_update", "peak_memory_mib"}  # throughput (test_flops.py)
COMPILE_FIELDS = {"compiles", "compile_s"}  # in the records of a run that compiles (test_compile_run.py)
# in the records of a run with peak_flops, of a composition with a weight, of ranks where one straggled, of several
# parameter groups (test_run_lr.py)
SOMETIMES = {"mfu", "tokens_per_s", "stragglers", "lr_groups"}
TRAIN_FIELDS |= COMPILE_FIELDS | SOMETIMES
EVAL_FIELDS = {"step", "epoch", "eval", "eval_ema"}  # eval_ema: ct.ema's weights evaluated (test_ema)

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5}


class Name(str, enum.Enum):  # str(Name.ACC) is "Name.ACC": the name is the text it holds, "acc"
    ACC = "acc"
    VAL = "val"


STR_KINDS = [Name, np.str_] + ([enum.StrEnum("Name", {"ACC": "acc", "VAL": "val"})] if hasattr(enum, "StrEnum") else [])


def with_metrics(rename):
    """run_script.step with its metrics renamed by ``rename(metrics)``."""

    def step(model, batch):
        loss, metrics = run_script.step(model, batch)
        return loss, rename(metrics)

    return step


def train(step, tmp=None, **options):
    state = run_script.state()
    result = ct.run(step, state, run_script.dataset(), checkpoint_dir=tmp, **{**OPTIONS, **options})
    return state, result


def evaluated(metrics):
    return lambda model, batch: {**metrics, "acc": (model(batch[0]).argmax(-1) == batch[1]).double().mean()}


# -- the type of a name ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("names", "bad"),
    [
        (lambda m: {0: m["acc"], 1: 1 - m["acc"]}, r"0 \(int\)"),  # per-class metrics: trained, then lost on resume
        (lambda m: {**m, 0: m["acc"]}, r"0 \(int\)"),  # mixed int and str: a bare comparison error at the log
        (lambda m: {("acc", 0): m["acc"]}, r"\('acc', 0\) \(tuple\)"),
    ],
)
def test_a_metric_name_that_is_not_a_str_is_refused_at_the_first_update(tmp_path, names, bad):
    calls = []

    def step(model, batch):
        calls.append(1)
        return with_metrics(names)(model, batch)

    refused = rf"train_step\(step\): the step returns metric {bad}; metric names must be str"
    with pytest.raises(TypeError, match=refused) as e:
        train(step, tmp_path, max_steps=5, log_every=4, checkpoint_every=2)
    assert "e.g. 'class_0'" in str(e.value)
    assert len(calls) == 1 and not list(tmp_path.glob("step-*"))  # refused at the first update, nothing saved


class Tricky(str):
    """A name that claims to equal any other: names are the same as those checked only if they are plain str."""

    __hash__ = str.__hash__

    def __eq__(self, other):
        return True


PLAIN = lambda m: m  # noqa: E731


@pytest.mark.parametrize(
    ("earlier", "later", "error", "bad"),
    [
        (PLAIN, lambda m: {**m, "lr": m["acc"]}, ValueError, r"metric 'lr', a name ct\.run's training records"),
        (PLAIN, lambda m: {0: m["acc"]}, TypeError, r"metric 0 \(int\); metric names must be str"),
        (PLAIN, lambda m: {Tricky("lr"): m["acc"]}, ValueError, r"metric 'lr', a name ct\.run's training records"),
        (lambda m: {Tricky("acc"): m["acc"]}, lambda m: {"lr": m["acc"]}, ValueError, r"metric 'lr', a name ct"),
    ],
)
def test_names_that_change_after_passing_are_checked_again_in_the_pass_that_returns_them(earlier, later, error, bad):
    """The names a pass returned that passed the rule pass again unread (once per update is the common case); a
    pass that returns other names, in any micro-batch of any later update, is checked and refused before its
    backward: nothing of the update is applied. Names that are not plain str are looked at every time."""
    calls = []

    def step(model, batch):
        calls.append(1)
        loss, metrics = run_script.step(model, batch)
        return loss, later(metrics) if len(calls) == 6 else earlier(metrics)  # update 3's second micro-batch

    state = run_script.state()
    train_ = ct.accumulate(2)(step)
    batches = iter(torch.utils.data.DataLoader(run_script.dataset(), batch_size=12))
    for _ in range(2):
        train_(state, next(batches))
    before = snapshot(state)
    with pytest.raises(error, match=rf"^train_step\(step\): the step returns {bad}"):
        train_(state, next(batches))
    assert len(calls) == 6
    assert_untouched(state, before)


def test_an_eval_metric_name_that_is_not_a_str_is_refused():
    step = lambda model, batch: {0: torch.tensor(0.5)}  # noqa: E731
    with pytest.raises(TypeError, match=r"run: eval_step returns metric 0 \(int\); metric names must be str"):
        train(run_script.step, max_steps=2, eval_every=2, eval_step=step, eval_data=run_script.dataset(24))


@pytest.mark.parametrize("kind", STR_KINDS)
def test_str_subclass_names_are_logged_saved_and_resumed_as_plain_str(tmp_path, kind):
    """A StrEnum or NumPy string names the metric its text spells; a checkpoint saved between two log points
    resumes from there (today: refused at the first save)."""
    step = with_metrics(lambda m: {kind("acc"): m["acc"]})
    evaluate = lambda model, batch: {kind("val"): (model(batch[0]).argmax(-1) == batch[1]).double().mean()}  # noqa: E731
    options = {"log_every": 4, "checkpoint_every": 3, "eval_step": evaluate, "eval_data": run_script.dataset(24)}
    straight, expected = train(run_script.step, tmp_path / "a", epochs=2, **options, eval_every=4)
    train(step, tmp_path / "b", max_steps=6, **options, eval_every=4)  # saved at 6, inside the window 5..8
    resumed, result = train(step, tmp_path / "b", epochs=2, **options, eval_every=4)
    assert_states_equal(resumed, straight)
    assert not list((tmp_path / "b").glob("corrupt-*"))  # the checkpoint at 6 was resumed, not set aside
    assert [r["step"] for r in result.history] == [r["step"] for r in expected.history] == [4, 8, 12, 16]
    for r, e in zip(result.history, expected.history, strict=True):
        assert all(type(k) is str for k in r) and r["acc"] == e["acc"]
    assert all(type(k) is str for e in result.evals for k in e) and [e["val"] for e in result.evals] == [
        e["val"] for e in expected.evals
    ]


def test_a_checkpoint_window_with_names_that_are_not_plain_str_is_set_aside(tmp_path):
    """At load the rule is the same as at save: exact str keys."""
    from composetrain.checkpoint.format import window_problem as _window_problem

    good = {"loss": torch.tensor(1.0), "metrics": {"acc": torch.tensor(0.5)}, "skipped": False}
    assert _window_problem(good) is None
    for key in (0, np.str_("acc"), Name.ACC):
        assert _window_problem({**good, "metrics": {key: torch.tensor(0.5)}}) is not None


# -- names the record itself uses ------------------------------------------------------------------------
def test_the_reserved_names_are_every_field_the_driver_writes():
    _, result = train(
        run_script.step,
        max_steps=2,
        log_every=2,
        eval_every=2,
        eval_step=evaluated({}),
        eval_data=run_script.dataset(24),
    )
    assert set(result.history[0]) - {"acc"} | {"eval"} | COMPILE_FIELDS | SOMETIMES == TRAIN_FIELDS
    assert set(result.evals[0]) - {"acc"} | {"eval", "eval_ema"} == EVAL_FIELDS
    from composetrain.driver import monitor

    assert (monitor.TRAIN_FIELDS, monitor.EVAL_FIELDS) == (TRAIN_FIELDS, EVAL_FIELDS)  # the lists ct.run refuses by


@pytest.mark.parametrize("name", sorted(TRAIN_FIELDS))
def test_a_training_metric_named_as_a_record_field_is_refused_with_the_list(name):
    step = with_metrics(lambda m: {**m, name: m["acc"]})
    with pytest.raises(
        ValueError, match=rf"train_step\(step\): the step returns metric '{name}', a name ct.run's training records"
    ) as e:
        train(step, max_steps=2, log_every=1)
    assert str(sorted(TRAIN_FIELDS)) in str(e.value) and "rename it in the step" in str(e.value)


@pytest.mark.parametrize("name", sorted(EVAL_FIELDS))
def test_an_eval_metric_named_as_a_record_field_is_refused_with_the_list(tmp_path, name):
    with pytest.raises(ValueError, match=rf"run: eval_step returns metric '{name}', a name ct.run's evaluation") as e:
        train(
            run_script.step,
            tmp_path,
            max_steps=2,
            eval_every=2,
            eval_step=evaluated({name: 1.0}),
            eval_data=run_script.dataset(24),
        )
    assert str(sorted(EVAL_FIELDS)) in str(e.value)


def test_an_eval_metric_named_loss_or_lr_is_kept_in_the_file(tmp_path):
    """The evaluation record nests its metrics under "eval": only step and epoch (and eval) clash."""
    metrics = {"loss": 0.25, "lr": 0.5}
    _, result = train(
        run_script.step,
        tmp_path,
        max_steps=2,
        eval_every=2,
        eval_step=evaluated(metrics),
        eval_data=run_script.dataset(24),
    )
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval"] for r in lines if "eval" in r] == [{"acc": result.evals[0]["acc"], **metrics}]


# -- values --------------------------------------------------------------------------------------------
def test_a_complex_training_metric_is_refused_not_cut_to_its_real_part():
    step = with_metrics(lambda m: {**m, "z": torch.complex(m["acc"], m["acc"])})
    with pytest.raises(TypeError, match=r"train_step\(step\): the step returns metric 'z' as a complex tensor"):
        train(step, max_steps=2, log_every=1)


@pytest.mark.parametrize("value", [1 + 2j, torch.tensor(1 + 2j), np.complex128(1 + 2j)])
def test_a_complex_eval_metric_is_refused_not_cut_to_its_real_part(value):
    with pytest.raises(TypeError, match=r"run: eval_step's metric 'z' is complex"):
        train(
            run_script.step,
            max_steps=2,
            eval_every=2,
            eval_step=evaluated({"z": value}),
            eval_data=run_script.dataset(24),
        )


# -- a step changed across a resume ------------------------------------------------------------------------
def test_switching_accumulate_auto_and_n_across_a_resume_inside_a_window_says_so(tmp_path):
    auto, fixed = ct.accumulate("auto")(run_script.step), ct.accumulate(2)(run_script.step)
    train(auto, tmp_path, max_steps=3, log_every=4)  # saved at 3: its window holds updates 1..3
    with pytest.raises(ValueError, match=r"the step's metrics changed across the resume") as e:
        train(fixed, tmp_path, max_steps=6, log_every=4)
    message = str(e.value)
    assert "['acc', 'micro_batch']" in message and "now ['acc']" in message and "step-000000003" not in message
    assert "resume with the step that saved it" in message
    # resumed at a log point, the window is empty: switching is fine there
    train(auto, tmp_path / "b", max_steps=4, log_every=4)
    state, result = train(fixed, tmp_path / "b", max_steps=6, log_every=2)
    assert state.step == 6 and [r["step"] for r in result.history] == [4, 6]


def test_metrics_that_change_inside_a_window_of_a_fresh_run_are_not_called_a_resume():
    calls = []

    def step(model, batch):
        calls.append(1)
        loss, metrics = run_script.step(model, batch)
        return loss, {**metrics, "late": metrics["acc"]} if len(calls) == 2 else metrics

    with pytest.raises(ValueError, match=r"metric 'late' for update 2 since the last log point but not for update 1"):
        train(step, max_steps=4, log_every=4)

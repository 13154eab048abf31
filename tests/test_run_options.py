"""ct.run's options as values: each refusal raised when its value is built (naming ct.run, the
argument, what arrived and the fix), before anything is set up; valid options build, resolve their
defaults and round-trip."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import composetrain as ct
from composetrain.core.util import show
from composetrain.driver import run as ct_run
from composetrain.driver.options import CheckpointOptions, EvalOptions, LoaderOptions, LogOptions, RunOptions

DATA = TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
# ct.run's own defaults, read from its signature: the options are built from exactly what it passes
DEFAULTS = {name: p.default for name, p in inspect.signature(ct.run).parameters.items() if p.kind is p.KEYWORD_ONLY}


def evaluate(model, batch):
    return {"zero": 0.0}


class Stream(IterableDataset):
    def __iter__(self):
        return iter([])


def build(data=DATA, **args):
    return RunOptions.from_run_args(data, **{**DEFAULTS, "batch_size": 2, **args})


# (the arguments, the error, the argument named, the value as shown, a fragment of the fix)
REFUSED = [
    ({"epochs": 0}, ValueError, "epochs", "0 (int)", "e.g. epochs=10 or None"),
    ({"max_steps": 2.0}, TypeError, "max_steps", "2.0 (float)", "e.g. max_steps=10 or None"),
    ({"log_every": 0}, ValueError, "log_every", "0 (int)", "e.g. log_every=10"),
    ({"log_every": None}, TypeError, "log_every", "None (NoneType)", "e.g. log_every=10"),
    ({"checkpoint_dir": "c", "checkpoint_every": -1}, ValueError, "checkpoint_every", "-1 (int)", "e.g."),
    ({"keep_checkpoints": 0}, ValueError, "keep_checkpoints", "0 (int)", "e.g. keep_checkpoints=10"),
    ({"checkpoint_dir": 5}, TypeError, "checkpoint_dir", "5 (int)", "e.g. checkpoint_dir='runs/a'"),
    ({"checkpoint_every": 3}, ValueError, "checkpoint_every=3", "no checkpoint_dir", "give checkpoint_dir"),
    ({"eval_every": 1.5}, TypeError, "eval_every", "1.5 (float)", "e.g. eval_every=10 or None"),
    ({"eval_every": 3}, ValueError, "eval_every=3", "no eval_step", "give eval_step and eval_data"),
    ({"eval_step": 5, "eval_data": DATA}, TypeError, "eval_step", "5 (int)", "e.g. eval_step=lambda model"),
    ({"eval_step": evaluate}, ValueError, "eval_step", "eval_data=None", "give eval_step and eval_data together"),
    ({"eval_data": DATA}, ValueError, "eval_data", "eval_step=None", "give eval_step and eval_data together"),
    ({"eval_step": evaluate, "eval_data": {"x": 1}}, TypeError, "eval_data", "{'x': 1} (dict)", "TensorDataset("),
    ({"eval_step": evaluate, "eval_data": Stream()}, TypeError, "eval_data", "Stream", "DataLoader(eval_data"),
    ({"tensorboard": 1}, TypeError, "tensorboard", "1 (int)", "True, False or a folder"),
    ({"tensorboard": True}, ValueError, "tensorboard=True", "no", "give checkpoint_dir or log_file"),
    ({"tensorboard": ""}, ValueError, "tensorboard=''", "names no folder", "tensorboard='runs/tb'"),
    ({"progress": "yes"}, TypeError, "progress", "'yes' (str)", "e.g. progress=True"),
    ({"requeue": None}, TypeError, "requeue", "None (NoneType)", "e.g. requeue=True"),
    ({"timeout": 0}, ValueError, "timeout", "0 (int)", "e.g. timeout=300 (seconds)"),
    ({"timeout": "5"}, TypeError, "timeout", "'5' (str)", "e.g. timeout=300 (seconds)"),
    ({"seed": -1}, ValueError, "seed", "-1 (int)", "e.g. seed=0"),
    ({"seed": 2**32}, ValueError, "seed must be below 2**32", f"{2**32} (int)", "e.g. seed=0"),
    ({"collate_fn": 5}, TypeError, "collate_fn", "5 (int)", "or leave it out"),
    ({"shuffle": "no"}, TypeError, "shuffle", "'no' (str)", "e.g. shuffle=True"),
    ({"drop_last": 1}, TypeError, "drop_last", "1 (int)", "e.g. drop_last=True"),
    ({"batch_size": None}, ValueError, "batch_size is required", "a Dataset", "e.g. batch_size=64"),
    ({"batch_size": 0}, ValueError, "batch_size", "0 (int)", "e.g. batch_size=64"),
    ({"batch_size": 2.5}, TypeError, "batch_size", "2.5 (float)", "e.g. batch_size=64"),
    ({"num_workers": "many"}, TypeError, "num_workers", "'many' (str)", "e.g. num_workers=2 or 'auto'"),
    ({"num_workers": -1}, ValueError, "num_workers", "-1 (int)", "e.g. num_workers=2 or 'auto'"),
]


@pytest.mark.parametrize(("args", "error", "arg", "shown", "fix"), REFUSED)
def test_each_option_is_refused_when_its_value_is_built(args, error, arg, shown, fix):
    with pytest.raises(error) as caught:
        build(**args)
    message = str(caught.value)
    assert message.startswith("run: ") and arg in message and shown in message and fix in message, message


@pytest.mark.parametrize(
    ("data", "args", "error", "says"),
    [
        ({"x": torch.zeros(2)}, {}, TypeError, "run: data must be a Dataset or DataLoader, got {'x'"),
        (5, {}, TypeError, "run: data must be a torch Dataset or DataLoader, got 5 (int)"),
        (Stream(), {"checkpoint_dir": "c"}, TypeError, "run: checkpoint_dir is given, but the stream Stream has no"),
        (DataLoader(Stream()), {"batch_size": None, "checkpoint_dir": "c"}, TypeError, "run: checkpoint_dir is given"),
        (Stream(), {"global_batch_size": 4, "batch_size": None}, ValueError, "run: global_batch_size=4 but data is"),
        (Stream(), {"shuffle": True}, ValueError, "run: shuffle=True but data is a stream (Stream)"),
        (Stream(), {"stream_resume": "again"}, ValueError, "run: stream_resume must be one of 'state', 'replay'"),
        (DATA, {"stream_resume": "state"}, ValueError, "run: stream_resume='state' but data is"),
        (DataLoader(DATA, batch_size=3), {"batch_size": 2}, ValueError, "run: batch_size=2 but the DataLoader given"),
        (DataLoader(DATA, batch_size=3), {"batch_size": None, "shuffle": True}, ValueError, "run: shuffle=True but"),
        (DataLoader(DATA, batch_size=3), {"batch_size": None, "drop_last": True}, ValueError, "run: drop_last=True"),
        (DataLoader(DATA, batch_size=3), {"batch_size": None, "collate_fn": list}, ValueError, "run: collate_fn is"),
        (
            DataLoader(DATA, batch_size=None),
            {"batch_size": None, "eval_step": evaluate, "eval_data": DATA},
            ValueError,
            "run: eval_data is a Dataset, which ct.run batches by the training loader's batch size",
        ),
    ],
)
def test_what_data_decides_is_refused_when_the_options_are_built(data, args, error, says):
    with pytest.raises(error) as caught:
        build(data, **args)
    assert str(caught.value).startswith(says)


def test_a_value_built_directly_is_checked_as_one_built_from_run_args():
    with pytest.raises(ValueError, match=r"^run: checkpoint_every=3 but no checkpoint_dir"):
        CheckpointOptions(None, 3)
    with pytest.raises(ValueError, match=r"^run: log_every must be a positive int, got 0"):
        LogOptions(log_every=0)
    with pytest.raises(TypeError, match=r"^run: progress must be True or False, got None"):
        LogOptions(progress=None)
    with pytest.raises(TypeError, match=r"LogOptions.log_file is a resolved Path or None, got 'm.jsonl'"):
        LogOptions(log_file="m.jsonl")
    with pytest.raises(ValueError, match=r"^run: eval_step=.* but eval_data=None; give eval_step and eval_data"):
        EvalOptions(evaluate)
    with pytest.raises(TypeError, match=r"^run: shuffle must be True or False, got None"):  # resolved: no None
        LoaderOptions(DATA, 2, None, False, 0, None, 0)
    options = build()
    with pytest.raises(ValueError, match=r"^run: timeout must be a positive, finite number, got nan"):
        dataclasses.replace(options, timeout=float("nan"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.loader.batch_size = 0  # type: ignore[misc]


def test_options_checked_after_the_rendezvous_before_are_now_refused_before_it(monkeypatch):
    """eval_step without eval_data, a missing batch_size and num_workers were checked inside the job."""

    def rendezvous(**_):
        raise AssertionError("the job was joined before the options were checked")

    monkeypatch.setattr(ct_run, "rendezvous", rendezvous)
    model = torch.nn.Linear(2, 1)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for args, says in [
        ({"batch_size": 2, "eval_step": evaluate}, "give eval_step and eval_data together"),
        ({}, "batch_size is required when data is a Dataset"),
        ({"batch_size": 2, "num_workers": "many"}, "num_workers must be a non-negative int"),
        ({"batch_size": 2.0}, "batch_size must be a positive int"),
    ]:
        with pytest.raises((TypeError, ValueError), match=says):
            ct.run(lambda model, batch: model(batch[0]).sum(), state, DATA, progress=False, **args)


def test_the_driver_takes_a_handful_of_parameters():
    assert list(inspect.signature(ct_run._Driver.__init__).parameters) == [
        "self",
        "step_fn",
        "state",
        "proc",
        "options",
    ]


def _maybe(strategy):
    return st.one_of(st.none(), strategy)


_COUNT = st.one_of(st.integers(1, 10**6), st.integers(1, 1000).map(np.int64))


@st.composite
def run_args(draw):
    args = {
        "epochs": draw(_maybe(_COUNT)),
        "max_steps": draw(_maybe(_COUNT)),
        "batch_size": draw(st.one_of(st.integers(1, 64), st.integers(1, 64).map(np.int32))),
        "shuffle": draw(_maybe(st.booleans())),
        "drop_last": draw(_maybe(st.booleans())),
        "num_workers": draw(st.one_of(st.just("auto"), st.integers(0, 8))),
        "collate_fn": draw(st.sampled_from([None, list])),
        "log_every": draw(_COUNT),
        "log_file": draw(st.sampled_from([None, "logs/m.jsonl", Path("~/m.jsonl")])),
        "progress": draw(st.booleans()),
        "checkpoint_dir": draw(st.sampled_from([None, "runs/a", Path("runs/b")])),
        "keep_checkpoints": draw(_COUNT),
        "seed": draw(st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 2**31).map(np.int64))),
        "requeue": draw(st.booleans()),
        "timeout": draw(st.one_of(st.floats(1e-3, 1e6), st.integers(1, 10**4))),
    }
    duration = st.builds(lambda n, unit: f"{n}{unit}", st.integers(1, 10**4), st.sampled_from(["s", "min", "h"]))
    every = st.one_of(_COUNT, duration, st.tuples(_COUNT, duration), st.just("epoch"))
    args["checkpoint_every"] = draw(_maybe(every)) if args["checkpoint_dir"] is not None else None
    args["checkpoint_async"] = draw(_maybe(st.booleans())) if args["checkpoint_dir"] is not None else None
    evaluating = draw(st.booleans())
    args["eval_step"], args["eval_data"] = (evaluate, DATA) if evaluating else (None, None)
    args["eval_every"] = draw(_maybe(_COUNT)) if evaluating else None
    has_log = args["log_file"] is not None or args["checkpoint_dir"] is not None
    args["tensorboard"] = draw(st.sampled_from([False, "runs/tb", *([True] if has_log else [])]))
    return args


def _plain(value):
    """Every number of the options is a plain int (a float timeout): the checkpoint keeps plain types."""
    return value is None or type(value) in (int, float, bool, str)


@settings(max_examples=60, deadline=None)
@given(args=run_args())
def test_valid_options_build_resolve_their_defaults_and_round_trip(args):
    options = build(**args)
    loader, saving, log, evaluation = options.loader, options.checkpoint, options.log, options.eval
    numbers = (options.epochs, options.max_steps, options.timeout, loader.batch_size, loader.seed, log.log_every)
    every = saving.checkpoint_every
    assert all(_plain(v) for v in (*numbers, saving.keep_checkpoints, evaluation.eval_every))
    assert all(_plain(v) for v in (every if isinstance(every, tuple) else (every,)))
    if args["checkpoint_dir"] is not None:  # the defaults resolved: every 10 minutes, in the background
        given = args["checkpoint_every"]
        expected = (
            "10min"
            if given is None
            else given
            if isinstance(given, str)
            else (int(given[0]), given[1])
            if isinstance(given, tuple)
            else int(given)
        )
        assert every == expected
        assert saving.checkpoint_async is (args["checkpoint_async"] is not False)  # background unless told
    assert (
        loader.seed == args["seed"] and loader.batch_size == args["batch_size"] and options.timeout == args["timeout"]
    )
    assert loader.shuffle is (args["shuffle"] is not False) and loader.drop_last is bool(args["drop_last"])
    default_log = Path(args["checkpoint_dir"]).expanduser() / "metrics.jsonl" if args["checkpoint_dir"] else None
    assert log.log_file == (Path(args["log_file"]).expanduser() if args["log_file"] else default_log)
    if args["tensorboard"] is True:
        assert log.tensorboard == log.log_file.parent / "tensorboard"
    assert options.total_epochs == (args["epochs"] or (None if args["max_steps"] else 1))
    assert evaluation.enabled is (args["eval_step"] is not None)
    # round trip: each value rebuilt from its own fields, and ct.run's arguments read back from the options
    for part in (options, loader, saving, log, evaluation):
        assert type(part)(**{f.name: getattr(part, f.name) for f in dataclasses.fields(part)}) == part
    parts = (loader, saving, log, evaluation)
    again = {
        **{f.name: getattr(part, f.name) for part in parts for f in dataclasses.fields(part)},
        "epochs": options.epochs,
        "max_steps": options.max_steps,
        "requeue": options.requeue,
        "timeout": options.timeout,
        "tensorboard": log.tensorboard or False,
    }
    data = again.pop("data")
    assert RunOptions.from_run_args(data, **again) == options


@given(value=st.one_of(st.integers(-5, 0), st.floats(), st.text(max_size=3), st.booleans()))
def test_no_invalid_count_builds(value):
    for name in ("log_every", "keep_checkpoints", "epochs", "batch_size"):
        with pytest.raises((TypeError, ValueError)) as caught:
            build(**{name: value})
        assert str(caught.value).startswith(f"run: {name} must be a positive int, got {show(value)}")


# -- hostile options through a real ct.run: refused before any folder is made, the state unchanged --------------------


X = torch.randn(12, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
Y = torch.randn(12, 1, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
PLAIN_DATA = TensorDataset(X, Y)


def step(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def fresh():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def refused(tmp_path, data, error, *fragments, **options):
    """ct.run refuses with ``error`` naming every fragment; nothing new under tmp_path, the state unchanged."""
    before = set(tmp_path.rglob("*"))
    model, opt = fresh()
    weights = copy.deepcopy(model.state_dict())
    state = ct.TrainState(model, opt)
    with pytest.raises(error) as caught:
        ct.run(step, state, data, progress=False, **options)
    message = str(caught.value)
    assert message.startswith("run: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert set(tmp_path.rglob("*")) == before, sorted(map(str, set(tmp_path.rglob("*")) - before))
    assert state.step == 0 and not opt.state
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "f"
    path.write_text("x")
    return path


@pytest.mark.parametrize(
    ("log_file", "error", "shown"),
    [
        (b"m.jsonl", TypeError, "b'm.jsonl' (bytes)"),
        (123, TypeError, "123 (int)"),
        (True, TypeError, "True (bool)"),
        ("", ValueError, "'' (str)"),
        (0, TypeError, "0 (int)"),
    ],
)
def test_log_file_of_a_wrong_kind_is_refused_by_run(tmp_path, log_file, error, shown):
    refused(
        tmp_path,
        PLAIN_DATA,
        error,
        "log_file",
        shown,
        "log_file='runs/a/metrics.jsonl'",
        batch_size=4,
        num_workers=0,
        log_file=log_file,
        checkpoint_dir=tmp_path / "ck",
    )


def test_log_file_that_is_a_folder_is_refused_before_the_checkpoint_folder_is_made(tmp_path):
    folder = tmp_path / "dd"
    folder.mkdir()
    refused(
        tmp_path,
        PLAIN_DATA,
        PermissionError,
        "log_file",
        str(folder),
        "is a folder",
        batch_size=4,
        num_workers=0,
        log_file=folder,
        checkpoint_dir=tmp_path / "ck",
    )


def test_log_file_inside_a_file_is_refused_before_the_checkpoint_folder_is_made(tmp_path):
    inside = a_file(tmp_path) / "m.jsonl"
    refused(
        tmp_path,
        PLAIN_DATA,
        PermissionError,
        "log_file",
        str(inside),
        "a file, not a folder",
        batch_size=4,
        num_workers=0,
        log_file=inside,
        checkpoint_dir=tmp_path / "ck",
    )


@pytest.mark.parametrize(
    ("batch_size", "error", "shown"),
    [
        (True, TypeError, "True (bool)"),
        ("4", TypeError, "'4' (str)"),
        (4.0, TypeError, "4.0 (float)"),
        (-4, ValueError, "-4 (int)"),
        (torch.tensor(4), TypeError, "(Tensor)"),
    ],
)
def test_batch_size_of_a_wrong_kind_with_a_dataloader_is_refused_as_such(tmp_path, batch_size, error, shown):
    loader = DataLoader(PLAIN_DATA, batch_size=4 if batch_size is not True else 1)
    refused(tmp_path, loader, error, "batch_size must be a positive int", shown, "e.g.", batch_size=batch_size)


def test_batch_size_against_a_dataloader_without_one_says_so(tmp_path):
    loader = DataLoader(list(DataLoader(PLAIN_DATA, batch_size=4)), batch_size=None)
    refused(tmp_path, loader, ValueError, "batch_size=4", "batch_size=None", "leave it out", batch_size=4)


@pytest.mark.parametrize(("num_workers", "error"), [(2, ValueError), ("many", TypeError), (-1, ValueError)])
def test_num_workers_that_contradicts_a_dataloader_is_refused_never_ignored(tmp_path, num_workers, error):
    refused(
        tmp_path, DataLoader(PLAIN_DATA, batch_size=4), error, "num_workers", repr(num_workers), num_workers=num_workers
    )


def test_accepted_numpy_options_with_a_dataloader_train_as_a_plain_loop(tmp_path):
    loader = DataLoader(PLAIN_DATA, batch_size=4)
    model, opt = fresh()
    state = ct.TrainState(model, opt)
    ct.run(
        step,
        state,
        loader,
        batch_size=np.int64(4),
        num_workers=np.int64(0),
        shuffle=False,
        epochs=np.int32(2),
        log_file=tmp_path / "m.jsonl",
        progress=False,
    )
    reference, ref_opt = fresh()
    for _ in range(2):
        for batch in DataLoader(PLAIN_DATA, batch_size=4):
            ref_opt.zero_grad()
            step(reference, batch).backward()
            ref_opt.step()
    assert state.step == 6
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


@pytest.mark.parametrize("name", ["checkpoint_dir", "log_file", "tensorboard"])
def test_a_path_with_a_nul_byte_is_refused_naming_run_and_the_argument(tmp_path, name):
    refused(
        tmp_path, PLAIN_DATA, ValueError, name, "null", batch_size=4, num_workers=0, **{name: str(tmp_path / "a\0b")}
    )


@pytest.mark.parametrize(
    ("log_file", "checkpoint_dir", "tensorboard", "named"),
    [
        ("ck", "ck", False, "log_file"),
        ("m", "m/ck", False, "log_file"),
        ("m", None, "m", "tensorboard"),
        ("m", None, "m/tb", "tensorboard"),
    ],
)
def test_paths_that_collide_are_refused_before_anything_is_made(tmp_path, log_file, checkpoint_dir, tensorboard, named):
    refused(
        tmp_path,
        PLAIN_DATA,
        ValueError,
        named,
        "e.g.",
        batch_size=4,
        num_workers=0,
        log_file=tmp_path / log_file,
        tensorboard=tensorboard and tmp_path / tensorboard,
        checkpoint_dir=checkpoint_dir and tmp_path / checkpoint_dir,
    )


class BytesPath:
    def __fspath__(self):
        return b"runs/a"


@pytest.mark.parametrize("name", ["checkpoint_dir", "log_file", "tensorboard"])
def test_a_pathlike_of_bytes_is_refused_naming_run_and_the_argument(tmp_path, name):
    refused(
        tmp_path, PLAIN_DATA, TypeError, name, "BytesPath", "e.g.", batch_size=4, num_workers=0, **{name: BytesPath()}
    )

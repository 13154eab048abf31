"""One convention across the transform layer: argument checks, bare and called transforms, signatures."""

from __future__ import annotations

import functools
import inspect
import math
import runpy
import tempfile
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from helpers import assert_untouched, classify, make_state, snapshot
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import composetrain as ct
from composetrain.core.protocol import StepOutput
from composetrain.core.util import show
from composetrain.driver.options import CheckpointOptions


# -- numeric and flag arguments: one rule ----------------------------------------------------------
class Arg(NamedTuple):
    """A numeric or flag argument of a public function: how to pass it, and what it accepts."""

    who: str
    arg: str
    call: Callable[[Any], Any]
    kind: str  # "int", "real" or "bool"
    minimum: int = 1  # ints
    positive: bool = True  # reals
    finite: bool = True  # reals
    below: float = math.inf  # reals: the exclusive upper bound
    maximum: int | None = None  # ints: the inclusive upper bound
    at_most: float = math.inf  # reals: the inclusive upper bound
    unset: bool = False  # None is its default, "not given": not a value of the wrong kind
    signed: bool = False  # reals: a negative value is in range too (a metric)
    nan: bool = False  # reals: NaN is in range too (a metric, passed on as torch's schedulers take it)

    def bounded(self) -> bool:
        """Whether some value of the right kind is out of range."""
        unbounded = self.signed and not self.finite and self.below == self.at_most == math.inf
        return self.kind != "bool" and not (unbounded and self.nan)


_SAVED = make_state().state_dict()
_SCRATCH = tempfile.TemporaryDirectory(prefix="conventions-")  # the store and file the data calls open
_ITEMS = [torch.arange(3.0), torch.ones(3)]


@functools.cache
def _store() -> Path:
    """A ct.cache store of ``_ITEMS``, written once: a call in range opens it (rebuild=True writes it again)."""
    path = Path(_SCRATCH.name) / "store"
    ct.cache(_ITEMS, path, progress=False)
    return path


@functools.cache
def _h5() -> Path:
    h5py = pytest.importorskip("h5py")
    path = Path(_SCRATCH.name) / "rows.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((4, 2), np.float32)
    return path


@functools.cache
def _token_file() -> Path:
    """A raw uint16 token file of zeros, long enough for a window of any seq_len drawn here (up to 10**6)."""
    path = Path(_SCRATCH.name) / "tokens.bin"
    np.zeros(10**6 + 1, np.uint16).tofile(path)
    return path


def _cache(**options: Any) -> Any:
    return ct.cache(_ITEMS, _store(), **{"progress": False, **options})


def _plateau() -> ct.TrainState:
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    return ct.TrainState(model, optimizer, plateau, scheduler_interval="epoch")


def _rendezvous(timeout: Any) -> None:
    with ct.rendezvous(env={}, timeout=timeout):  # a single process: no group, so nothing to wait for
        pass


_INT64 = {"minimum": -(2**63), "maximum": 2**63 - 1}


def _colwise() -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel()


ARGS = [
    Arg("accumulate", "n", lambda v: ct.accumulate(v), "int"),
    Arg("accumulate", "micro_batch", lambda v: ct.accumulate(micro_batch=v), "int", unset=True),
    Arg("clip_grad_norm", "max_norm", lambda v: ct.clip_grad_norm(v), "real"),
    Arg("clip_grad_norm", "norm_type", lambda v: ct.clip_grad_norm(1.0, norm_type=v), "real", finite=False),
    Arg("clip_grad_value", "clip_value", lambda v: ct.clip_grad_value(v), "real"),
    Arg("adaptive_clip_grad", "clip_factor", lambda v: ct.adaptive_clip_grad(v), "real"),
    Arg("adaptive_clip_grad", "eps", lambda v: ct.adaptive_clip_grad(0.01, eps=v), "real"),
    Arg("adaptive_clip_grad", "norm_type", lambda v: ct.adaptive_clip_grad(0.01, norm_type=v), "real", finite=False),
    Arg(
        "TrainState.end_epoch",
        "metric",
        lambda v: _plateau().end_epoch(metric=v),
        "real",
        positive=False,
        finite=False,
        unset=True,
        signed=True,
        nan=True,
    ),
    Arg("mixed_precision", "loss_scale", lambda v: ct.mixed_precision(dtype="fp16", loss_scale=v), "real"),
    Arg("mixed_precision", "max_consecutive_skips", lambda v: ct.mixed_precision(max_consecutive_skips=v), "int"),
    Arg("mixed_precision", "check_finite", lambda v: ct.mixed_precision(check_finite=v), "bool"),
    Arg("distributed", "bucket_cap_mb", lambda v: ct.distributed(bucket_cap_mb=v), "real"),
    *[
        Arg("distributed", flag, lambda v, flag=flag: ct.distributed(**{flag: v}), "bool")
        for flag in ("find_unused_parameters", "broadcast_buffers", "gradient_as_bucket_view", "static_graph")
    ],
    Arg("sharded", "reshard_after_forward", lambda v: ct.sharded(reshard_after_forward=v), "bool"),
    Arg("sharded", "sync_every_micro_batch", lambda v: ct.sharded(sync_every_micro_batch=v), "bool"),
    Arg("tensor_parallel", "size", lambda v: ct.tensor_parallel({"0": _colwise()}, size=v), "int"),
    Arg("pipeline", "microbatches", lambda v: ct.pipeline([["0"]], microbatches=v, schedule="gpipe"), "int"),
    Arg("compile", "fullgraph", lambda v: ct.compile(fullgraph=v), "bool"),
    Arg("compile", "cache", lambda v: ct.compile(cache=v), "bool"),
    Arg("pipeline_split", "chunks", lambda v: ct.pipeline_split({"0": "cpu"}, chunks=v), "int"),
    Arg("scaled_lr", "base_lr", lambda v: ct.scaled_lr(v, 512, 256), "real"),
    Arg("scaled_lr", "batch", lambda v: ct.scaled_lr(0.1, v, 256), "int"),
    Arg("scaled_lr", "base_batch", lambda v: ct.scaled_lr(0.1, 512, v), "int"),
    Arg("warmup", "steps", lambda v: ct.warmup(v), "int", minimum=0),
    Arg("warmup", "start", lambda v: ct.warmup(10, start=v), "real", positive=False, below=1.0),
    Arg("split_batch", "n", lambda v: ct.split_batch(torch.zeros(5, 2), v), "int"),
    Arg("TrainState.load_state_dict", "step", lambda v: make_state().load_state_dict({**_SAVED, "step": v}), "int", 0),
    Arg("ema", "decay", lambda v: ct.ema(v), "real", positive=False, at_most=1.0),
    Arg("ema", "every", lambda v: ct.ema(0.9, every=v), "int"),
    Arg("ema", "warmup", lambda v: ct.ema(0.9, warmup=v), "int", minimum=0),
    Arg("ema", "decay_warmup", lambda v: ct.ema(0.9, decay_warmup=v), "bool"),
    Arg("ema", "warmup_gamma", lambda v: ct.ema(0.9, decay_warmup=True, warmup_gamma=v), "real"),
    Arg("ema", "warmup_power", lambda v: ct.ema(0.9, decay_warmup=True, warmup_power=v), "real"),
    Arg("ema", "min_decay", lambda v: ct.ema(1.0, decay_warmup=True, min_decay=v), "real", positive=False, at_most=1.0),
    Arg("ema", "exclude_buffers", lambda v: ct.ema(0.9, exclude_buffers=v), "bool"),
    Arg("rendezvous", "timeout", _rendezvous, "real"),
    Arg("cache", "seed", lambda v: _cache(seed=v), "int", **_INT64),
    Arg("cache", "num_workers", lambda v: _cache(num_workers=v), "int", minimum=0),  # or "auto"
    Arg("cache", "timeout", lambda v: _cache(timeout=v), "real", finite=False),
    *[Arg("cache", f, lambda v, f=f: _cache(**{f: v}), "bool") for f in ("rebuild", "verify", "progress")],
    Arg("ct.hdf5", "seed", lambda v: ct.hdf5(_h5(), "x", seed=v), "int", **_INT64),
    # ct.run's options, as it builds them before anything runs (checkpoint_every takes updates or a duration: its
    # forms and refusals are tests/test_checkpoint_interval.py's)
    Arg("run", "checkpoint_async", lambda v: CheckpointOptions("runs/a", checkpoint_async=v), "bool", unset=True),
    Arg("run", "keep_checkpoints", lambda v: CheckpointOptions("runs/a", keep_checkpoints=v), "int"),
    Arg("ct.tokens", "seq_len", lambda v: ct.tokens(_token_file(), v, dtype=np.uint16), "int"),
    Arg(
        "ct.tokens",
        "vocab_size",
        lambda v: ct.tokens(_token_file(), 8, dtype="uint16", vocab_size=v),
        "int",
        unset=True,
    ),
    Arg("ct.pack", "seq_len", lambda v: ct.pack([[1]], v), "int"),
    Arg("ct.pack", "pad_id", lambda v: ct.pack([[1]], 2, pad_id=v), "int", minimum=0),
    Arg("ct.pack", "split", lambda v: ct.pack([[1]], 2, split=v), "bool"),
]

_OTHER = st.one_of(
    st.none(),
    st.text(max_size=5).filter(lambda s: s not in ("dynamic", "auto")),  # loss_scale's and num_workers' words
    st.complex_numbers(allow_nan=False).filter(lambda z: z.imag != 0),
    st.lists(st.integers(), max_size=2),
    st.builds(torch.tensor, st.integers(1, 4)),  # a one-element tensor is not a number argument
)
_WRONG_KIND = {
    "int": st.one_of(_OTHER, st.booleans(), st.floats(), st.builds(Fraction, st.integers(1, 9), st.integers(2, 9))),
    "real": st.one_of(_OTHER, st.booleans()),
    "bool": st.one_of(_OTHER, st.integers(0, 1), st.floats(0, 1), st.builds(np.bool_, st.booleans())),
}


def _out_of_range(a: Arg) -> st.SearchStrategy[Any]:
    if a.kind == "int":
        bad = [st.integers(max_value=a.minimum - 1)]
        if a.minimum > -(2**63):  # an int64 below the range
            bad.append(st.integers(-(2**63), a.minimum - 1).map(np.int64))
        if a.maximum is not None:
            bad.append(st.integers(min_value=a.maximum + 1))
            if a.maximum < 2**63 - 1:
                bad.append(st.integers(a.maximum + 1, 2**63 - 1).map(np.int64))
        return st.one_of(*bad)

    def bad_real(x: float) -> bool:
        low = x <= 0 if a.positive else x < 0 and not a.signed
        high = (a.below < math.inf and x >= a.below) or x > a.at_most
        return (math.isnan(x) and not a.nan) or (a.finite and math.isinf(x)) or low or high

    floats = st.floats(allow_nan=True, allow_infinity=True)
    if a.signed and not a.finite and a.below == a.at_most == math.inf:
        floats = st.just(math.nan)  # the one real out of range: drawn, not filtered out of all the others
    bad = floats.filter(bad_real)
    return st.one_of(bad, bad.filter(lambda x: not math.isnan(x)).map(np.float64))


def _in_range(a: Arg) -> st.SearchStrategy[Any]:
    if a.kind == "int":
        top = 10**6 if a.maximum is None else a.maximum
        return st.one_of(st.integers(a.minimum, top), st.integers(a.minimum, min(top, 64)).map(np.int64))
    if a.kind == "bool":
        return st.booleans()
    top = min(a.below, a.at_most, 1e6)
    good = st.floats(-1e6 if a.signed else 0.0 if not a.positive else 1e-6, top, exclude_max=top == a.below)
    extra = ([st.just(math.inf)] if not a.finite else []) + ([st.just(math.nan)] if a.nan else [])
    return st.one_of(good, good.map(np.float64), *extra)


def _refused(a: Arg, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        a.call(value)
    text = str(caught.value)
    assert text.startswith(f"{a.who}: {a.arg} must be "), text  # names the function and the argument
    assert show(value) in text, text  # shows what arrived


@pytest.mark.parametrize("a", ARGS, ids=[f"{a.who}-{a.arg}" for a in ARGS])
@given(data=st.data())
def test_numeric_and_flag_arguments_follow_one_rule(a, data):
    """A value of the wrong kind is a TypeError, one out of range a ValueError, each naming the function
    and the argument and showing the value; a value in range is accepted."""
    _refused(
        a, data.draw(_WRONG_KIND[a.kind].filter(lambda v: not a.unset or v is not None), label="wrong kind"), TypeError
    )
    if a.bounded():
        _refused(a, data.draw(_out_of_range(a), label="out of range"), ValueError)
    a.call(data.draw(_in_range(a), label="in range"))


def _edges(a: Arg) -> tuple[list[Any], list[Any], list[Any]]:
    """(wrong kinds, out of range, in range): the values at the edges of an argument's rule, tried every time
    (the draws above reach them only now and then)."""
    wrong: list[Any] = ["3", None, torch.tensor(3)]
    if a.kind == "bool":
        return [*wrong, 1, np.bool_(True)], [], [True, False]
    wrong += [True, 3j]
    if a.kind == "int":
        wrong.append(3.0)
        out: list[Any] = [a.minimum - 1] + ([] if a.maximum is None else [a.maximum + 1])
        return wrong, out, [a.minimum] + ([] if a.maximum is None else [a.maximum])
    bounded = a.finite or a.below < math.inf or a.at_most < math.inf
    out = ([] if a.nan else [math.nan]) + ([] if a.signed else [-math.inf]) + ([math.inf] if bounded else [])
    out += [0.0] if a.positive else [] if a.signed else [-1e-300]
    out += ([a.below] if a.below < math.inf else []) + ([math.nextafter(a.at_most, 2.0)] if a.at_most < 1e300 else [])
    inside = ([] if a.positive else [0.0]) + ([a.at_most] if a.at_most < math.inf else [])
    inside += [-1.5] + ([] if a.finite else [-math.inf]) if a.signed else []
    return wrong, out, inside + ([] if a.finite else [math.inf]) + ([math.nan] if a.nan else [])


@pytest.mark.parametrize("a", ARGS, ids=[f"{a.who}-{a.arg}" for a in ARGS])
def test_the_edges_of_each_arguments_rule(a):
    wrong, out, inside = _edges(a)
    for value in wrong:
        if not (a.unset and value is None):  # None is "not given" there, not a value of the wrong kind
            _refused(a, value, TypeError)
    for value in out:
        _refused(a, value, ValueError)
    for value in inside:
        a.call(value)


def test_a_refused_step_count_in_a_checkpoint_changes_nothing():
    state = make_state()
    before = snapshot(state)
    for step, error in [(-1, ValueError), ("3", TypeError), (3.0, TypeError)]:
        with pytest.raises(error, match=r"^TrainState\.load_state_dict: step must be a non-negative int, got "):
            state.load_state_dict({**_SAVED, "step": step})
    assert_untouched(state, before)
    state.load_state_dict({**_SAVED, "step": np.int64(7)})
    assert state.step == 7 and type(state.step) is int


# -- messages say what to do ---------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def test_most_raises_in_the_data_layer_say_what_to_do():
    """STYLE.md: a message names the function and argument, shows what arrived, and says the fix. Counted by
    tools/fixes.py (its docstring gives the rule): at least 70% of data/'s raises give one."""
    tool = runpy.run_path(str(ROOT / "tools" / "fixes.py"))
    found = tool["raises"](ROOT / "src" / "composetrain" / "data", tool["constants"]())
    without = [f"{file}:{line}: {text}" for file, line, text, fix in found if not fix]
    assert len(found) >= 90 and len(without) <= 0.3 * len(found), "\n".join(without)


# -- transforms bare and called ---------------------------------------------------------------------
FACTORIES = {n for n in ct.__all__ if getattr(getattr(ct, n), "__composetrain_factory__", False)}

# a transform whose arguments are all optional: bare == called with the defaults
BARE = [
    ("mixed_precision", lambda s: ct.mixed_precision(s), lambda s: ct.mixed_precision()(s)),
    ("mixed_precision", lambda s: ct.mixed_precision("bf16")(s), lambda s: ct.mixed_precision(s, dtype="bf16")),
    ("mixed_precision", lambda s: ct.mixed_precision(torch.float16)(s), lambda s: ct.mixed_precision(dtype="fp16")(s)),
    ("distributed", lambda s: ct.distributed(s), lambda s: ct.distributed()(s)),
    ("sharded", lambda s: ct.sharded(s), lambda s: ct.sharded()(s)),
    ("compile", lambda s: ct.compile(s), lambda s: ct.compile()(s)),
    ("skip_spikes", lambda s: ct.skip_spikes(s), lambda s: ct.skip_spikes()(s)),
    (
        "compose",
        lambda s: ct.compose(ct.mixed_precision, ct.distributed)(s),
        lambda s: ct.mixed_precision()(ct.distributed()(s)),
    ),
]
# a transform with a required argument: used bare, a TypeError saying what to write
REQUIRED = {
    "accumulate": (ct.accumulate, r"^accumulate: n is required, got a step instead: .*accumulate\(4\)\(step\)$"),
    "checkpoint_activations": (
        ct.checkpoint_activations,
        r"^checkpoint_activations: modules is required, got a step instead: .*checkpoint_activations\(Block\)\(step\)$",
    ),
    "clip_grad_norm": (
        ct.clip_grad_norm,
        r"^clip_grad_norm: max_norm is required, got a step instead: .*clip_grad_norm\(1\.0\)\(step\)$",
    ),
    "ema": (ct.ema, r"^ema: decay is required, got a step instead: .*ema\(0\.999\)\(step\)$"),
    "clip_grad_value": (
        ct.clip_grad_value,
        r"^clip_grad_value: clip_value is required, got a step instead: .*clip_grad_value\(0\.5\)\(step\)$",
    ),
    "adaptive_clip_grad": (
        ct.adaptive_clip_grad,
        r"^adaptive_clip_grad: clip_factor is required, got a step instead: .*adaptive_clip_grad\(0\.01\)\(step\)$",
    ),
    "data_parallel": (
        ct.data_parallel,
        r'^data_parallel: devices is required, got a step instead: .*data_parallel\(\["cuda:0", "cuda:1"\]\)\(step\)$',
    ),
    "pipeline_split": (
        ct.pipeline_split,
        r"^pipeline_split: placement is required, got a step instead: .*pipeline_split\(\{\"encoder\": .*\}\)\(step\)$",
    ),
    "pipeline": (
        lambda step: ct.pipeline(step, microbatches=2),
        r"^pipeline: stages is required, got a step instead: .*pipeline\(\[\[.*\]\], microbatches=4\)\(step\)$",
    ),
}


# a required argument that may itself be a function of two arguments, which a step cannot be told from: a
# tensor_parallel plan given as plan(model, tp_mesh); a TrainStep given there is refused (tests/test_meshes.py)
TAKES_A_FUNCTION = {"tensor_parallel"}


def test_every_exported_transform_is_covered_here():
    assert {b[0] for b in BARE} | REQUIRED.keys() | TAKES_A_FUNCTION == FACTORIES


@pytest.mark.parametrize(("who", "bare", "called"), BARE, ids=[f"{b[0]}-{i}" for i, b in enumerate(BARE)])
@pytest.mark.parametrize("inner", ["plain", "train_step", "accumulate"])
def test_transforms_with_optional_arguments_work_bare_and_called(who, bare, called, inner):
    step = {"plain": classify, "train_step": ct.train_step(classify), "accumulate": ct.accumulate(2)(classify)}[inner]
    a, b = bare(step), called(step)
    assert isinstance(a, ct.TrainStep) and a == b and hash(a) == hash(b)
    assert a != ct.train_step(step)  # the configuration compared, not identity only


def test_bare_and_called_run_the_same_update():
    batch = (torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 3, (6,)))
    outs, states = [], []
    for build in (lambda s: ct.distributed(ct.mixed_precision(s)), lambda s: ct.distributed()(ct.mixed_precision()(s))):
        state = make_state()
        outs.append(build(classify)(state, batch))
        states.append(state)
    assert torch.equal(outs[0].loss, outs[1].loss)
    for p, q in zip(states[0].model.parameters(), states[1].model.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("who", sorted(REQUIRED))
@pytest.mark.parametrize("given_step", ["plain", "train_step", "lambda"])
def test_transforms_with_a_required_argument_used_bare_say_what_to_write(who, given_step):
    factory, message = REQUIRED[who]
    step = {"plain": classify, "train_step": ct.train_step(classify), "lambda": lambda m, b: m(b).sum()}[given_step]
    with pytest.raises(TypeError, match=message):
        factory(step)


def test_compose_used_on_a_step_says_what_to_write():
    with pytest.raises(TypeError, match=r"^compose: argument 0 must be a transform.*compose\(f, g\)\(step\)$"):
        ct.compose(classify)


def test_a_predicate_of_one_module_is_not_taken_for_a_step():
    chosen = ct.checkpoint_activations(lambda m: isinstance(m, nn.Linear))(classify)
    state = make_state()
    chosen(state, (torch.randn(4, 5, dtype=torch.float64), torch.randint(0, 3, (4,))))
    assert state.step == 1


def test_options_in_the_step_place_are_refused_with_the_keyword_to_use():
    with pytest.raises(TypeError, match=r"^mixed_precision: the dtype is given twice, 'bf16' and dtype='fp16'"):
        ct.mixed_precision("bf16", dtype="fp16")
    with pytest.raises(TypeError, match=r"^sharded: step must be a function .*got <class .*Linear'> \(type\).*"):
        ct.sharded(nn.Linear)
    with pytest.raises(TypeError, match=r"sharded\(modules=Linear\)$"):
        ct.sharded(nn.Linear)
    with pytest.raises(TypeError, match=r"sharded\(modules=\['layers\.0'\]\)$"):
        ct.sharded(["layers.0"])
    with pytest.raises(TypeError, match=r"^distributed: step must be a function step\(model, batch\) -> loss, got <cl"):
        ct.distributed(nn.Linear)  # a class is no step: calling it would build a module, not a loss


# -- inspect.signature ------------------------------------------------------------------------------
def _built() -> list[ct.TrainStep]:
    return [
        ct.train_step(classify),
        ct.accumulate(2)(classify),
        ct.accumulate("auto")(classify),
        ct.accumulate(2, weight=len)(classify),
        ct.accumulate(micro_batch=3)(classify),
        ct.mixed_precision(classify),
        ct.mixed_precision("fp16", loss_scale=8.0)(classify),
        ct.distributed(classify),
        ct.sharded(classify),
        ct.clip_grad_norm(1.0)(classify),
        ct.clip_grad_value(0.5)(classify),
        ct.adaptive_clip_grad(0.01, exclude=["2.bias"])(classify),
        ct.ema(0.9, decay_warmup=True, dtype=torch.float32)(classify),
        ct.data_parallel(["cpu", "cpu"])(classify),
        ct.pipeline_split({"0": "cpu", "1": "cpu", "2": "cpu"}, chunks=2)(classify),
        ct.checkpoint_activations("0")(classify),
        ct.compose(ct.clip_grad_norm(1.0), ct.mixed_precision, ct.accumulate(4))(classify),
        ct.distributed(ct.mixed_precision(ct.accumulate(16)(classify))),
        ct.sharded(ct.checkpoint_activations(nn.Linear)(ct.accumulate(2)(classify))),
    ]


@pytest.mark.parametrize("train", _built(), ids=repr)
def test_a_train_steps_signature_is_how_it_is_called(train):
    sig = inspect.signature(train)
    assert list(sig.parameters) == ["state", "batch"]
    assert sig.parameters["state"].annotation is ct.TrainState and sig.return_annotation is StepOutput
    # while it keeps the plain step's identity, and what it wraps
    assert train.__name__ == "classify" and train.__doc__ == classify.__doc__
    assert train.__wrapped__ is (classify if train.inner is None else train.inner)
    assert inspect.unwrap(train) is classify
    assert inspect.signature(inspect.unwrap(train)) == inspect.signature(classify)
    assert list(inspect.signature(train.__call__).parameters) == ["state", "batch"]


def test_a_train_step_runs_as_its_signature_binds():
    train = ct.accumulate(2)(classify)
    batch = (torch.randn(4, 5, dtype=torch.float64), torch.randint(0, 3, (4,)))
    bound = inspect.signature(train).bind(state=make_state(), batch=batch)
    out = train(*bound.args, **bound.kwargs)
    assert isinstance(out, StepOutput) and bound.arguments["state"].step == 1
    assert inspect.signature(ct.TrainStep).parameters.keys() == {"inner", "weight"}  # the class: its constructor

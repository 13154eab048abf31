"""Every refusal of a TrainStep call leaves the state as it was before the call, bit for bit (pitfall 38).

One harness for all of them: each case makes one refusal fire (the step's output, a transform's check of the
forward's outputs, the schedule, the model), after a first good update has created every piece of state; the
parameters, buffers, gradients (also ones set before the call), optimizer and scheduler state, ``state.step``,
the transforms' state and the torch, Python and NumPy generators are compared with ``torch.equal`` / ``==``.
A call after the refusal then trains exactly as if the refused call had never been made.
"""

from __future__ import annotations

import copy
import random
import re
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import composetrain as ct
from composetrain.core.protocol import TrainStep


class StatefulNet(nn.Module):
    """Buffers a forward changes in place (BatchNorm), a dropout mask (torch's generator), and a frozen buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.drop, self.fc2 = nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 3)
        self.register_buffer("offset", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.tanh(self.bn(self.fc1(x)) + self.offset)))


class Fault:
    """What the step does wrong on the next call: ``output(model, loss, metrics, piece) -> (loss, metrics)``."""

    output: Any = None
    pieces = 0


FAULT = Fault()


def step(model: nn.Module, batch: Any) -> Any:
    x, y = batch
    noise = random.random() + float(np.random.rand())  # Python's and NumPy's generators draw too
    logits = model(x * (1 + 1e-3 * noise))
    loss = F.cross_entropy(logits, y)
    metrics: dict[Any, Any] = {"acc": (logits.argmax(-1) == y).float().mean()}
    FAULT.pieces += 1
    if FAULT.output is not None:
        return FAULT.output(model, loss, metrics, FAULT.pieces)
    return loss, metrics


class _NoLastBackward(TrainStep):
    """A (broken) transform that never marks a backward as the update's last: mixed_precision never unscales."""

    def grads(self, state, batch, ctx):
        return self._inner().grads(state, batch, ctx._replace(last_backward=False))


def build(kind: str) -> TrainStep:
    plain = ct.accumulate(2)(step)
    if kind == "mixed_precision":
        return ct.ema(0.9)(_NoLastBackward(ct.mixed_precision(check_finite=True)(plain)))
    return ct.ema(0.9)(ct.clip_grad_norm(1.0)(ct.mixed_precision(check_finite=True)(plain)))


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g)


def state_of(scheduler: str = "step") -> ct.TrainState:
    torch.manual_seed(0)
    model = StatefulNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched: Any = {
        "step": lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
        "one_cycle": lambda: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1),
    }[scheduler]()
    return ct.TrainState(model, opt, sched)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def everything(state: ct.TrainState) -> dict[str, Any]:
    """A deep copy of everything a refused call must leave as it was."""
    model = state.model
    return copy.deepcopy(
        {
            "params": {k: p.detach() for k, p in model.named_parameters()},
            "param_ids": [id(p) for p in model.parameters()],
            "buffers": {k: b for k, b in model.named_buffers()},
            "buffer_ids": [id(b) for b in model.buffers()],
            "grads": {k: p.grad for k, p in model.named_parameters()},
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
            "lr": [g["lr"] for g in state.optimizer.param_groups],
            "step": state.step,
            "transforms": state.state_dict()["transforms"],
            "rng": (torch.get_rng_state(), random.getstate(), np.random.get_state()),
        }
    )


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Equal, tensors by ``torch.equal`` (and dtype), everything else by ``==``."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


class StrName(str):
    """A str subclass that hashes as itself: a dict holds it beside its text."""

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


def with_metrics(extra):
    return lambda model, loss, metrics, piece: (loss, extra(metrics))


def cast_buffer(model, loss, metrics, piece):
    if piece % 2 == 0:  # after the last micro-batch's forward: re-registered in another dtype, ema refuses it
        model.bn.running_mean = model.bn.running_mean.double()
    return loss, metrics


def new_buffer(model, loss, metrics, piece):
    model.fc1.register_buffer("seen", torch.ones(1))  # a buffer the average does not have
    return loss, metrics


def fail_late(model, loss, metrics, piece):
    raise RuntimeError("the step's own error, after its forward")


# (id, step kind, scheduler, fault, before the call, error, message): one entry per refusal of the update path
CASES = [
    (
        "name-int",
        "plain",
        "step",
        with_metrics(lambda m: {0: m["acc"]}),
        None,
        TypeError,
        r"the step returns metric 0 \(int\); metric names must be str",
    ),
    (
        "name-tuple",
        "plain",
        "step",
        with_metrics(lambda m: {("acc", 0): m["acc"]}),
        None,
        TypeError,
        r"metric names must be str",
    ),
    (
        "name-reserved",
        "plain",
        "step",
        with_metrics(lambda m: {**m, "lr": m["acc"]}),
        None,
        ValueError,
        r"the step returns metric 'lr', a name ct.run's training records use",
    ),
    (
        "name-not-utf8",
        "plain",
        "step",
        with_metrics(lambda m: {"acc\udcff": m["acc"]}),
        None,
        ValueError,
        r"which UTF-8 cannot encode",
    ),
    (
        "name-twice",
        "plain",
        "step",
        with_metrics(lambda m: {StrName("acc"): m["acc"], "acc": m["acc"]}),
        None,
        ValueError,
        r"the step returns two metrics named 'acc'",
    ),
    (
        "name-of-a-transform",
        "plain",
        "step",
        with_metrics(lambda m: {**m, "grad_norm": m["acc"]}),
        None,
        ValueError,
        r"that a transform reports as well",
    ),
    (
        "value-complex",
        "plain",
        "step",
        with_metrics(lambda m: {**m, "z": torch.complex(m["acc"], m["acc"])}),
        None,
        TypeError,
        r"metric 'z' .*complex",
    ),
    (
        "value-meta",
        "plain",
        "step",
        with_metrics(lambda m: {**m, "m": torch.tensor(1.0, device="meta")}),
        None,
        TypeError,
        r"metric 'm' .*'meta' device",
    ),
    (
        "value-not-a-number",
        "plain",
        "step",
        with_metrics(lambda m: {**m, "s": "x"}),
        None,
        TypeError,
        r"metric 's' must be a scalar tensor or a number",
    ),
    (
        "names-differ-per-piece",
        "plain",
        "step",
        lambda model, loss, metrics, piece: (loss, {**metrics, "late": 1.0} if piece % 2 == 0 else metrics),
        None,
        ValueError,
        r"returned metrics .* for piece 2",
    ),
    (
        "loss-not-scalar",
        "plain",
        "step",
        lambda model, loss, metrics, piece: (loss.expand(2), metrics),
        None,
        ValueError,
        r"the loss must be a scalar",
    ),
    (
        "loss-detached",
        "plain",
        "step",
        lambda model, loss, metrics, piece: (loss.detach(), metrics),
        None,
        ValueError,
        r"does not require grad",
    ),
    ("step-raises", "plain", "step", fail_late, None, RuntimeError, r"the step's own error"),
    (
        "ema-buffer-cast",
        "plain",
        "step",
        cast_buffer,
        None,
        ValueError,
        r"ema: the model's 'bn.running_mean' is \(8,\) torch.float64, its average \(8,\) torch.float32",
    ),
    ("ema-buffer-new", "plain", "step", new_buffer, None, ValueError, r"ema: the model's parameters and buffers"),
    (
        "ema-model-changed",
        "plain",
        "step",
        None,
        lambda s: s.model.add_module("extra", nn.Linear(3, 3)),
        ValueError,
        r"ema: the model's parameters and buffers differ",
    ),
    ("never-unscaled", "mixed_precision", "step", None, None, RuntimeError, r"the gradients were never unscaled"),
    ("schedule-exhausted", "plain", "one_cycle", None, None, ValueError, r"OneCycleLR is exhausted"),
]


@pytest.fixture(autouse=True)
def _no_fault():
    FAULT.output, FAULT.pieces = None, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # accumulate's BatchNorm warning; autocast on the CPU
        yield
    FAULT.output = None


@pytest.mark.parametrize(
    ("kind", "scheduler", "fault", "before", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
@pytest.mark.parametrize("grads_before", [False, True], ids=["no-grads", "grads-set-before"])
def test_a_refused_call_leaves_every_piece_of_state_bit_identical(
    kind, scheduler, fault, before, error, message, grads_before
):
    state = state_of(scheduler)
    train = build(kind) if kind != "mixed_precision" else build("plain")
    seed_all(3)
    train(state, batch(1))  # a good first update: optimizer, scheduler, loss scale and EMA state exist
    if kind == "mixed_precision":
        train = build(kind)
    if grads_before:
        for p in list(state.model.parameters())[::2]:
            p.grad = torch.randn_like(p)
    if before is not None:
        before(state)
    seed_all(4)
    kept = everything(state)
    FAULT.output, FAULT.pieces = fault, 0
    with pytest.raises(error, match=message):
        train(state, batch(2))
    assert_same(everything(state), kept)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c[1] == "plain" and c[4] is None and c[3] is not None], ids=lambda c: c[0]
)
def test_after_a_refused_call_training_goes_on_as_if_it_had_never_been_made(case):
    _, kind, scheduler, fault, _, error, message = case
    runs = []
    for refuse in (False, True):
        state, train = state_of(scheduler), build(kind)
        seed_all(3)
        train(state, batch(1))
        seed_all(4)
        if refuse:
            FAULT.output, FAULT.pieces = fault, 0
            with pytest.raises(error, match=message):
                train(state, batch(2))
            FAULT.output = None
        out = train(state, batch(2))
        kept = everything(state)
        del kept["param_ids"], kept["buffer_ids"]  # two states' own
        runs.append((kept, out.loss))
    assert_same(runs[1], runs[0])


@pytest.mark.parametrize("refused", [False, True], ids=["applied", "refused"])
def test_a_parameter_the_model_gained_after_the_state_was_built_ends_every_call_without_a_gradient(refused):
    # TrainState finds the parameters its optimizer does not hold when it is built; a head added later, outside
    # the optimizer, must not keep (and grow) the gradients of every call, nor of a refused one
    state = state_of()
    train = ct.clip_grad_norm(1.0)(ct.accumulate(2)(step))  # no ct.ema, which refuses a changed model
    seed_all(3)
    train(state, batch(1))
    state.model.fc2 = nn.Sequential(state.model.fc2, nn.Linear(3, 3))
    if refused:
        FAULT.output = with_metrics(lambda m: {**m, "grad_norm": m["acc"]})
    kept = everything(state)
    for _ in range(2):
        if refused:
            with pytest.raises(ValueError, match="that a transform reports as well"):
                train(state, batch(2))
        else:
            train(state, batch(2))
    assert all(p.grad is None for p in state.model.parameters())
    if refused:
        assert_same(everything(state), kept)


def _wrapped_one_cycle(kind: str, opt: torch.optim.Optimizer) -> Any:
    lr = torch.optim.lr_scheduler
    cycle = lr.OneCycleLR(opt, max_lr=0.1, total_steps=2 if kind != "sequential-twice" else 1)
    if kind == "sequential":
        return lr.SequentialLR(opt, [lr.ConstantLR(opt, factor=0.5, total_iters=2), cycle], milestones=[2])
    if kind == "sequential-twice":  # one cycle, run twice: restarted at the milestone, not stepped there
        return lr.SequentialLR(opt, [cycle, cycle], milestones=[3])
    return lr.ChainedScheduler([lr.ExponentialLR(opt, 0.9), cycle])


def _updates_torch_allows(kind: str) -> int:
    """How many updates a plain loop makes before the scheduler's step() raises."""
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1e-2)
    scheduler = _wrapped_one_cycle(kind, opt)
    for i in range(20):
        opt.step()
        try:
            scheduler.step()
        except ValueError:
            return i
    raise AssertionError("the schedule never ran out")


@pytest.mark.parametrize("kind", ["sequential", "sequential-twice", "chained"])
def test_a_one_cycle_inside_sequential_or_chained_schedulers_is_refused_before_the_update_past_it(kind):
    # OneCycleLR raises in scheduler.step(), after optimizer.step() moved the parameters: the check before the
    # update must find it inside the schedulers that step it, and refuse no update torch has steps for
    torch.manual_seed(0)
    model = StatefulNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = ct.TrainState(model, opt, _wrapped_one_cycle(kind, opt))
    train = build("plain")
    seed_all(3)
    applied = 0
    for i in range(20):
        kept = everything(state)
        try:
            train(state, batch(i))
        except ValueError as e:
            assert re.search(
                r"the scheduler OneCycleLR \(inside (SequentialLR|ChainedScheduler)\) is exhausted", str(e)
            )
            assert_same(everything(state), kept)
            break
        applied += 1
    else:
        pytest.fail("the update past OneCycleLR's total_steps was not refused")
    assert applied == state.step == _updates_torch_allows(kind)
    assert state.unusable is None


class _FailingSchedule(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR whose closure fails at its second step (a list of factors too short)."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        factors = [1.0, 0.5]
        super().__init__(opt, lambda update: factors[update])


def test_a_scheduler_that_raises_after_the_optimizer_stepped_leaves_the_state_unusable():
    # nothing can know beforehand that a closure fails; once optimizer.step() has moved the weights, the state
    # is half-updated (its step count and schedule behind them) and says so, rather than training on
    torch.manual_seed(0)
    model = StatefulNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = ct.TrainState(model, opt, _FailingSchedule(opt))
    train = build("plain")
    train(state, batch(1))
    with pytest.raises(IndexError):
        train(state, batch(2))
    assert state.step == 1 and state.unusable is not None
    assert "_FailingSchedule's step() raised (IndexError" in state.unusable
    with pytest.raises(RuntimeError, match="this TrainState is half-updated"):
        train(state, batch(3))


def test_a_refused_call_of_accumulate_auto_leaves_its_micro_batch_size_as_it_was():
    # the passes ran out of memory and found a smaller size; a refusal after them changes nothing, the size the
    # TrainState keeps (and checkpoints) included; an applied update keeps it
    fits = {"limit": 100, "clash": False}

    def limited(model, batch):
        if batch[0].shape[0] > fits["limit"]:
            raise torch.OutOfMemoryError("simulated: the micro-batch does not fit")
        loss, metrics = step(model, batch)
        return (loss, {**metrics, "grad_norm": loss.detach()}) if fits["clash"] else (loss, metrics)

    state = state_of()
    train = ct.clip_grad_norm(1.0)(ct.accumulate("auto")(limited))
    seed_all(3)
    train(state, batch(1))
    fits.update(limit=6, clash=True)
    kept = everything(state)
    with pytest.raises(ValueError, match="that a transform reports as well"):
        train(state, batch(2))
    assert_same(everything(state), kept)
    assert state.state_dict()["transforms"]["accumulate_auto"] == {"micro_batch": None}
    fits["clash"] = False
    assert float(train(state, batch(2)).metrics["micro_batch"]) == 6.0
    assert state.state_dict()["transforms"]["accumulate_auto"] == {"micro_batch": 6}


class Renormed(nn.Module):
    """nn.Embedding(max_norm=...) renormalises the rows it looks up in its weight, in place, in its forward."""

    def __init__(self, bag: bool) -> None:
        super().__init__()
        self.bag = bag
        kind = nn.EmbeddingBag if bag else nn.Embedding
        self.emb = kind(10, 4, max_norm=0.5, **({"mode": "sum"} if bag else {}))
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        found = self.emb(tokens) if self.bag else self.emb(input=tokens).mean(1)  # by keyword too
        return self.head(found)


@pytest.mark.parametrize("bag", [False, True], ids=["Embedding", "EmbeddingBag"])
@pytest.mark.parametrize("n", [1, 2])
def test_the_rows_an_embedding_with_max_norm_renormalised_are_put_back_by_a_refusal(bag, n):
    def renormed_step(model, batch):
        tokens, y = batch
        loss = F.cross_entropy(model(tokens), y)
        return (loss, {"grad_norm": loss.detach()}) if FAULT.output else loss

    def run(refuse: bool) -> dict[str, Any]:
        torch.manual_seed(0)
        model = Renormed(bag).double()
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.5))
        train = ct.clip_grad_norm(10.0)(ct.accumulate(n)(renormed_step))
        g = torch.Generator().manual_seed(1)
        batches = [(torch.randint(0, 10, (6, 3), generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in "ab"]
        train(state, batches[0])
        if refuse:
            kept = everything(state)
            FAULT.output = True
            with pytest.raises(ValueError, match="that a transform reports as well"):
                train(state, batches[1])
            FAULT.output = None
            assert_same(everything(state), kept)
        train(state, batches[1])
        assert not model.emb._forward_pre_hooks  # the hooks that keep the rows last one call only
        out = everything(state)
        del out["param_ids"], out["buffer_ids"]
        return out

    assert_same(run(refuse=True), run(refuse=False))

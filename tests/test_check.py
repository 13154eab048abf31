"""ct.check: a user's composition against the plain step on copies: right ones agree (within their dtype's
tolerance), a planted wrong one is found and its layer named, the user's state and batch are never touched."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_untouched, classify, make_batch, make_state, snapshot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import composetrain as ct


class Twice(ct.TrainStep):
    """A planted bug: a transform that scales the loss for backward a second time (gradients doubled)."""

    label = "twice"

    def grads(self, state, batch, ctx):
        return self._inner().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda loss: loss * 2)))


def summed(model, batch):
    """A planted bug: a step whose loss is the batch's sum, not its mean (accumulate weighs means)."""
    loss, _ = classify(model, batch)
    return loss * len(batch[0])


def blocks(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


RIGHT = {
    "accumulate": lambda: ct.accumulate(3)(classify),
    "clip": lambda: ct.clip_grad_norm(0.05)(ct.accumulate(2)(classify)),
    "fp16": lambda: ct.compose(ct.clip_grad_norm(0.5), ct.mixed_precision(dtype="fp16"), ct.accumulate(4))(classify),
    "checkpoint_activations": lambda: ct.checkpoint_activations(["0", "3"])(ct.accumulate(2)(classify)),
    "data_parallel": lambda: ct.data_parallel(["cpu", "cpu"])(ct.accumulate(2)(classify)),
    "distributed (one process)": lambda: ct.distributed(ct.accumulate(2)(classify)),
    "pipeline_split": lambda: ct.pipeline_split(
        {"0": "cpu", "1": "cpu", "2": "cpu", "3": "cpu", "4": "cpu", "5": "cpu"}, chunks=2
    )(classify),
}


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_right_compositions_agree_in_float64_and_leave_the_users_state_and_batch_alone(name):
    state = make_state(1, model=blocks().to(torch.float32))  # float32: check casts its copies
    state.model.eval()  # dropout off: the reference and the composition draw differently under data_parallel
    batch = make_batch(12, seed=3, dtype=torch.float32)
    ct.accumulate(2)(classify)(state, make_batch(12, seed=2, dtype=torch.float32))  # momentum, a scheduler step
    before, kept = snapshot(state), copy.deepcopy(batch)
    result = ct.check(RIGHT[name](), state, batch)
    assert result and result.ok and result.dtype is torch.float64, result
    assert result.diverges_at is None and result.layers == ()
    assert result.grads.largest <= 1e-12 and result.params.largest <= 1e-12 and result.grads.scale > 0
    assert_untouched(state, before)
    assert state.model.training is False and next(state.model.parameters()).dtype is torch.float32
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(batch, kept, strict=True))


def test_both_sides_draw_the_same_random_numbers_and_the_users_generators_stay_as_they_were():
    """Dropout in training mode: the plain step and the composition start from the same generator states (one
    mask for 12 samples is three masks for 4 in turn), and the user's stream goes on as if check never ran."""
    state = make_state(1, model=blocks())
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    for train in (ct.checkpoint_activations(["3"])(classify), ct.accumulate(3)(classify)):
        result = ct.check(train, state, make_batch(12))
        assert result and result.params.largest < 1e-15, result
    assert torch.equal(torch.rand(3), expected)


def test_mixed_precision_is_checked_in_its_own_precision_with_its_tolerance():
    state = make_state(2, model=blocks().eval().to(torch.float32))
    batch = make_batch(16, seed=1, dtype=torch.float32)
    for dtype, rtol in (("bf16", 5e-2), ("fp16", 1e-2)):
        result = ct.check(ct.mixed_precision(dtype=dtype)(ct.accumulate(2)(classify)), state, batch, dtype=None)
        assert result, result
        assert result.dtype is torch.float32 and result.rtol == rtol and result.grads.largest > 0  # rounded
    assert ct.check(ct.mixed_precision(dtype="bf16")(classify), state, batch).dtype is torch.float64
    tight = ct.check(ct.mixed_precision(dtype="bf16")(classify), state, batch, dtype=None, rtol=1e-6, atol=0)
    assert not tight and tight.diverges_at == "mixed_precision(dtype='bf16')"


def test_mixed_precision_in_fp32_is_a_no_op_judged_at_the_models_precision():
    """mixed_precision("fp32") enters no autocast (a config's toggle): nothing rounds lower than float32, so a
    1% wrong composition inside it is named, not passed at bf16's 5e-2."""
    state = make_state(2, model=blocks().eval().to(torch.float32))
    batch = make_batch(16, seed=1, dtype=torch.float32)

    class Percent(Twice):
        label = "percent"

        def grads(self, state, batch, ctx):
            return self._inner().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda v: v * 1.01)))

    for dtype in ("fp32", torch.float32):
        right = ct.check(ct.mixed_precision(dtype=dtype)(ct.accumulate(2)(classify)), state, batch, dtype=None)
        assert right and right.lowest is torch.float32 and right.rtol == 1e-4, right
        wrong = ct.check(ct.mixed_precision(dtype=dtype)(Percent(ct.train_step(classify))), state, batch, dtype=None)
        assert not wrong and wrong.diverges_at == "percent" and wrong.rtol == 1e-4, wrong


@pytest.mark.parametrize(
    ("build", "layer"),
    [
        (
            lambda: ct.compose(ct.clip_grad_norm(1.0), ct.mixed_precision(dtype="fp16"), ct.accumulate(2))(
                Twice(ct.train_step(classify))
            ),
            "twice",
        ),
        (lambda: ct.accumulate(2)(Twice(ct.data_parallel(["cpu", "cpu"])(classify))), "twice"),
        (lambda: ct.clip_grad_norm(10.0)(ct.accumulate(3)(summed)), "accumulate(3)"),
        (lambda: ct.data_parallel(["cpu", "cpu"])(summed), "data_parallel(['cpu', 'cpu'])"),
    ],
    ids=["loss scaled twice", "loss scaled twice, inside", "summed loss", "summed loss, data_parallel"],
)
def test_a_planted_wrong_composition_is_found_and_its_layer_named(build, layer):
    state = make_state(4, model=blocks().eval())
    before = snapshot(state)
    result = ct.check(build(), state, make_batch(12, seed=5))
    assert not result and result.diverges_at == layer, result
    assert result.grads.relative > 1e-3 and result.params.relative > 1e-6
    assert result.layers[-1] == (result.layers[-1][0], False) and all(ok for _, ok in result.layers[:-1])
    assert result.layers[-1][0].startswith(layer)
    assert f"first diverging layer: {layer}" in repr(result) and "DIFFERS from" in repr(result)
    assert_untouched(state, before)


def test_the_reference_keeps_the_transforms_that_change_the_update():
    """clip_grad_norm changes the update: the reference clips too; the gradients compared are before clipping."""
    state = make_state(3, model=blocks().eval())
    result = ct.check(ct.accumulate(2)(ct.clip_grad_norm(1e-3)(classify)), state, make_batch(12))
    assert result and result.reference == "clip_grad_norm(0.001)(classify)"
    assert result.grads.scale > 1e-2  # unclipped gradients (a norm of 1e-3 would bound them)

    class Halve(Twice):  # a user's own transform that means to change the update, and says so
        label = "halve"
        changes_update = True

        def grads(self, state, batch, ctx):
            return self._inner().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda v: v / 2)))

    result = ct.check(ct.accumulate(2)(Halve(ct.train_step(classify))), state, make_batch(12))
    assert result and result.reference == "halve(classify)"


def test_a_model_that_refuses_float64_is_checked_in_its_own_precision():
    def float32_only(model, batch):
        x, y = batch
        if x.dtype is not torch.float32:
            raise TypeError("this kernel takes float32 only")
        return F.cross_entropy(model(x), y)

    state = make_state(model=blocks().eval().float())
    result = ct.check(ct.accumulate(2)(float32_only), state, make_batch(12, dtype=torch.float32))
    assert result and result.dtype is torch.float32 and (result.rtol, result.atol) == (1e-4, 1e-6), result


def test_bad_arguments_are_clear_errors():
    state = make_state()
    with pytest.raises(TypeError, match=r"check: state must be a ct.TrainState, got"):
        ct.check(classify, state.model, make_batch(4))
    with pytest.raises(TypeError, match=r"check: dtype must be a floating torch.dtype or None, got torch.int64"):
        ct.check(classify, state, make_batch(4), dtype=torch.int64)
    with pytest.raises(TypeError, match=r"check: train_step must be a function step\(model, batch\)"):
        ct.check(ct.accumulate(2), state, make_batch(4))
    state.unusable = "a transform failed half-way"
    with pytest.raises(RuntimeError, match=r"check: a transform failed half-way"):
        ct.check(classify, state, make_batch(4))


def test_the_result_reads_well():
    result = ct.check(ct.accumulate(2)(classify), make_state(), make_batch(8))
    text = repr(result).splitlines()
    assert (
        text[0] == "check: accumulate(2)(classify) agrees with train_step(classify) in float64 (rtol=1e-09, atol=1e-12)"
    )
    assert [line.split(":")[0].strip() for line in text[1:]] == ["loss", "gradients", "parameters"]


def test_a_composition_of_several_processes_is_refused_under_a_group_and_the_rest_checked(pool):
    a, b = pool.run(__name__, "under_a_group")
    assert a == b
    assert a["refused"].startswith("check: distributed(accumulate(2)(classify)) synchronises the 2 processes")
    assert a["inside"] is True


def test_a_non_finite_update_is_a_difference():
    class Poison(Twice):
        label = "poison"

        def grads(self, state, batch, ctx):
            return self._inner().grads(state, batch, ctx._replace(scale_loss=(lambda v: v * float("nan"),)))

    result = ct.check(ct.accumulate(2)(Poison(ct.train_step(classify))), make_state(), make_batch(8))
    assert not result and result.diverges_at == "poison" and result.grads.largest != result.grads.largest  # NaN


PARTS = {
    "accumulate": lambda: ct.accumulate(3),
    "clip": lambda: ct.clip_grad_norm(0.05),
    "fp16": lambda: ct.mixed_precision(dtype="fp16"),
    "checkpoint": lambda: ct.checkpoint_activations(["3"]),
    "data_parallel": lambda: ct.data_parallel(["cpu", "cpu"]),
}


@settings(max_examples=15)
@given(order=st.permutations(sorted(PARTS)), keep=st.integers(1, len(PARTS)), planted=st.integers(0, 5))
def test_any_accepted_order_agrees_and_a_planted_layer_is_found_wherever_it_sits(order, keep, planted):
    """Compositions drawn from the transforms, in any order the library accepts: check agrees; with Twice planted
    at any depth (0: around the plain step), it names Twice."""
    chosen = [PARTS[name]() for name in order[:keep]]
    try:
        right = ct.compose(*chosen)(classify)
    except ValueError:  # an order refused when built (data_parallel around mixed_precision)
        assume(False)
    state = make_state(6, model=blocks().eval())
    assert ct.check(right, state, make_batch(10, seed=planted)), right
    at = min(planted, len(chosen))
    wrong = ct.compose(*chosen[: len(chosen) - at])(Twice(ct.compose(*chosen[len(chosen) - at :])(classify)))
    result = ct.check(wrong, state, make_batch(10, seed=planted))
    assert not result and result.diverges_at == "twice", result


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.check under a process group.


def under_a_group(rank, world):
    """A composition that synchronises the group is refused; the part inside it is checked on each rank."""
    state = make_state(rank)
    try:
        ct.check(ct.distributed(ct.accumulate(2)(classify)), state, make_batch(8, seed=rank))
        refused = "no error"
    except ValueError as e:
        refused = str(e)
    return {"refused": refused, "inside": bool(ct.check(ct.accumulate(2)(classify), state, make_batch(8, seed=rank)))}


# -- hostile inputs: a model failing in float64 after drawing, complex parameters, nonsense tolerances, wrong buffers -


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


class ExtraForward(ct.TrainStep):
    """A planted bug that leaves the gradients alone: a forward of its own before the step's (a "warm-up" pass,
    a logging pass), so BatchNorm's running statistics take two steps where the plain step takes one."""

    label = "extra_forward"

    def grads(self, state, batch, ctx):
        with torch.no_grad():
            state.model(batch[0])
        return self._inner().grads(state, batch, ctx)


def batchnormed():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3)).double()


def test_buffers_a_composition_updates_wrongly_are_a_difference_and_its_layer_named():
    result = ct.check(
        ct.accumulate(1)(ExtraForward(ct.train_step(classify))), make_state(model=batchnormed()), make_batch(12)
    )
    assert not result and result.diverges_at == "extra_forward", result
    assert result.grads.largest == 0 and result.params.largest == 0  # only the buffers tell
    assert result.buffers is not None and result.buffers.largest > 0 and "buffers:" in repr(result)


def test_right_compositions_agree_in_the_buffers_too():
    result = ct.check(ct.checkpoint_activations(["1"])(classify), make_state(model=batchnormed()), make_batch(12))
    assert result and result.buffers is not None and result.buffers.scale > 0, result
    assert result.buffers.largest == 0, result
    plain = ct.check(classify, make_state(), make_batch(4))
    assert plain.buffers is None and "buffers:" not in repr(plain)  # a model without buffers: no such line


def test_a_state_with_averages_already_is_checked_in_float64():
    """ct.ema's averages (float32, like the model) are cast with the copies, not a reason to fall back."""
    torch.manual_seed(0)
    state = make_state(model=nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)))
    train = ct.ema(0.99, warmup=5)(ct.accumulate(2)(classify))
    for i in range(3):
        train(state, make_batch(12, seed=i, dtype=torch.float32))
    before = copy.deepcopy(state.state_dict())
    result = ct.check(train, state, make_batch(12, dtype=torch.float32))
    assert result and result.dtype is torch.float64, result
    after = state.state_dict()["transforms"]
    assert all(
        torch.equal(a, b) and a.dtype is torch.float32
        for a, b in zip(
            after["ema"]["averages"].values(), before["transforms"]["ema"]["averages"].values(), strict=True
        )
    )


@pytest.mark.filterwarnings("ignore:accumulate.*BatchNorm")
def test_a_step_that_reaches_the_users_own_model_is_refused_and_the_model_restored():
    """A step that uses a global model instead of its argument trains the user's model, not check's copy: the
    copies got no gradient and check would agree about nothing. It is refused, the user's model put back."""
    model = batchnormed()

    def global_model(_, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    state = make_state(model=model)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError, match=r"check: the step changed your own model .*the gradient of '0.weight'.* model argument"
    ):
        ct.check(ct.accumulate(2)(global_model), state, make_batch(12))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())


def test_a_tensor_outside_the_model_the_step_closes_over_is_refused():
    """The optimizer's copy of it never gets a gradient: the user's own one does (and check would not see it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3)).double()
    temperature = nn.Parameter(torch.ones((), dtype=torch.float64))
    state = ct.TrainState(model, torch.optim.SGD([*model.parameters(), temperature], lr=0.1))

    def scaled(model, batch):
        x, y = batch
        return F.cross_entropy(model(x) * temperature, y)

    with pytest.raises(ValueError, match=r"check: the step changed your own .*gradient of the optimizer's"):
        ct.check(scaled, state, make_batch(12))
    assert temperature.grad is None and temperature.item() == 1.0


def test_a_state_whose_scheduler_steps_per_epoch_is_checked():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    state = ct.TrainState(model, opt, sched, scheduler_interval="epoch")
    result = ct.check(ct.accumulate(3)(classify), state, make_batch(12))
    assert result and result.params.largest < 1e-15 and result.params.scale > 0, result
    assert sched.last_epoch == 0 and state.scheduler_interval == "epoch"


def test_the_users_generators_stay_as_they_were_when_the_step_raises_after_drawing():
    def draws_then_fails(model, batch):
        torch.rand(4)  # dropout, a random crop: then the user's own bug
        raise KeyError("label")

    state, batch = make_state(), make_batch(12)  # (make_state seeds)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with pytest.raises(KeyError, match="label"):
        ct.check(ct.accumulate(2)(draws_then_fails), state, batch)
    assert torch.equal(torch.rand(3), expected)


def test_a_batch_the_plain_step_itself_cannot_train_on_is_refused_not_blamed_on_a_layer():
    """NaN in the batch: the plain step's own loss and gradients are NaN, so every layer "differs" from it and the
    innermost was named as the culprit. Nothing can be compared: refused, saying so."""
    x, y = make_batch(12)
    x[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"check: the plain step's own update .* is not finite \(loss nan"):
        ct.check(ct.clip_grad_norm(1.0)(ct.accumulate(2)(classify)), make_state(), (x, y))


class SparseEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.linear = nn.Embedding(10, 4, sparse=True), nn.Linear(4, 3)

    def forward(self, ids):
        return self.linear(self.embed(ids).mean(1))


def test_sparse_gradients_are_compared_and_the_users_left_as_they_were():
    torch.manual_seed(0)
    model = SparseEmbedding().double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 10, (6, 3), generator=g), torch.randint(0, 3, (6,), generator=g))
    classify(model, batch)[0].backward()  # the user's own sparse gradient, left there
    kept = model.embed.weight.grad.to_dense().clone()
    result = ct.check(ct.accumulate(2)(classify), state, batch)
    assert result and result.grads.scale > 0, result
    assert model.embed.weight.grad.is_sparse and torch.equal(model.embed.weight.grad.to_dense(), kept)
    wrong = ct.check(ct.accumulate(2)(lambda m, b: classify(m, b)[0] * len(b[0])), state, batch)
    assert not wrong and wrong.diverges_at == "accumulate(2)", wrong


def test_what_check_cannot_copy_is_a_clear_error_naming_check_and_nothing_changes():
    """check runs on deep copies: a batch or model that copy.deepcopy refuses failed with its bare error."""
    import threading

    from helpers import assert_untouched, snapshot

    state = make_state()
    before = snapshot(state)
    x, y = make_batch(8)
    hooked = x.clone().requires_grad_() * 2  # a tensor in a graph: deepcopy refuses all but leaves
    for batch in ((t for t in (x, y)), (hooked, y)):
        with pytest.raises(TypeError, match=r"check: cannot copy the batch \(.+\): check runs on a deep copy"):
            ct.check(ct.accumulate(2)(classify), state, batch)
    assert_untouched(state, before)
    state.model.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"check: cannot copy your model, optimizer or scheduler \(.+_thread.lock"):
        ct.check(ct.accumulate(2)(classify), state, (x, y))
    assert_untouched(state, before)


def test_an_empty_batch_is_refused_naming_check_not_its_internal_step():
    with pytest.raises(ValueError, match=r"^check: train_step\(classify\): the batch is empty") as e:
        ct.check(ct.accumulate(2)(classify), make_state(), make_batch(0))
    assert "_Probe" not in str(e.value)


def test_a_step_that_changes_the_users_optimizer_settings_or_scheduler_is_refused_and_they_restored():
    """Warm-up done inside the step on the user's optimizer (a global), or the user's scheduler stepped there:
    check watched only the tensors, so yours changed silently ("yours are left untouched")."""
    from helpers import assert_untouched, snapshot

    state = make_state()
    ct.accumulate(2)(classify)(state, make_batch(8))  # a scheduler step and momentum to keep
    before = snapshot(state)
    optimizer, scheduler = state.optimizer, state.scheduler

    def warm_up(model, batch):
        for group in optimizer.param_groups:
            group["lr"] *= 0.5
        return classify(model, batch)

    def steps_scheduler(model, batch):
        scheduler.step()
        return classify(model, batch)

    for step, what in ((warm_up, "the optimizer's param_groups"), (steps_scheduler, "the scheduler's state")):
        with pytest.raises(ValueError, match=rf"check: the step changed your own model and optimizer \(.*{what}"):
            ct.check(ct.accumulate(2)(step), state, make_batch(8))
        assert_untouched(state, before)
        assert [g["lr"] for g in optimizer.param_groups] == [0.1]

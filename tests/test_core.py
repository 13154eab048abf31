import copy
import gc
import io
import weakref
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    assert_states_close,
    assert_states_equal,
    assert_untouched,
    classify,
    make_batch,
    make_state,
    mlp,
    snapshot,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import composetrain as ct


def hand_written_update(state, batch):
    """The textbook PyTorch update train_step must equal bit for bit."""
    loss, _ = classify(state.model, batch)
    loss.backward()
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def test_train_step_is_the_textbook_update_bit_for_bit():
    ours, theirs = make_state(1), make_state(1)
    train = ct.train_step(classify)
    for i in range(5):
        batch = make_batch(16, seed=i)
        out = train(ours, batch)
        assert torch.equal(out.loss, hand_written_update(theirs, batch))
        theirs.step += 1
    assert_states_equal(ours, theirs)
    assert ours.step == 5 and ours.scheduler.last_epoch == 5


def test_step_output_is_detached_on_device_and_grads_are_freed():
    state = make_state()
    out = ct.train_step(classify)(state, make_batch(8))
    assert out.loss.dim() == 0 and not out.loss.requires_grad and out.loss.grad_fn is None
    assert set(out.metrics) == {"acc", "n_classes"}
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in out.metrics.values())
    assert out.skipped is False
    assert all(p.grad is None for p in state.model.parameters())


class _Sentinel(torch.autograd.Function):
    """Identity whose autograd node holds an object we can watch die."""

    alive: ClassVar[list] = []

    @staticmethod
    def forward(ctx, x):
        ctx.token = _Token()
        _Sentinel.alive.append(weakref.ref(ctx.token))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Token:
    pass


def test_no_autograd_graph_survives_a_step():
    _Sentinel.alive.clear()

    def step(model, batch):
        loss, metrics = classify(model, batch)
        loss = _Sentinel.apply(loss)
        return loss, {**metrics, "loss_again": loss}  # a metric that *is* the graph's output

    state = make_state()
    outs = [ct.accumulate(3)(step)(state, make_batch(12, seed=i)) for i in range(2)]
    gc.collect()
    assert len(_Sentinel.alive) == 6
    assert all(ref() is None for ref in _Sentinel.alive), "a returned value keeps an autograd graph alive"
    assert all(o.metrics["loss_again"].grad_fn is None for o in outs)


def test_state_dict_round_trip_resumes_bit_exactly():
    train = ct.accumulate(3)(classify)
    straight = make_state(2, optimizer="adamw")
    for i in range(3):
        train(straight, make_batch(10, seed=i))
    buffer = io.BytesIO()
    torch.save(straight.state_dict(), buffer)

    resumed = make_state(99, optimizer="adamw")  # different init: everything must come from the file
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer))
    assert_states_equal(resumed, straight)
    for i in range(3, 6):
        a = train(straight, make_batch(10, seed=i))
        b = train(resumed, make_batch(10, seed=i))
        assert torch.equal(a.loss, b.loss)
    assert_states_equal(resumed, straight)
    assert resumed.step == 6


def test_load_state_dict_refuses_other_models_and_changes_nothing():
    saved = make_state(0).state_dict()
    wide = ct.TrainState(
        wide_model := nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).double(),
        torch.optim.SGD(wide_model.parameters(), lr=0.1),
        None,
    )
    before = snapshot(wide)
    with pytest.raises(ValueError, match=r"load_state_dict: .*does not match.*0.weight: \(8, 5\) vs \(16, 5\)"):
        wide.load_state_dict({**saved, "scheduler": None})
    assert_untouched(wide, before)

    no_sched = make_state(0, scheduler=False)
    with pytest.raises(ValueError, match="has scheduler state but this TrainState has no scheduler"):
        no_sched.load_state_dict(saved)
    two_groups = make_state(0)
    params = list(two_groups.model.parameters())
    two_groups.optimizer = torch.optim.SGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.1)
    with pytest.raises(ValueError, match=r"groups of sizes \[4\], this one \[2, 2\]"):
        two_groups.load_state_dict(saved)
    with pytest.raises(ValueError, match="lacks \\['step'\\]"):
        make_state(0).load_state_dict({k: v for k, v in saved.items() if k != "step"})
    with pytest.raises(ValueError, match="step must be a non-negative int, got -1"):
        make_state(0).load_state_dict({**saved, "step": -1})


def test_train_state_checks_its_arguments():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"TrainState: model must be a torch.nn.Module, got .*\(function\)"):
        ct.TrainState(classify, opt)
    with pytest.raises(TypeError, match=r"TrainState: optimizer must be a torch.optim.Optimizer, got .*\(list\)"):
        ct.TrainState(model, list(model.parameters()))
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="scheduler was built for a different optimizer"):
        ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(other, 1))
    with pytest.raises(ValueError, match="none of the optimizer's parameters belong to the model"):
        ct.TrainState(model, torch.optim.SGD(mlp(1).parameters(), lr=0.1))
    with pytest.raises(TypeError, match=r"ReduceLROnPlateau steps on a metric .*scheduler_interval=.epoch."):
        ct.TrainState(model, opt, torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
    assert repr(ct.TrainState(model, opt)) == "TrainState(step=0, model=Sequential, optimizer=SGD, scheduler=None)"


@pytest.mark.parametrize(
    ("returned", "error", "pattern"),
    [
        (lambda loss: loss.reshape(1), ValueError, r"train_step\(bad\): the loss must be a scalar .*got shape \(1,\)"),
        (lambda loss: loss.unsqueeze(0).expand(4), ValueError, r"got shape \(4,\); reduce it"),
        (lambda loss: loss.item(), TypeError, r"must return a loss tensor or \(loss, metrics\), got .*\(float\)"),
        (lambda loss: {"loss": loss}, TypeError, r"got .*\(dict\)"),
        (lambda loss: loss.detach(), ValueError, "does not require grad"),
        (lambda loss: (loss, [1.0]), TypeError, "metrics must be a mapping"),
        (lambda loss: (loss, {"v": torch.ones(3)}), TypeError, "metric 'v' must be a scalar tensor or a number"),
    ],
)
def test_bad_step_outputs_are_clear_errors_and_change_nothing(returned, error, pattern):
    def bad(model, batch):
        return returned(classify(model, batch)[0])

    state = make_state()
    before = snapshot(state)
    for train in (ct.train_step(bad), ct.accumulate(2)(bad)):
        with pytest.raises(error, match=pattern) as info:
            train(state, make_batch(6))
        assert str(info.value).startswith("train_step(bad): ")  # names the step that returned it
        assert_untouched(state, before)


def test_an_error_midway_through_a_split_changes_nothing():
    calls = []

    def flaky(model, batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("out of memory (simulated)")
        return classify(model, batch)

    state = make_state()
    before = snapshot(state)
    with pytest.raises(RuntimeError, match="simulated"):
        ct.accumulate(4)(flaky)(state, make_batch(8))
    assert len(calls) == 3  # two backward passes had already written .grad
    assert_untouched(state, before)


def test_empty_batches_and_wrong_states_are_clear_errors():
    state = make_state()
    before = snapshot(state)
    empty = make_batch(0)
    with pytest.raises(ValueError, match=r"train_step\(classify\): the batch is empty \(leading size 0\)"):
        ct.train_step(classify)(state, empty)
    with pytest.raises(ValueError, match=r"accumulate\(2\)\(classify\): the batch is empty"):
        ct.accumulate(2)(classify)(state, empty)
    with pytest.raises(TypeError, match=r"state must be a ct.TrainState, got .*\(Sequential\)"):
        ct.train_step(classify)(state.model, make_batch(4))
    assert_untouched(state, before)


def test_train_step_and_compose_check_their_arguments():
    with pytest.raises(TypeError, match=r"train_step: step must be a function step\(model, batch\).*\(Sequential\)"):
        ct.train_step(mlp())
    with pytest.raises(TypeError, match=r"train_step: .*got 3 \(int\)"):
        ct.train_step(3)
    with pytest.raises(TypeError, match=r"accumulate\(2\): step must be a function .*got 3 \(int\)"):
        ct.accumulate(2)(3)
    with pytest.raises(TypeError, match=r"compose: argument 1 must be a transform .*got 'x' \(str\)"):
        ct.compose(ct.accumulate(2), "x")
    with pytest.raises(TypeError, match="compose: argument 0"):
        ct.compose(ct.train_step(classify))


def test_train_step_is_idempotent_and_prints_as_what_it_is():
    lifted = ct.train_step(classify)
    assert ct.train_step(lifted) is lifted
    assert repr(lifted) == "train_step(classify)"
    assert lifted.__wrapped__ is classify and lifted.__name__ == "classify" and lifted.__doc__ == classify.__doc__
    composed = ct.compose(ct.accumulate(2), ct.accumulate(3, weight=len))(classify)
    assert repr(composed) == "accumulate(2)(accumulate(3, weight=len)(classify))"
    assert repr(ct.compose(ct.accumulate(2), ct.accumulate(3))) == "compose(accumulate(2), accumulate(3))"
    assert composed.__wrapped__ == ct.accumulate(3, weight=len)(classify)
    assert composed.__name__ == "classify"
    assert ct.compose()(classify) == lifted


@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_compose_is_nested_application(sizes):
    ts = [ct.accumulate(s) for s in sizes]
    nested = classify
    for t in reversed(ts):
        nested = t(nested)
    assert ct.compose(*ts)(classify) == nested


def test_wrapping_never_mutates_the_wrapped_step():
    def step(model, batch):
        return classify(model, batch)

    step.marker = "mine"
    fn_state = dict(vars(step)), step.__name__, step.__doc__
    inner = ct.accumulate(2)(step)
    inner_state = dict(vars(inner))
    outer = ct.accumulate(3)(inner)
    ct.compose(ct.accumulate(4), ct.accumulate(5))(inner)
    assert (dict(vars(step)), step.__name__, step.__doc__) == fn_state
    assert dict(vars(inner)) == inner_state
    assert outer.inner is inner
    # the inner step still behaves exactly as one built afresh
    a, b = make_state(3), make_state(3)
    inner(a, make_batch(9))
    ct.accumulate(2)(step)(b, make_batch(9))
    assert_states_equal(a, b)


@given(n=st.integers(1, 6), size=st.integers(1, 20))
def test_the_same_composition_built_twice_is_equal_and_independent(n, size):
    first = ct.compose(ct.accumulate(n), ct.accumulate(2))(classify)
    second = ct.compose(ct.accumulate(n), ct.accumulate(2))(classify)
    assert first == second and hash(first) == hash(second) and first is not second
    assert first != ct.accumulate(n + 1)(classify)
    a, b = make_state(4), make_state(4)
    for i in range(3):
        out_a, out_b = first(a, make_batch(size, seed=i)), second(b, make_batch(size, seed=i))
        assert torch.equal(out_a.loss, out_b.loss)
    assert_states_equal(a, b)


def test_steps_hold_configuration_only():
    train = ct.accumulate(3)(ct.accumulate(2)(classify))
    before = copy.deepcopy(vars(train))
    train(make_state(), make_batch(9))
    assert vars(train).keys() == before.keys()
    assert all(vars(train)[k] == v for k, v in before.items())  # running a step leaves nothing behind in it


def test_user_transforms_without_config_are_equal_only_to_themselves():
    class Tagged(ct.TrainStep):
        def __init__(self, inner, tag):
            self.tag = tag
            super().__init__(inner)

    a, b = Tagged(ct.train_step(classify), 1), Tagged(ct.train_step(classify), 2)
    assert a == a and a != b and hash(a) != hash(b)

    class Configured(Tagged):
        def _config(self):
            return (self.tag,)

    assert Configured(ct.train_step(classify), 1) == Configured(ct.train_step(classify), 1)
    assert Configured(ct.train_step(classify), 1) != Configured(ct.train_step(classify), 2)


def test_a_transform_without_inner_step_must_implement_the_phases():
    with pytest.raises(NotImplementedError, match="Bare: a TrainStep without an inner step must override"):

        class Bare(ct.TrainStep):
            pass

        Bare(None)(make_state(), make_batch(4))


def test_parameters_outside_the_optimizer_are_left_without_gradients():
    model = mlp()
    state = ct.TrainState(model, torch.optim.SGD(model[2].parameters(), lr=0.1))  # first layer not optimized
    ct.accumulate(2)(classify)(state, make_batch(6))
    assert all(p.grad is None for p in model.parameters())


def test_custom_transforms_see_the_context_protocol():
    """A transform written by a user: the Context tells it which backward is the last."""

    class Spy(ct.TrainStep):
        def __init__(self, inner, log):
            self.log = log
            super().__init__(inner)

        def grads(self, state, batch, ctx):
            self.log.append((ctx.last_backward, ctx.piece_weight, ctx.total_weight))
            return super().grads(state, batch, ctx)

    log = []
    train = ct.accumulate(2)(ct.accumulate(2)(Spy(ct.train_step(classify), log)))
    train(make_state(), make_batch(10))
    assert log == [(False, 3.0, 10.0), (False, 2.0, 10.0), (False, 3.0, 10.0), (True, 2.0, 10.0)]


def test_plain_step_may_return_only_a_loss():
    state = make_state()
    out = ct.accumulate(2)(lambda m, b: F.cross_entropy(m(b[0]), b[1]))(state, make_batch(6))
    assert out.metrics == {} and state.step == 1


# -- the Context protocol that later transforms build on ----------------------------------------
class Events(ct.TrainStep):
    """Records forward/backward boundaries as seen through the context hooks."""

    def __init__(self, inner, log):
        self.log = log
        super().__init__(inner)

    def grads(self, state, batch, ctx):
        log = self.log

        class Around:
            def __init__(self, tag, ctx):
                self.tag, self.ctx = tag, ctx

            def __enter__(self):
                log.append(f"enter {self.tag} last={self.ctx.last_backward}")

            def __exit__(self, *exc):
                log.append(f"exit {self.tag}")

        inner_ctx = ctx._replace(
            around_forward=(*ctx.around_forward, lambda c: Around("forward", c)),
            around_pass=(*ctx.around_pass, lambda c: Around("pass", c)),
        )
        return super().grads(state, batch, inner_ctx)


class _LogBackward(torch.autograd.Function):
    log: ClassVar[list] = []

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _LogBackward.log.append("backward")
        return grad


def logged_step(model, batch):
    loss, metrics = classify(model, batch)
    _LogBackward.log.append("forward")
    return _LogBackward.apply(loss), metrics


@pytest.mark.parametrize("events_outside", [True, False])
def test_hooks_wrap_forward_only_or_the_whole_pass_in_any_order(events_outside):
    log = _LogBackward.log = []
    if events_outside:
        train = Events(ct.accumulate(2)(logged_step), log)
    else:
        train = ct.accumulate(2)(Events(ct.train_step(logged_step), log))
    train(make_state(), make_batch(4))
    one_pass = ["enter pass last={}", "enter forward last={}", "forward", "exit forward", "backward", "exit pass"]
    assert log == [e.format(False) for e in one_pass] + [e.format(True) for e in one_pass]


class HalfScale(ct.TrainStep):
    """A toy loss scaler on the protocol: multiply the loss for backward, unscale once at the end."""

    def __init__(self, inner, factor):
        self.factor = factor
        super().__init__(inner)

    def grads(self, state, batch, ctx):
        done = super().grads(state, batch, ctx._replace(scale_loss=(*ctx.scale_loss, lambda loss: loss * self.factor)))
        if ctx.last_backward:  # the last backward of this update: unscale exactly once
            for p in state.model.parameters():
                p.grad.div_(self.factor)
        return done

    def _config(self):
        return (self.factor,)


@given(n=st.integers(1, 6), size=st.integers(1, 20), outside=st.booleans())
def test_scale_loss_scales_gradients_not_the_reported_loss(n, size, outside):
    scaled = (
        HalfScale(ct.accumulate(n)(classify), 4.0)
        if outside
        else ct.accumulate(n)(HalfScale(ct.train_step(classify), 4.0))
    )
    a, b = make_state(5), make_state(5)
    for i in range(3):
        out, ref = scaled(a, make_batch(size, seed=i)), ct.train_step(classify)(b, make_batch(size, seed=i))
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-12, atol=1e-12)
    assert_states_close(a, b)


class CountPrepare(ct.TrainStep):
    """Keeps a per-update count in TrainState; prepare runs once per update wherever it sits."""

    def prepare(self, state, batch, ctx):
        counter = state.transform_state("count_prepare", lambda: torch.zeros((), dtype=torch.int64))
        counter += 1
        return super().prepare(state, batch, ctx)

    def _config(self):
        return ()


@pytest.mark.parametrize("order", ["outside", "inside"])
def test_prepare_runs_once_per_update_in_any_order(order):
    train = (
        CountPrepare(ct.accumulate(3)(classify))
        if order == "outside"
        else ct.accumulate(3)(CountPrepare(ct.train_step(classify)))
    )
    state = make_state()
    for i in range(4):
        train(state, make_batch(9, seed=i))
    assert state.transform_state("count_prepare", lambda: None).item() == 4


def test_transform_state_is_checkpointed_and_restored_lazily():
    train = CountPrepare(ct.accumulate(2)(classify))
    state = make_state()
    for i in range(3):
        train(state, make_batch(6, seed=i))
    saved = copy.deepcopy(state.state_dict())
    assert saved["transforms"]["count_prepare"].item() == 3

    fresh = make_state()
    fresh.load_state_dict(saved)  # its transform has not run yet: the value waits for it
    assert fresh.state_dict()["transforms"]["count_prepare"].item() == 3
    train(fresh, make_batch(6, seed=3))
    assert fresh.transform_state("count_prepare", lambda: None).item() == 4

    fresh.load_state_dict({**saved, "transforms": {}})  # a checkpoint without it: starts afresh
    train(fresh, make_batch(6, seed=3))
    assert fresh.transform_state("count_prepare", lambda: None).item() == 1


def test_objects_with_state_dicts_are_checkpointed_through_them():
    state = make_state()
    state.transform_state("scaler", lambda: torch.amp.GradScaler("cpu", init_scale=2.0))
    saved = copy.deepcopy(state.state_dict())
    assert saved["transforms"]["scaler"]["scale"] == 2.0
    fresh = make_state()
    fresh.load_state_dict(saved)
    restored = fresh.transform_state("scaler", lambda: torch.amp.GradScaler("cpu", init_scale=8.0))
    assert restored.get_scale() == 2.0


# -- one rule for arguments, and transforms where steps belong -------------------------------------
@pytest.mark.parametrize(
    ("build", "error", "pattern"),
    [
        (lambda: ct.accumulate(torch.tensor(3.0)), TypeError, r"^accumulate: n must be a positive int, got tensor"),
        (lambda: ct.accumulate(torch.tensor(3)), TypeError, r"^accumulate: n must be a positive int, got tensor"),
        (lambda: ct.accumulate(0), ValueError, r"^accumulate: n must be a positive int, got 0 \(int\)"),
        (lambda: ct.pipeline_split({"0": "cpu"}, chunks=2.0), TypeError, r"chunks must be a positive int, got 2.0"),
        (lambda: ct.pipeline_split({"0": "cpu"}, chunks="2"), TypeError, r"chunks must be a positive int, got '2'"),
        (lambda: ct.pipeline_split({"0": "cpu"}, chunks=0), ValueError, r"chunks must be a positive int, got 0"),
        (lambda: ct.mixed_precision(max_consecutive_skips=1.0), TypeError, r"max_consecutive_skips must be a pos"),
        (lambda: ct.mixed_precision(dtype=["bf16"]), TypeError, r"^mixed_precision: dtype must be a string .*list"),
        (lambda: ct.mixed_precision(dtype="bf8"), ValueError, r"^mixed_precision: dtype must be one of"),
        (lambda: ct.clip_grad_norm(torch.tensor(1.0)), TypeError, r"max_norm must be a positive, finite number"),
        (lambda: ct.clip_grad_norm(float("nan")), ValueError, r"max_norm must be a positive, finite number"),
        (lambda: ct.distributed(bucket_cap_mb="25"), TypeError, r"bucket_cap_mb must be a positive, finite number"),
        (lambda: ct.distributed(bucket_cap_mb=-1), ValueError, r"bucket_cap_mb must be a positive, finite number"),
    ],
)
def test_int_and_real_arguments_follow_one_rule(build, error, pattern):
    """A value of the wrong kind is a TypeError, one out of range a ValueError, for every transform."""
    with pytest.raises(error, match=pattern):
        build()


@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (
            lambda: ct.accumulate(2)(ct.accumulate(3)),
            r"^accumulate\(2\): step must be .*got the transform "
            r"accumulate\(3\); apply it to your step first: accumulate\(3\)\(step\)",
        ),
        (
            lambda: ct.accumulate(2)(ct.mixed_precision),
            r"got ct.mixed_precision, which builds transforms; "
            r"apply it to your step first: ct.mixed_precision\(...\)\(step\)",
        ),
        (lambda: ct.mixed_precision(ct.clip_grad_norm(1.0)), r"got the transform clip_grad_norm\(1.0\)"),
        (lambda: ct.distributed(ct.compose(ct.accumulate(2))), r"got the transform compose\(accumulate\(2\)\)"),
        (lambda: ct.train_step(ct.data_parallel(["cpu"])), r"got the transform data_parallel"),
        (lambda: ct.compose(ct.accumulate(2))(ct.pipeline_split), r"got ct.pipeline_split, which builds"),
    ],
)
def test_a_transform_where_a_step_belongs_is_refused_when_built(build, pattern):
    with pytest.raises(TypeError, match=pattern):
        build()


def test_run_refuses_a_transform_given_as_its_train_step_before_anything_runs():
    state = make_state()
    before = snapshot(state)
    with pytest.raises(TypeError, match=r"^run: train_step must be a function .*got the transform accumulate\(2\)"):
        ct.run(ct.accumulate(2), state, [make_batch(4)], progress=False)
    assert_untouched(state, before)


def test_numpy_numbers_are_metrics_like_python_numbers():
    np = pytest.importorskip("numpy")

    def step(model, batch):
        loss, metrics = classify(model, batch)
        acc = float(metrics["acc"])
        return loss, {"a32": np.float32(acc), "a64": np.float64(acc), "i": np.int64(3), "arr": np.array(acc)}

    out = ct.accumulate(3)(step)(make_state(), make_batch(9))
    ref = ct.accumulate(3)(classify)(make_state(), make_batch(9))
    for key in ("a32", "a64", "arr"):
        torch.testing.assert_close(out.metrics[key].double(), ref.metrics["acc"].double(), rtol=1e-6, atol=0)
    assert out.metrics["i"].item() == 3


# -- the classes of silent wrong results, as properties ---------------------------------------------
class Tricky(nn.Module):
    """Submodules whose modes differ from the model's, and a forward that returns its own mean loss."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Tanh())
        self.decoder = nn.Linear(8, 3)

    def forward(self, x, y=None):
        logits = self.decoder(self.encoder(x))
        return logits, None if y is None else F.cross_entropy(logits, y)  # as Hugging Face models do


def tricky_state(seed):
    torch.manual_seed(seed)
    model = Tricky().double()
    model.train()
    model.encoder[1].eval()  # frozen BatchNorm statistics
    model.encoder[2].eval()  # dropout off in this submodule only
    return ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-2))


def logits_step(model, batch):
    x, y = batch
    logits, _ = model(x)
    return F.cross_entropy(logits, y)


def own_loss_step(model, batch):
    x, y = batch
    return model(x, y)[1]


TRANSFORMS = {
    "accumulate(2)": ct.accumulate(2),
    "accumulate(3)": ct.accumulate(3),
    "clip": ct.clip_grad_norm(0.5),
    "pipeline": ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"}),
    "pipeline(chunks=2)": ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"}, chunks=2),
}


@given(
    names=st.lists(st.sampled_from(sorted(TRANSFORMS)), min_size=1, max_size=3),
    own_loss=st.booleans(),
    frozen=st.sampled_from(["encoder.0.weight", "decoder.bias", None]),
    unfrozen_later=st.sampled_from(["decoder.weight", "encoder.1.weight", None]),
    size=st.integers(4, 12),
    seed=st.integers(0, 2**16),
)
def test_compositions_equal_the_plain_step_with_frozen_parameters_modes_and_own_losses(
    names, own_loss, frozen, unfrozen_later, size, seed
):
    """Frozen and later-unfrozen parameters, submodules in eval mode, a model returning its own mean
    loss: every composition either equals the plain step update after update, or refuses with nothing changed."""
    pipelines = [n for n in names if n.startswith("pipeline")]
    if len(pipelines) > 1:
        names = [n for n in names if not n.startswith("pipeline")] + pipelines[:1]
    names = [n for i, n in enumerate(names) if n != "clip" or "clip" not in names[:i]]
    step = own_loss_step if own_loss else logits_step
    train = ct.compose(*(TRANSFORMS[n] for n in names))(step)
    plain = ct.train_step(ct.clip_grad_norm(0.5)(step) if "clip" in names else step)
    a, b = tricky_state(seed), tricky_state(seed)
    for state in (a, b):
        if frozen:
            state.model.get_parameter(frozen).requires_grad_(False)
        if unfrozen_later:
            state.model.get_parameter(unfrozen_later).requires_grad_(False)
    for update in range(3):
        if update == 1 and unfrozen_later:  # unfreeze after the first update, freeze another
            for state in (a, b):
                state.model.get_parameter(unfrozen_later).requires_grad_(True)
                state.model.decoder.bias.requires_grad_(False)
        batch = make_batch(size, seed=seed + update)
        before = snapshot(a)
        try:
            train(a, batch)
        except ValueError as e:  # refused only where chunks really split a model's own mean loss
            assert own_loss and "pipeline(chunks=2)" in names, e
            assert "differs between the 2 chunks" in str(e)
            assert_untouched(a, before)
            return
        plain(b, batch)
        assert_states_close(a, b)
        for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
            assert pa.grad is None and pb.grad is None, name


def test_compose_refuses_a_plain_step_given_as_a_transform():
    with pytest.raises(
        TypeError, match=r"compose: argument 1 must be a transform such as ct.accumulate\(4\), got <fun"
    ):
        ct.compose(ct.accumulate(2), classify)


def test_a_step_returning_loss_and_a_tensor_is_told_metrics_go_in_a_mapping():
    """(loss, acc) and a model's (loss, logits) look alike: the message names both fixes."""
    state = make_state()
    before = snapshot(state)
    with pytest.raises(TypeError, match=r"got a tuple of 2 tensors .*return out\[0\]; metrics go in a mapping"):
        ct.train_step(lambda model, batch: (classify(model, batch)[0], torch.tensor(0.5)))(state, make_batch(6))
    assert_untouched(state, before)


def test_a_checkpoint_with_groups_added_during_the_run_names_add_param_group_and_the_hook(tmp_path):
    """timm-style unfreezing: a hook calls optimizer.add_param_group mid-run; the resumed run builds the optimizer
    with the first group only. The refusal says groups were added during the run and what to do (issue 37's
    adversary: the message named only the sizes), and loads nothing."""
    torch.manual_seed(0)
    data = [(torch.randn(4), torch.tensor(i % 2)) for i in range(16)]

    def step(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def unfreeze(state, epoch):
        if epoch == 1 and len(state.optimizer.param_groups) == 1:
            state.optimizer.add_param_group({"params": list(state.model[2].parameters())})

    def state():
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
        return ct.TrainState(model, torch.optim.SGD([*model[0].parameters(), *model[1].parameters()], lr=0.1))

    run = dict(batch_size=4, checkpoint_dir=str(tmp_path), on_epoch_end=unfreeze)
    ct.run(step, state(), data, epochs=2, **run)
    again = state()
    before = [p.detach().clone() for p in again.model.parameters()]
    with pytest.raises(ValueError, match=r"sizes \[4, 2\], this one \[4\].*add_param_group.*on_epoch_end"):
        ct.run(step, again, data, epochs=3, **run)
    assert all(torch.equal(a, b) for a, b in zip(before, again.model.parameters(), strict=True))
    assert again.step == 0 and len(again.optimizer.param_groups) == 1

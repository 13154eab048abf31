"""ct.ema: bit for bit torch's AveragedModel(get_ema_multi_avg_fn) and torchvision's ExponentialMovingAverage,
checkpointed and resumed exactly, skipped updates not counted, right in any nesting order; ct.ema_model."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import TensorDataset

import composetrain as ct
from composetrain.core.protocol import Context


class ExponentialMovingAverage(AveragedModel):
    """torchvision references/classification/utils.py, verbatim (the references are not in torchvision's wheel)."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def net(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def batches(n, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(12, 5, generator=g, dtype=dtype), torch.randint(0, 3, (12,), generator=g)) for _ in range(n)]


def state_of(model, interval="update"):
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    return ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, 2, 0.5), scheduler_interval=interval)


def averages(state):
    return state.state_dict()["transforms"]["ema"]["averages"]


def reference(make_ref, data, *, every=1, warmup=0):
    """The textbook loop with the recipe's EMA: update, then (at the k-th batch) average, reset in warmup."""
    model = net()
    state = state_of(model)
    ref = make_ref(model)
    plain = ct.train_step(step)
    for n, batch in enumerate(data, start=1):
        plain(state, batch)
        if (n - 1) % every == 0:
            ref.update_parameters(model)
            if n <= warmup:
                ref.n_averaged.fill_(0)
    return state, ref


def assert_same_averages(state, ref):
    mine = averages(state)
    theirs = dict(ref.module.named_parameters()) | dict(ref.module.named_buffers())
    assert mine.keys() == theirs.keys()
    for k, t in theirs.items():
        assert mine[k].dtype == t.dtype and torch.equal(mine[k], t), k


@settings(max_examples=12)
@given(
    decay=st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.9999, 1.0]),
    every=st.integers(1, 3),
    warmup=st.integers(0, 4),
    updates=st.integers(1, 7),
)
def test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit(decay, every, warmup, updates):
    data = batches(updates)
    state = state_of(net())
    train = ct.ema(decay, every=every, warmup=warmup)(step)
    for batch in data:
        train(state, batch)
    ref_state, ref = reference(
        lambda m: AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True),
        data,
        every=every,
        warmup=warmup,
    )
    assert_same_averages(state, ref)
    assert state.state_dict()["transforms"]["ema"]["n_averaged"] == ref.n_averaged.item()
    for (k, p), q in zip(state.model.state_dict().items(), ref_state.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), k  # the training itself untouched


def test_formula_sum_is_torchvisions_exponential_moving_average_bit_for_bit():
    data = batches(6)
    decay = 0.9
    state = state_of(net())
    train = ct.ema(decay, every=2, warmup=2, formula="sum")(step)
    for batch in data:
        train(state, batch)
    _, ref = reference(lambda m: ExponentialMovingAverage(m, decay), data, every=2, warmup=2)
    assert_same_averages(state, ref)
    # the two formulas do differ: the option is needed to port the recipe bit for bit
    lerp = state_of(net())
    for batch in data:
        ct.ema(decay, every=2, warmup=2)(step)(lerp, batch)
    assert any(not torch.equal(a, b) for a, b in zip(averages(lerp).values(), averages(state).values(), strict=True))


def test_a_checkpoint_resumes_the_average_bit_for_bit_also_before_its_first_update():
    data = batches(6)
    train = ct.ema(0.8, every=2)(step)
    straight = state_of(net())
    for batch in data:
        train(straight, batch)
    first = state_of(net())
    for batch in data[:3]:
        train(first, batch)
    saved = copy.deepcopy(first.state_dict())
    assert saved["transforms"]["ema"]["n_averaged"] == 2
    resumed = state_of(net(seed=5))  # other weights: the checkpoint's must win
    resumed.load_state_dict(saved)  # no average yet here: applied when ct.ema first runs
    for batch in data[3:]:
        train(resumed, batch)
    for k, v in averages(straight).items():
        assert torch.equal(averages(resumed)[k], v), k
    # loaded from a live state (no copy in between), the averages are copied, as the model's weights are
    kept = {k: v.clone() for k, v in averages(first).items()}
    again = state_of(net())
    again.load_state_dict(first.state_dict())
    for batch in data[3:]:
        train(again, batch)
    assert all(torch.equal(averages(first)[k], v) for k, v in kept.items())
    assert all(torch.equal(averages(again)[k], v) for k, v in averages(straight).items())


def test_a_checkpoint_of_another_model_is_refused_before_anything_changes():
    state = state_of(net())
    ct.ema(0.9)(step)(state, batches(1)[0])
    saved = copy.deepcopy(state.state_dict())
    saved["transforms"]["ema"]["averages"]["0.weight"] = torch.zeros(8, 4)
    before = {k: v.clone() for k, v in averages(state).items()}
    with pytest.raises(ValueError, match=r"ema: the checkpoint's average of '0.weight' is \(8, 4\)"):
        state.load_state_dict(saved)
    assert all(torch.equal(averages(state)[k], v) for k, v in before.items())


def test_skipped_updates_are_not_averaged_nor_counted():
    def poisoned(model, batch):  # the second batch has non-finite gradients: bf16 skips that update
        x, y = batch
        return F.cross_entropy(model(x), y) * (torch.inf if bool(x[0, 0] > 100) else 1.0)

    data = batches(4)
    bad = (data[1][0].clone(), data[1][1])
    bad[0][0, 0] = 1000.0
    state = state_of(net())
    train = ct.ema(0.5, every=2)(ct.mixed_precision(dtype="bf16")(poisoned))
    skipped = [bool(train(state, b).skipped) for b in [data[0], bad, *data[1:]]]
    assert skipped == [False, True, False, False, False] and state.step == 4
    assert state.state_dict()["transforms"]["ema"]["n_averaged"] == 2  # after applied updates 1 and 3
    assert all(a.dtype == torch.float32 for a in averages(state).values() if a.is_floating_point())


@pytest.mark.parametrize(
    "outer, inner",
    [
        ("ema", "accumulate"),
        ("accumulate", "ema"),
        ("ema", "mixed_precision"),
        ("mixed_precision", "ema"),
        ("clip", "ema"),
    ],
)
def test_every_nesting_order_gives_the_same_average(outer, inner):
    make = {
        "ema": ct.ema(0.7, every=2, warmup=1),
        "accumulate": ct.accumulate(3),
        "mixed_precision": ct.mixed_precision(dtype="bf16"),
        "clip": ct.clip_grad_norm(0.1),
    }
    others = [make[n] for n in (outer, inner) if n != "ema"]
    data = batches(5)
    results = []
    for order in ([make[outer], make[inner]], [make["ema"], *others]):
        state = state_of(net())
        train = ct.compose(*order)(step)
        for batch in data:
            train(state, batch)
        results.append(state)
    for k, v in averages(results[0]).items():
        assert torch.equal(averages(results[1])[k], v), k


def test_building_twice_gives_equal_independent_steps_and_ema_once():
    a, b = ct.ema(0.9, every=2)(step), ct.ema(0.9, every=2)(step)
    assert a == b and hash(a) == hash(b) and repr(a) == "ema(0.9, every=2)(step)"
    assert ct.ema(0.9)(step) != a
    s1, s2 = state_of(net()), state_of(net())
    data = batches(3)
    for batch in data:
        a(s1, batch)
    b(s2, data[0])
    assert s1.state_dict()["transforms"]["ema"]["n_averaged"] == 2
    assert s2.state_dict()["transforms"]["ema"]["n_averaged"] == 1
    with pytest.raises(ValueError, match="use ema once"):
        ct.ema(0.9)(ct.accumulate(2)(ct.ema(0.5)(step)))


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: ct.ema(1.5), r"ema: decay must be in \[0, 1\], got 1.5"),
        (lambda: ct.ema(-0.1), r"ema: decay must be in \[0, 1\]"),
        (lambda: ct.ema("0.9"), r"ema: decay must be a finite number, got '0.9'"),
        (lambda: ct.ema(0.9, every=0), "ema: every must be a positive int, got 0"),
        (lambda: ct.ema(0.9, warmup=-1), "ema: warmup must be a non-negative int, got -1"),
        (lambda: ct.ema(0.9, formula="mean"), "ema: formula must be 'lerp'"),
        (lambda: ct.ema(step), r"ema: decay is required, got a step instead"),
    ],
)
def test_bad_arguments_are_refused_when_built(call, error):
    with pytest.raises((TypeError, ValueError), match=error):
        call()


def test_ema_model_is_an_independent_copy_with_the_averages_or_loads_into_a_module():
    state = state_of(net())
    assert all(
        torch.equal(a, b)
        for a, b in zip(ct.ema_model(state).state_dict().values(), state.model.state_dict().values(), strict=True)
    )
    train = ct.ema(0.5)(step)
    for batch in batches(3):
        train(state, batch)
    copy_ = ct.ema_model(state)
    assert copy_ is not state.model and "ema" in state.state_dict()["transforms"]
    for k, v in averages(state).items():
        assert torch.equal(copy_.state_dict()[k], v) and copy_.state_dict()[k].data_ptr() != v.data_ptr(), k
    kept = {k: v.clone() for k, v in copy_.state_dict().items()}
    train(state, batches(1, seed=9)[0])  # training on changes neither
    assert all(torch.equal(copy_.state_dict()[k], v) for k, v in kept.items())
    into = net(seed=3)
    assert ct.ema_model(state, into=into) is into
    assert all(torch.equal(into.state_dict()[k], v) for k, v in averages(state).items())
    with pytest.raises(ValueError, match=r"ema_model: into \(Linear\) is not the architecture averaged"):
        ct.ema_model(state, into=nn.Linear(5, 3))


def test_the_average_of_a_loaded_checkpoint_is_retrievable_before_any_update():
    state = state_of(net())
    for batch in batches(3):
        ct.ema(0.5)(step)(state, batch)
    fresh = state_of(net(seed=4))
    fresh.load_state_dict(copy.deepcopy(state.state_dict()))
    assert all(torch.equal(ct.ema_model(fresh).state_dict()[k], v) for k, v in averages(state).items())


def test_ct_run_evaluates_the_model_and_the_average_and_leaves_the_training_untouched(tmp_path):
    import json

    g = torch.Generator().manual_seed(0)
    train_data = TensorDataset(torch.randn(48, 5, generator=g), torch.randint(0, 3, (48,), generator=g))
    val = TensorDataset(torch.randn(20, 5, generator=g), torch.randint(0, 3, (20,), generator=g))

    def evaluate(model, batch):
        x, y = batch
        return {"loss": F.cross_entropy(model(x), y), "acc": (model(x).argmax(-1) == y).double().mean()}

    train = ct.ema(0.7, every=2)(step)
    args = dict(batch_size=12, epochs=2, progress=False)
    evaluated = state_of(net())
    result = ct.run(
        train,
        evaluated,
        train_data,
        eval_step=evaluate,
        eval_data=val,
        log_file=tmp_path / "m.jsonl",
        checkpoint_dir=tmp_path / "run",
        **args,
    )
    plain = state_of(net())
    ct.run(train, plain, train_data, **args)
    for k, v in plain.state_dict()["model"].items():  # the evaluations swapped the weights back exactly
        assert torch.equal(evaluated.state_dict()["model"][k], v), k
    assert [e["step"] for e in result.evals] == [4, 8]
    last = result.evals[-1]
    ema_copy = ct.ema_model(evaluated).eval()
    with torch.no_grad():
        x, y = val.tensors
        assert last["eval_ema"]["loss"] == pytest.approx(F.cross_entropy(ema_copy(x), y).item(), rel=1e-6)
        assert last["loss"] == pytest.approx(F.cross_entropy(evaluated.model.eval()(x), y).item(), rel=1e-6)
    assert last["eval_ema"]["loss"] != last["loss"]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval" in r]
    assert evals[-1]["eval"] == {"loss": last["loss"], "acc": last["acc"]} and evals[-1]["eval_ema"] == last["eval_ema"]
    more = ct.run(
        train,
        state_of(net()),
        train_data,
        eval_step=evaluate,
        eval_data=val,
        log_file=tmp_path / "m.jsonl",
        checkpoint_dir=tmp_path / "run",
        **{**args, "epochs": 3},
    )
    assert more.evals[:2] == result.evals and set(more.evals[2]["eval_ema"]) == {"loss", "acc"}  # resumed records
    assert [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()][: len(records)] == records
    with pytest.raises(ValueError, match=r"eval_step returns metric 'eval_ema', a name ct\.run's evaluation records"):
        ct.run(train, state_of(net()), train_data, eval_step=lambda m, b: {"eval_ema": 1.0}, eval_data=val, **args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_on_cuda_the_average_is_averaged_models_bit_for_bit_and_stays_float32(precision):
    """CUDA's fused foreach kernels, grouped by device and dtype as AveragedModel groups them."""
    data = [(x.cuda(), y.cuda()) for x, y in batches(5)]
    plain = (lambda s: s) if precision == "fp32" else ct.mixed_precision(dtype="bf16")
    state = state_of(net().cuda())
    train = ct.ema(0.9, every=2)(plain(step))
    model = net().cuda()
    ref_state, ref = state_of(model), AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    ref_train = plain(step)
    for n, batch in enumerate(data, start=1):
        train(state, batch)
        ct.train_step(ref_train)(ref_state, batch)
        if (n - 1) % 2 == 0:
            ref.update_parameters(model)
    assert_same_averages(state, ref)
    assert all(a.dtype == torch.float32 and a.is_cuda for a in averages(state).values() if a.is_floating_point())


# -- ct.ema's settings travel with its checkpoint; ct.ema_model's into= checked ---------------------------------------


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g)


def sgd_state(model):
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9))


def saved_after(ema, updates=3):
    state = sgd_state(net())
    train = ema(step)
    for i in range(updates):
        train(state, batch(i))
    return copy.deepcopy(state.state_dict())


@pytest.mark.parametrize("claimed", ["setup-then-load", "load-then-first-update"])
@pytest.mark.parametrize(
    ("saved", "resumed", "shown"),
    [
        (ct.ema(0.9), ct.ema(0.99), ("decay=0.9", "decay=0.99")),
        (ct.ema(0.9, every=2), ct.ema(0.9, every=3), ("every=2", "every=3")),
        (ct.ema(0.9), ct.ema(0.9, warmup=5), ("warmup=0", "warmup=5")),
        (ct.ema(0.9), ct.ema(0.9, formula="sum"), ("formula='lerp'", "formula='sum'")),
    ],
)
def test_a_resume_with_other_ema_settings_warns_naming_both(saved, resumed, shown, claimed):
    checkpoint = saved_after(saved)
    state, train = sgd_state(net()), resumed(step)
    with pytest.warns(UserWarning, match=r"ema: the checkpoint's average was kept with ema\(") as caught:
        if claimed == "setup-then-load":  # ct.run's order: the averages exist when the checkpoint loads
            train.setup(state)
            state.load_state_dict(checkpoint)
        else:  # a plain loop: the checkpoint's average is claimed by the first update
            state.load_state_dict(checkpoint)
            train(state, batch(7))
    message = str(caught[0].message)
    assert message.index(shown[0]) < message.index("this run's ct.ema is") < message.index(shown[1])
    assert "continues with this run's settings" in message


def test_a_resume_with_the_same_settings_or_from_a_checkpoint_without_them_is_silent():
    checkpoint = saved_after(ct.ema(0.9, every=2))
    older = copy.deepcopy(checkpoint)
    del older["transforms"]["ema"]["settings"]  # saved before the settings were checkpointed
    for saved in (checkpoint, older):
        state, train = sgd_state(net()), ct.ema(0.9, every=2)(step)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            train.setup(state)
            state.load_state_dict(saved)
            train(state, batch(7))


def test_the_settings_are_plain_values_in_the_checkpoint():
    settings = saved_after(ct.ema(0.5, every=2, warmup=1, formula="sum"))["transforms"]["ema"]["settings"]
    assert settings == {"decay": 0.5, "every": 2, "warmup": 1, "formula": "sum"}
    assert [type(v) for v in settings.values()] == [float, int, int, str]


def test_ema_model_into_another_architecture_is_refused_as_ema_model_with_a_fix_that_applies():
    state = sgd_state(net())
    ct.ema(0.9)(step)(state, batch())
    other = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"ema_model: into \(Sequential\) is not the architecture averaged") as e:
        ct.ema_model(state, into=other)
    assert "into=build_model()" in str(e.value) and "new TrainState" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_ema_model_into_another_dtype_is_refused_and_leaves_into_untouched(dtype):
    state = sgd_state(net())
    ct.ema(0.9)(step)(state, batch())
    into = net(seed=3).to(dtype)
    before = copy.deepcopy(into.state_dict())
    with pytest.raises(ValueError, match=rf"ema_model: into's '0.weight' is \(8, 5\) {dtype}, its average \(8, 5\)"):
        ct.ema_model(state, into=into)
    assert all(torch.equal(v, into.state_dict()[k]) for k, v in before.items())
    cast = ct.ema_model(state, into=net(seed=3)).to(dtype)  # the fix the message gives
    assert cast[0].weight.dtype == dtype


def test_ema_model_into_another_shape_is_still_refused():
    state = sgd_state(net())
    ct.ema(0.9)(step)(state, batch())
    into = net()
    into[3] = nn.Linear(8, 4)
    with pytest.raises(ValueError, match=r"ema_model: into's '3.weight' is \(4, 8\) torch.float32, its average"):
        ct.ema_model(state, into=into)


# -- a changed model, a crafted checkpoint, another device, a reassigned buffer ---------------------------------------


def snapshot(state):
    saved = state.state_dict()
    return copy.deepcopy({"model": saved["model"], "ema": saved["transforms"].get("ema"), "step": state.step})


def assert_unchanged(state, before):
    after = snapshot(state)
    assert after["step"] == before["step"]
    for k, v in before["model"].items():
        assert torch.equal(after["model"][k], v), k
    if before["ema"] is not None:
        assert after["ema"]["n_averaged"] == before["ema"]["n_averaged"]
        for k, v in before["ema"]["averages"].items():
            assert torch.equal(after["ema"]["averages"][k], v), k


def grow(model):
    model.add_module("extra", nn.Linear(3, 3))


def reshape(model):
    model[3] = nn.Linear(8, 4)


def widen(model):
    model.double()


@pytest.mark.parametrize(
    "change, error",
    [
        (grow, r"ema: the model's parameters and buffers differ from the averaged ones \(missing \[\], new \['extra"),
        (reshape, r"ema: the model's '3.weight' is \(4, 8\) torch.float32, its average \(3, 8\) torch.float32"),
        (widen, r"ema: the model's '0.weight' is \(8, 5\) torch.float64, its average \(8, 5\) torch.float32"),
    ],
)
def test_a_model_changed_after_the_ema_began_is_refused_before_the_update(change, error):
    state = sgd_state(net())
    train = ct.ema(0.9)(step)
    train(state, batch())
    train(state, batch(2))
    change(state.model)
    before = snapshot(state)
    x, y = batch(3)
    with pytest.raises(ValueError, match=error):
        train(state, (x.to(state.model[0].weight.dtype), y))
    assert_unchanged(state, before)  # was: the update applied, then the EMA raised (or a bare torch error)


def test_a_checkpoints_average_of_another_shape_is_refused_before_the_first_update():
    state = sgd_state(net())
    ct.ema(0.9)(step)(state, batch())
    saved = copy.deepcopy(state.state_dict())
    saved["transforms"]["ema"]["averages"]["3.weight"] = torch.zeros(4, 8)
    fresh = sgd_state(net(1))
    fresh.load_state_dict(saved)  # not yet claimed: no ct.ema has run on this state
    before = snapshot(fresh)
    with pytest.raises(ValueError, match=r"ema: the checkpoint's average of '3.weight' is \(4, 8\)"):
        ct.ema(0.9)(step)(fresh, batch())
    assert_unchanged(fresh, before)


def test_evaluating_the_average_of_a_changed_model_leaves_the_model_whole():
    state = sgd_state(net())
    train = ct.ema(0.5)(step)
    for seed in range(3):
        train(state, batch(seed))
    reshape(state.model)
    before = snapshot(state)
    (weights,) = train.eval_weights(state).values()
    with pytest.raises(ValueError, match=r"ema: the model's '3.weight' is \(4, 8\)"), weights:
        pass
    assert_unchanged(state, before)  # was: the tensors before '3.weight' left holding the averages


def test_the_averages_follow_their_weights_to_another_device():
    """A model placed after the EMA began (pipeline_split places it in its first update, after ct.run made the
    averages; a loop that moves it): its averages move with it instead of failing in the fused update."""
    state = sgd_state(net())
    train = ct.ema(0.5)(step)
    train(state, batch())
    state.model.to("meta")  # a device of its own, on any machine
    train.prepare(state, batch(), Context(state.model, None, total_weight=12.0, piece_weight=12.0))
    averages = state.transform_state("ema", lambda: None)
    assert {str(a.device) for a in averages.tensors.values()} == {"cpu"}  # prepare only checks: nothing moved
    averages.verify(state.model)
    averages.update(state.model, follow=False)  # what ct.ema's update phase does after the update
    found = state.state_dict()["transforms"]["ema"]["averages"]
    assert {str(a.device) for a in found.values()} == {"meta"}


@pytest.mark.parametrize(
    "crafted",
    [None, {"n_averaged": 1}, {"averages": [1, 2], "n_averaged": 1}, {"averages": {"0.weight": 3}, "n_averaged": 1}],
)
def test_ema_model_of_a_crafted_unclaimed_checkpoint_is_refused_clearly(crafted):
    state = sgd_state(net())
    ct.ema(0.9)(step)(state, batch())
    saved = copy.deepcopy(state.state_dict())
    if isinstance(crafted, dict) and isinstance(crafted.get("averages"), dict):
        crafted = {**crafted, "averages": {**saved["transforms"]["ema"]["averages"], **crafted["averages"]}}
    saved["transforms"]["ema"] = crafted
    fresh = sgd_state(net(1))
    fresh.load_state_dict(saved)  # held for ct.ema, which checks it when it claims it
    with pytest.raises(TypeError, match=r"ema_model: the state's EMA \(loaded from a checkpoint\) is not ct\.ema's"):
        ct.ema_model(fresh)  # was: a bare TypeError, KeyError or AttributeError


def test_string_likes_are_kept_as_plain_strings_so_checkpoints_load_without_code():
    import io

    import numpy as np

    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, 1), scheduler_interval=np.str_("epoch"))
    assert type(state.scheduler_interval) is str
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["scheduler_interval"] == "epoch"  # was: ct.run's first save refused
    assert repr(ct.ema(0.9, formula=np.str_("sum"))(step)) == "ema(0.9, formula='sum')(step)"


class Counting(nn.Module):
    """A module that reassigns its buffer in forward (a new tensor, in eval mode too), as hand-written statistics do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.seen = self.seen + x.shape[0]
        return self.lin(x)


def test_evaluating_the_average_restores_a_buffer_the_forward_reassigned():
    torch.manual_seed(0)
    state = sgd_state(Counting())
    train = ct.ema(0.5)(step)
    for seed in range(3):
        train(state, batch(seed))
    before = snapshot(state)
    (weights,) = train.eval_weights(state).values()
    with weights, torch.no_grad():
        state.model(batch(7)[0])  # seen: the average's + 12, in a new tensor
    assert_unchanged(state, before)  # was: the model kept the average's count + 12, and trained on from it


def test_a_buffer_the_forward_reassigns_is_averaged_as_averaged_model_averages_it():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    state, plain = sgd_state(Counting()), sgd_state(copy.deepcopy(Counting()))
    plain.model.load_state_dict(state.model.state_dict())
    ref = AveragedModel(plain.model, multi_avg_fn=get_ema_multi_avg_fn(0.5), use_buffers=True)
    train = ct.ema(0.5)(step)
    for seed in range(3):
        train(state, batch(seed))
        ct.train_step(step)(plain, batch(seed))
        ref.update_parameters(plain.model)
    found = state.state_dict()["transforms"]["ema"]["averages"]
    assert found["seen"].item() == ref.module.seen.item() == 27.0  # 12, (12 + 24) / 2, (18 + 36) / 2
    assert all(torch.equal(found[k], v) for k, v in ref.module.state_dict().items())

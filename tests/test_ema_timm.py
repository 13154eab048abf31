"""ct.ema with timm's options, bit for bit timm's ModelEmaV3 as its train.py updates it (model_ema.update(model,
step=num_updates) after each update): the decay warmup (use_warmup, warmup_gamma, warmup_power, min_decay),
update_after_step (ct.ema's warmup), the average kept on another device or in another dtype (float32 for a bf16
model), exclude_buffers, and integer buffers copied; checkpointed, refused when it cannot be done."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import composetrain as ct

timm_utils = pytest.importorskip("timm.utils")


def net(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).float(), y)


def batches(n, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(12, 5, generator=g).to(dtype), torch.randint(0, 3, (12,), generator=g)) for _ in range(n)]


def state_of(model):
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9))


def averages(state):
    return state.state_dict()["transforms"]["ema"]["averages"]


def timm_run(data, model_dtype, **options):
    """timm's train.py: the EMA built after the model, updated with step=num_updates after each update."""
    model = net(dtype=model_dtype)
    state = state_of(model)
    ema = timm_utils.ModelEmaV3(model, stochastic_rounding=False, **options)
    plain = ct.train_step(step)
    for num_updates, batch in enumerate(data, start=1):
        plain(state, batch)
        ema.update(model, step=num_updates)
    return state, ema


def ct_run(data, model_dtype, **options):
    state = state_of(net(dtype=model_dtype))
    train = ct.ema(**options)(step)
    for batch in data:
        train(state, batch)
    return state


def assert_same(state, ema, *, dtype=None):
    mine, theirs = averages(state), ema.module.state_dict()
    assert mine.keys() == theirs.keys()
    for k, t in theirs.items():
        assert mine[k].dtype == t.dtype and mine[k].device == t.device, k
        assert torch.equal(mine[k], t), k
    if dtype is not None:
        assert {t.dtype for t in mine.values() if t.is_floating_point()} == {dtype}


OPTIONS = st.fixed_dictionaries(
    {
        "decay": st.sampled_from([0.5, 0.9, 0.999]),
        "update_after_step": st.integers(0, 3),
        "use_warmup": st.booleans(),
        "warmup_gamma": st.sampled_from([1.0, 2.5]),
        "warmup_power": st.sampled_from([2 / 3, 0.75, 1.0]),
        "min_decay": st.sampled_from([0.0, 0.3]),
        "exclude_buffers": st.booleans(),
    }
)


def ct_options(timm):
    """The ct.ema arguments for ModelEmaV3's."""
    options = {"decay": timm["decay"], "warmup": timm["update_after_step"]}
    if timm["use_warmup"]:
        options |= {"decay_warmup": True, "warmup_gamma": timm["warmup_gamma"], "warmup_power": timm["warmup_power"]}
        options |= {"min_decay": timm["min_decay"]}
    if timm["exclude_buffers"]:
        options["exclude_buffers"] = True  # buffers copied, integers among them
    else:
        options["integers"] = "copy"  # timm copies num_batches_tracked
    return options


@settings(max_examples=25, deadline=None)
@given(timm=OPTIONS, updates=st.integers(1, 8))
def test_each_option_is_model_ema_v3_bit_for_bit(timm, updates):
    data = batches(updates)
    _, ema = timm_run(data, torch.float32, **timm)
    assert_same(ct_run(data, torch.float32, **ct_options(timm)), ema)


@pytest.mark.parametrize("exclude_buffers", [False, True])
@pytest.mark.parametrize("device", [None, "cpu"], ids=["same device", "device='cpu'"])
def test_a_float32_average_of_a_bf16_model_is_model_ema_v3s(device, exclude_buffers):
    """timm's two paths for another dtype: foreach mul and add on the model's device, a cast then lerp per tensor
    with device= (train.py's --model-ema-force-cpu passes device='cpu'). They differ: each is reproduced."""
    data = batches(6, dtype=torch.bfloat16)
    timm = {"decay": 0.9, "use_warmup": True, "dtype": torch.float32, "exclude_buffers": exclude_buffers}
    _, ema = timm_run(data, torch.bfloat16, device=device, **timm)
    options = {"decay": 0.9, "decay_warmup": True, "dtype": torch.float32, "device": device}
    options |= {"exclude_buffers": True} if exclude_buffers else {"integers": "copy"}
    state = ct_run(data, torch.bfloat16, **options)
    assert_same(state, ema, dtype=torch.float32)
    assert {p.dtype for p in state.model.parameters()} == {torch.bfloat16}  # the model trains in bf16


def test_the_two_paths_for_another_dtype_do_differ():
    data = batches(6, dtype=torch.bfloat16)
    same = ct_run(data, torch.bfloat16, decay=0.9, dtype=torch.float32)
    other = ct_run(data, torch.bfloat16, decay=0.9, dtype=torch.float32, device="cpu")
    pairs = zip(averages(same).values(), averages(other).values(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs if a.is_floating_point())


def test_a_bf16_average_of_a_bf16_model_rounds_to_nearest_as_model_ema_v3_without_stochastic_rounding():
    data = batches(5, dtype=torch.bfloat16)
    _, ema = timm_run(data, torch.bfloat16, decay=0.9)
    assert_same(ct_run(data, torch.bfloat16, decay=0.9, integers="copy"), ema, dtype=torch.bfloat16)


def test_integer_buffers_are_copied_with_integers_copy_and_averaged_by_default():
    data = batches(4)
    copied = ct_run(data, torch.float32, decay=0.5, integers="copy")
    averaged = ct_run(data, torch.float32, decay=0.5)
    assert averages(copied)["1.num_batches_tracked"].item() == 4
    assert averages(averaged)["1.num_batches_tracked"].item() < 4  # AveragedModel's: averaged, truncated


def test_the_decay_warmup_ramps_as_timms_get_decay():
    ema = timm_utils.ModelEmaV3(net(), decay=0.99, min_decay=0.5, use_warmup=True, warmup_power=0.75)
    rule = ct.ema(0.99, decay_warmup=True, min_decay=0.5, warmup_power=0.75)(step).rule
    assert [rule.decay_at(n) for n in range(1, 40)] == [ema.get_decay(n + 1) for n in range(1, 40)]
    assert rule.decay_at(1) == 0.5 and rule.decay_at(39) < 0.99  # min_decay at first, below decay still


def test_the_average_on_another_device_and_dtype_is_checkpointed_and_resumes_exactly():
    data = batches(8, dtype=torch.bfloat16)
    options = {"decay": 0.9, "decay_warmup": True, "dtype": torch.float32, "device": "cpu", "integers": "copy"}
    straight = ct_run(data, torch.bfloat16, **options)
    train = ct.ema(**options)(step)
    first = state_of(net(dtype=torch.bfloat16))
    for batch in data[:3]:
        train(first, batch)
    saved = copy.deepcopy(first.state_dict())
    assert saved["transforms"]["ema"]["settings"]["dtype"] == "torch.float32"
    resumed = state_of(net(seed=4, dtype=torch.bfloat16))
    resumed.load_state_dict(saved)
    for batch in data[3:]:
        train(resumed, batch)
    for k, v in averages(straight).items():
        assert torch.equal(averages(resumed)[k], v), k


def test_ema_model_and_the_evaluation_hold_the_float32_averages():
    data = batches(4, dtype=torch.bfloat16)
    train = ct.ema(0.5, dtype=torch.float32)(step)
    state = state_of(net(dtype=torch.bfloat16))
    for batch in data:
        train(state, batch)
    model = ct.ema_model(state)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for k, v in model.state_dict().items():
        assert torch.equal(v, averages(state)[k]), k
    weights = dict(state.model.state_dict())
    with train.eval_weights(state)["ema"]:  # evaluated in the model's own dtype: the averages rounded to it
        for k, v in state.model.state_dict().items():
            assert torch.equal(v, averages(state)[k].to(v.dtype)), k
    assert all(torch.equal(v, weights[k]) for k, v in state.model.state_dict().items())


def test_a_checkpoint_listing_options_at_their_defaults_resumes_without_a_warning():
    """A checkpoint records the options that differ from their defaults; one that lists some at their defaults
    (written by another version) holds the same settings: no warning."""
    state = state_of(net())
    train = ct.ema(0.9, decay_warmup=True)(step)
    train(state, batches(1)[0])
    saved = copy.deepcopy(state.state_dict())
    assert saved["transforms"]["ema"]["settings"] == {
        "decay": 0.9,
        "every": 1,
        "warmup": 0,
        "formula": "lerp",
        "decay_warmup": True,
    }
    saved["transforms"]["ema"]["settings"] |= {"integers": "average", "dtype": None, "min_decay": 0.0}
    resumed = state_of(net())
    resumed.load_state_dict(saved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train(resumed, batches(1)[0])


def test_a_float64_average_of_a_float32_model_is_model_ema_v3s():
    """In float64 timm's old-average weight 1 - (1 - decay) differs from decay (0.3: in the last bit): kept."""
    data = batches(5)
    for timm, ours in (({"decay": 0.3}, {"decay": 0.3}), ({"decay": 0.9, "use_warmup": True}, {"decay": 0.9})):
        _, ema = timm_run(data, torch.float32, dtype=torch.float64, **timm)
        ours |= {"decay_warmup": True} if "use_warmup" in timm else {}
        assert_same(ct_run(data, torch.float32, dtype=torch.float64, integers="copy", **ours), ema, dtype=torch.float64)
    assert 1 - (1 - 0.3) != 0.3


# -- how it prints, and what is refused ----------------------------------------------------------------------
def test_it_prints_the_options_given():
    assert repr(ct.ema(0.9, decay_warmup=True, dtype=torch.float32, device="cpu", integers="copy")) == (
        "ema(0.9, decay_warmup=True, device='cpu', dtype=torch.float32, integers='copy')"
    )
    assert repr(ct.ema(0.9, exclude_buffers=True, decay_warmup=True, min_decay=0.1, warmup_power=0.75)) == (
        "ema(0.9, decay_warmup=True, warmup_power=0.75, min_decay=0.1, exclude_buffers=True)"
    )
    assert ct.ema(0.9, dtype=torch.float32)(step) == ct.ema(0.9, dtype=torch.float32)(step)
    assert ct.ema(0.9, dtype=torch.float32)(step) != ct.ema(0.9)(step)


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"min_decay": 0.1}, ValueError, r"min_decay=0.1 bounds the decay warmup's decay from below.*True"),
        ({"warmup_power": 0.75}, ValueError, r"warmup_power=0.75 shapes the decay warmup.*decay_warmup=True"),
        ({"warmup_gamma": 2.0}, ValueError, r"warmup_gamma=2.0 shapes the decay warmup.*decay_warmup=True"),
        ({"decay_warmup": True, "min_decay": 0.95}, ValueError, r"min_decay must be at most decay \(0.9\), got 0.95"),
        ({"min_decay": -0.1, "decay_warmup": True}, ValueError, r"min_decay must be a number in \[0, 1\]"),
        ({"decay_warmup": 1}, TypeError, r"decay_warmup must be True or False, got 1 \(int\)"),
        ({"exclude_buffers": "yes"}, TypeError, r"exclude_buffers must be True or False, got 'yes' \(str\)"),
        ({"dtype": torch.int64}, ValueError, r"dtype must be a floating-point torch.dtype or None, got torch.int64"),
        ({"dtype": "float32"}, TypeError, r"dtype must be a floating-point torch.dtype or None, got 'float32'"),
        ({"device": "gpu:0"}, ValueError, r"device must be a device torch knows, got .gpu:0."),
        ({"device": 3.5}, TypeError, r"device must be a device torch knows .*got 3.5"),
        ({"integers": "mean"}, ValueError, r"integers must be 'average' .* or 'copy' .*got 'mean'"),
        ({"formula": "sum", "dtype": torch.float32}, ValueError, r"formula='sum' .* dtype=torch.float32"),
        ({"formula": "sum", "device": "cpu"}, ValueError, r"formula='sum' .* device='cpu'"),
        ({"exclude_buffers": True, "integers": "copy"}, ValueError, r"integers='copy' .* exclude_buffers=True copies"),
    ],
)
def test_bad_options_are_refused_when_built(options, error, pattern):
    with pytest.raises(error, match=rf"^ema: {pattern}"):
        ct.ema(0.9, **options)


# -- found by the issue-37 adversary --------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_a_meta_device_is_refused_when_built(device):
    """Averages on the meta device hold no numbers: the run would train, and ct.ema_model give a model of none."""
    with pytest.raises(ValueError, match=r"^ema: device must be a device that holds data, got .*meta.*device='cpu'"):
        ct.ema(0.9, device=device)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_dtype_the_average_cannot_be_kept_in_is_refused_when_built(dtype):
    """float8 has no lerp and no promotion: its second update raised after optimizer.step(), the state half-updated."""
    with pytest.raises(ValueError, match=rf"^ema: dtype must be .*float32.*got {dtype}"):
        ct.ema(0.9, dtype=dtype)


def test_a_device_this_process_lacks_is_refused_naming_it_before_anything_changes():
    """torch's own error ('Found no NVIDIA driver', 'invalid device ordinal') named neither ct.ema nor device."""
    state = state_of(net())
    before = copy.deepcopy(state.state_dict())
    train = ct.ema(0.9, device="cuda:99")(step)
    with pytest.raises(ValueError, match=r"^ema\(0.9, device='cuda:99'\): device='cuda:99' cannot hold the averages"):
        train(state, batches(1)[0])
    assert state.step == 0 and state.unusable is None
    after = state.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(before["model"].values(), after["model"].values(), strict=True))
    assert after["optimizer"]["state"] == {} and "ema" not in after["transforms"]


@pytest.mark.parametrize("then", [{}, {"dtype": torch.float64}])
def test_a_resume_with_another_average_dtype_names_the_option_it_was_kept_with(then):
    """The averages were kept in float32 (dtype=torch.float32) for a bf16 model: the refusal said 'this model's ...
    torch.bfloat16; load a checkpoint of the same model', though the model is the same and the fix is the option."""
    saved = state_of(net(dtype=torch.bfloat16))
    ct.ema(0.9, dtype=torch.float32)(step)(saved, batches(1, dtype=torch.bfloat16)[0])
    checkpoint = copy.deepcopy(saved.state_dict())
    resumed = state_of(net(seed=1, dtype=torch.bfloat16))
    resumed.load_state_dict(checkpoint)
    before = copy.deepcopy(resumed.state_dict()["model"])
    with pytest.raises(ValueError) as e:
        ct.ema(0.9, **then)(step)(resumed, batches(1, dtype=torch.bfloat16)[0])
    said = str(e.value)
    assert said.startswith("ema: the checkpoint's average of '0.weight' is (8, 5) torch.float32, this run's ")
    assert "dtype=torch.float32" in said and "same model" not in said
    assert resumed.step == 1 and all(
        torch.equal(a, b) for a, b in zip(before.values(), resumed.model.state_dict().values(), strict=True)
    )

"""data_parallel: replicas on several devices of one process, against the plain step."""

import warnings

import pytest
import torch
from helpers import STRUCTURES, assert_states_close, assert_untouched, classify, make_batch, make_state, snapshot
from hypothesis import given
from hypothesis import strategies as st
from test_accumulate import VOCAB, padded_batch, real_tokens, token_model, token_step
from test_precision import batch32, state32
from torch import nn

import composetrain as ct


@given(
    k=st.integers(1, 4),
    size=st.integers(1, 20),
    structure=st.sampled_from(STRUCTURES),
    seed=st.integers(0, 999),
)
def test_data_parallel_equals_the_plain_step(k, size, structure, seed):
    """float64, momentum SGD, a scheduler, 3 updates; batches smaller than k leave devices idle."""
    a, b = make_state(seed), make_state(seed)
    train = ct.data_parallel(["cpu"] * k)(classify)
    for i in range(3):
        out, ref = (
            train(a, make_batch(size, structure, seed + i)),
            ct.train_step(classify)(b, make_batch(size, structure, seed + i)),
        )
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.metrics["acc"], ref.metrics["acc"], rtol=1e-10, atol=1e-12)
    assert_states_close(a, b)


@given(k=st.integers(2, 3), n=st.integers(1, 3), outside=st.booleans(), size=st.integers(1, 20))
def test_composes_with_accumulate_in_both_orders(k, n, outside, size):
    if outside:
        train = ct.accumulate(n)(ct.data_parallel(["cpu"] * k)(classify))
    else:
        train = ct.data_parallel(["cpu"] * k)(ct.accumulate(n)(classify))
    a, b = make_state(1), make_state(1)
    for i in range(3):
        train(a, make_batch(size, seed=i))
        ct.train_step(classify)(b, make_batch(size, seed=i))
    assert_states_close(a, b)


def test_mixed_precision_goes_outside_and_tracks_one_device():
    a, b = state32(2), state32(2)
    for i in range(3):
        ct.mixed_precision(dtype="bf16")(ct.data_parallel(["cpu", "cpu"])(classify))(a, batch32(16, i))
        ct.mixed_precision(dtype="bf16")(ct.accumulate(2)(classify))(b, batch32(16, i))
    # the same two halves of each batch, in the same precision: the same update but for summation order
    assert_states_close(a, b, rtol=1e-5, atol=1e-6)


def test_orders_that_cannot_be_correct_are_refused_when_built():
    expected = r"data_parallel\(\['cpu'\]\): cannot wrap a step that applies mixed_precision: .*use mixed_precision\("
    with pytest.raises(ValueError, match=expected):
        ct.data_parallel(["cpu"])(ct.mixed_precision(classify))
    with pytest.raises(ValueError, match=r"cannot wrap a step that applies distributed: .*DDP over DP"):
        ct.data_parallel(["cpu"])(ct.distributed(classify))
    with pytest.raises(ValueError, match=r"distributed: cannot wrap a step that applies data_parallel"):
        ct.distributed(ct.data_parallel(["cpu"])(classify))


@pytest.mark.parametrize(
    ("devices", "error", "pattern"),
    [
        ("cpu", TypeError, r"data_parallel: devices must be a non-empty list of devices, .*got 'cpu' \(str\)"),
        ([], ValueError, r"non-empty list"),
        (["cpu", "gpu0"], ValueError, r"devices\[1\] = 'gpu0' is not a device; use 'cpu', 'cuda:0'"),
        (["cpu", 3], TypeError, r"devices\[1\] must be a device such as 'cpu' or 'cuda:0', got 3 \(int\)"),
        (["cuda:7"], ValueError, r"devices\[0\] = 'cuda:7' does not exist here: this machine has \d+ CUDA device"),
        (["cpu", "meta"], ValueError, r"devices\[1\] = 'meta' cannot train: a meta tensor has a shape but no data"),
        ([torch.device("meta")], ValueError, r"devices\[0\] = device\(type='meta'\) cannot train"),
        (["mps"], ValueError, r"devices\[0\] = 'mps' does not exist here: this machine has 0 MPS device\(s\); use"),
        (["cpu", "xpu:1"], ValueError, r"devices\[1\] = 'xpu:1' does not exist here: this machine has 0 XPU device"),
        (["hpu"], ValueError, r"devices\[0\] = 'hpu' does not exist here: this machine has 0 HPU device"),
    ],
)
def test_bad_devices_are_clear_errors(devices, error, pattern):
    with pytest.raises(error, match=pattern):
        ct.data_parallel(devices)


def test_a_failing_shard_changes_nothing_and_leaves_no_gradient_behind():
    calls = []

    def flaky(model, batch):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("shard failed (simulated)")
        return classify(model, batch)

    state = make_state()
    train = ct.data_parallel(["cpu", "cpu", "cpu"])(flaky)
    before = snapshot(state)
    with pytest.raises(RuntimeError, match="simulated"):
        train(state, make_batch(9))
    assert_untouched(state, before)
    ref = make_state()
    train(state, make_batch(9))  # the replicas' stale gradients must not leak into this update
    ct.train_step(classify)(ref, make_batch(9))
    assert_states_close(state, ref)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_two_replicas_on_one_gpu_match_one_device():
    a, b = make_state(3), make_state(3)
    a.model.cuda()
    b.model.cuda()
    for i in range(3):
        batch = tuple(t.cuda() for t in make_batch(12, seed=i))
        ct.data_parallel(["cuda:0", "cuda:0"])(classify)(a, batch)
        ct.train_step(classify)(b, batch)
    assert_states_close(a, b)


# -- shard weights ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 4])
def test_shard_weights_that_do_not_add_up_are_refused_and_change_nothing(k):
    """A weight of 1 per batch gives k units over k shards but 1 for the whole batch: the update
    would be k times too large (accumulate refuses the same function)."""
    state = make_state()
    before = snapshot(state)
    train = ct.data_parallel(["cpu"] * k)(ct.accumulate(1, weight=lambda b: 1)(classify))
    shards = ", ".join(["1.0"] * k)
    expected = rf"\(classify\)\): weight gave {k}.0 units over the shards \[{shards}\] but 1.0 for the whole batch"
    with pytest.raises(ValueError, match=r"^data_parallel\(\['cpu'.*" + expected):
        train(state, make_batch(8))
    assert_untouched(state, before)


def test_shards_are_weighted_by_the_composition_weight():
    """Token-level loss, uneven real tokens per shard: each shard counts its own tokens."""
    a = make_state(model=token_model(0))
    b = make_state(model=token_model(0))
    train = ct.data_parallel(["cpu", "cpu", "cpu"])(ct.accumulate(1, weight=real_tokens)(token_step))
    for i in range(3):
        batch = padded_batch([1, 9, 9, 2, 2, 9, 1], 9, i)
        torch.testing.assert_close(train(a, batch).loss, ct.train_step(token_step)(b, batch).loss)
    assert_states_close(a, b)


# -- replicas follow the master: modes, requires_grad (pitfall 23) --------------------------------
class Tagger(nn.Module):
    """Per-token classifier with a BatchNorm and a Dropout, which the tests keep in eval mode
    (in train mode neither is exact across splits)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 6)
        self.hidden = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(8, VOCAB)
        self.double()
        with torch.no_grad():  # running statistics unlike any batch's: eval mode differs from train mode
            self.norm.running_mean.uniform_(-1, 1)
            self.norm.running_var.uniform_(0.5, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.hidden(self.embed(tokens)).flatten(0, 1)
        return self.out(self.drop(torch.tanh(self.norm(h)))).unflatten(0, tokens.shape[:2])


def tagger(seed: int, *, frozen: bool = False) -> nn.Module:
    """A model in training mode with its BatchNorm and Dropout in eval (frozen BatchNorm, no dropout)."""
    model = Tagger(seed).train()
    model.norm.eval()
    model.drop.eval()
    model.hidden.bias.requires_grad_(not frozen)
    return model


def flip_requires_grad(model: nn.Module) -> None:
    """Freeze the output weight, unfreeze the hidden bias (frozen from the start, if it was)."""
    model.out.weight.requires_grad_(False)
    model.hidden.bias.requires_grad_(True)


def test_replicas_follow_the_masters_submodule_modes():
    a, b = make_state(model=tagger(0)), make_state(model=tagger(0))
    train = ct.data_parallel(["cpu", "cpu"])(token_step)
    for i in range(3):
        batch = padded_batch([6] * 8, 6, i)
        torch.testing.assert_close(train(a, batch).loss, ct.train_step(token_step)(b, batch).loss)
        for replica in a.transform_state("data_parallel", object).copies:
            assert [m.training for m in replica.modules()] == [m.training for m in a.model.modules()]
    assert_states_close(a, b)


def test_replicas_follow_requires_grad_changed_between_updates():
    """A weight frozen after the first update stays put; one unfrozen gets its whole gradient."""
    a, b = make_state(model=tagger(0, frozen=True)), make_state(model=tagger(0, frozen=True))
    train = ct.data_parallel(["cpu", "cpu"])(token_step)
    for i in range(3):
        batch = padded_batch([6] * 8, 6, i)
        train(a, batch)
        ct.train_step(token_step)(b, batch)
        if i == 0:
            frozen = a.model.out.weight.detach().clone()
            flip_requires_grad(a.model)
            flip_requires_grad(b.model)
    assert torch.equal(a.model.out.weight, frozen)
    assert_states_close(a, b)


def test_batchnorm_in_training_mode_is_reported():
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).double()
    state = make_state(model=model)
    with pytest.warns(UserWarning, match=r"^data_parallel\(\['cpu', 'cpu'\]\)\(classify\): the model has BatchNorm"):
        ct.data_parallel(["cpu", "cpu"])(classify)(state, make_batch(8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.data_parallel(["cpu"])(classify)(state, make_batch(8))  # one shard: the whole batch
        model.eval()
        ct.data_parallel(["cpu", "cpu"])(classify)(state, make_batch(8))


# -- batches without a batch dimension ------------------------------------------------------------
def scalar_step(model, batch):
    scale = batch["scale"] if isinstance(batch, dict) else batch[0]
    return (model(torch.ones(2, 5, dtype=torch.float64) * scale) ** 2).mean()


def test_a_batch_of_scalars_is_one_shard_on_one_device_and_refused_on_several():
    a, b = make_state(), make_state()
    ct.data_parallel(["cpu"])(scalar_step)(a, {"scale": torch.tensor(2.0)})
    ct.train_step(scalar_step)(b, {"scale": torch.tensor(2.0)})
    assert_states_close(a, b)
    before = snapshot(a)
    with pytest.raises(
        ValueError,
        match=r"^data_parallel\(\['cpu', 'cpu'\]\)\(scalar_step\): cannot split the batch into 2 shards: it holds no "
        r"tensor with a batch dimension \(got \{'scale': tensor\(2.\)\} \(dict\)\); ",
    ):
        ct.data_parallel(["cpu", "cpu"])(scalar_step)(a, {"scale": torch.tensor(2.0)})
    assert_untouched(a, before)


# -- the property: compositions with data_parallel on models whose modes and requires_grad vary ----
def count_samples(batch):
    return batch["tokens"].shape[0]


def one_per_batch(batch):
    """Does not add up over a split: refused whenever a batch is split."""
    return 1


@given(
    k=st.integers(2, 3),
    n=st.integers(1, 3),
    order=st.sampled_from(["data_parallel", "data_parallel(accumulate)", "accumulate(data_parallel)"]),
    weight=st.sampled_from([None, count_samples, real_tokens, one_per_batch]),
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=10),
    frozen=st.booleans(),
    flip=st.booleans(),
    seed=st.integers(0, 999),
)
def test_data_parallel_compositions_equal_the_plain_step_as_modes_and_requires_grad_change(
    k, n, order, weight, lengths, frozen, flip, seed
):
    """float64, 3 updates. The model trains with a BatchNorm and a Dropout (p=0.5) in eval mode, has a
    parameter frozen from the start (if ``frozen``) and, after the first update (if ``flip``), freezes
    another and unfreezes that one. Token counts are uneven only when weight counts tokens; a weight
    that does not add up is refused, changing nothing, whenever the batch is split."""
    weight = None if order == "data_parallel" else weight  # only accumulate takes weight=
    dp = ct.data_parallel(["cpu"] * k)
    acc = ct.accumulate(n, weight=weight)
    train = {
        "data_parallel": dp,
        "data_parallel(accumulate)": ct.compose(dp, acc),
        "accumulate(data_parallel)": ct.compose(acc, dp),
    }[order](token_step)
    if weight is not real_tokens:  # every sample has all its tokens: the token mean is the sample mean
        lengths = [5] * len(lengths)
    a, b = make_state(model=tagger(seed, frozen=frozen)), make_state(model=tagger(seed, frozen=frozen))
    for i in range(3):
        batch = padded_batch(lengths, 5, seed + i)
        if weight is one_per_batch and len(lengths) > 1:  # data_parallel splits it, if nothing before
            before = snapshot(a)
            with pytest.raises(ValueError, match=r"weight gave \d+.0 units over the (shards|micro-batches) \["):
                train(a, batch)
            assert_untouched(a, before)
            return
        out, ref = train(a, batch), ct.train_step(token_step)(b, batch)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-10, atol=1e-12)
        if i == 0 and flip:
            flip_requires_grad(a.model)
            flip_requires_grad(b.model)
    assert_states_close(a, b)

"""pipeline_split: placement, validation, pipelined micro-batches, compositions."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_states_close, assert_untouched, classify, get_xy, make_batch, make_state, snapshot
from hypothesis import given
from hypothesis import strategies as st
from processes import Pool
from torch import nn

import composetrain as ct
from composetrain.core.batching import map_tensors
from composetrain.transforms._placement import check_placement


class EncoderDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        self.decoder = nn.Linear(8, 3)

    def forward(self, x):
        return self.decoder(self.encoder(x))


def model_of(kind, seed):
    torch.manual_seed(seed)
    if kind == "sequential":
        return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    return EncoderDecoder().double()


PLACEMENTS = {
    "sequential": {"0": "cpu", "2": "cpu", "4": "cpu"},
    "encoder-decoder": {"encoder": "cpu", "decoder": "cpu"},
}


@given(
    kind=st.sampled_from(sorted(PLACEMENTS)),
    chunks=st.integers(1, 8),
    size=st.integers(1, 24),
    seed=st.integers(0, 999),
)
def test_pipeline_split_equals_the_plain_step(kind, chunks, size, seed):
    a = make_state(model=model_of(kind, seed))
    b = make_state(model=model_of(kind, seed))
    train = ct.pipeline_split(PLACEMENTS[kind], chunks=chunks)(classify)
    for i in range(3):
        out, ref = (
            train(a, make_batch(size, seed=seed + i)),
            ct.train_step(classify)(b, make_batch(size, seed=seed + i)),
        )
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-10, atol=1e-12)
    assert_states_close(a, b)


@given(chunks=st.integers(1, 4), n=st.integers(1, 3), outside=st.booleans())
def test_composes_with_accumulate_and_mixed_precision(chunks, n, outside):
    split = ct.pipeline_split(PLACEMENTS["encoder-decoder"], chunks=chunks)
    if outside:
        train = ct.compose(ct.mixed_precision(dtype="bf16"), split, ct.accumulate(n))(classify)
    else:
        train = ct.compose(ct.accumulate(n), ct.mixed_precision(dtype="bf16"), split)(classify)
    a = make_state(model=model_of("encoder-decoder", 0).float())
    b = make_state(model=model_of("encoder-decoder", 0).float())
    before = [p.detach().clone() for p in b.model.parameters()]
    for i in range(3):
        batch = make_batch(16, seed=i, dtype=torch.float32)
        train(a, batch)
        ct.train_step(classify)(b, batch)
    for p0, pa, pb in zip(before, a.model.parameters(), b.model.parameters(), strict=True):
        assert (pa - pb).norm() <= 0.06 * (pb - p0).norm() + 1e-6  # bf16's tolerance, as in test_precision


def test_inputs_hop_between_stages_through_hooks():
    seen = []
    model = model_of("encoder-decoder", 0)
    model.decoder.register_forward_pre_hook(lambda m, args: seen.append(args[0].device))
    state = make_state(model=model)
    ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"}, chunks=3)(classify)(state, make_batch(9))
    assert seen == [torch.device("cpu")] * 3  # three micro-batches through the decoder


@pytest.mark.parametrize("chunks", [1, 3])
def test_the_batch_goes_to_the_last_stage_and_each_stage_gets_its_inputs_on_its_device(monkeypatch, chunks):
    """'cpu:0' and 'cpu:1' are two labels of this machine's one CPU: distinct devices to the placement.
    A spy on the pipeline's moves gives every tensor it moves a fresh identity, tagged with the
    device it was sent to; the step and each stage then show where their inputs were sent."""
    pipeline = importlib.import_module("composetrain.transforms.pipeline")
    first, last = torch.device("cpu:0"), torch.device("cpu:1")
    sent_to, kept = {}, []  # id(tensor) -> device; kept alive so that no id is reused

    def tagging_to_device(tree, device, real=pipeline.to_device):
        def tag(t):
            t = t.clone()  # differentiable: gradients flow back as before
            sent_to[id(t)], _ = device, kept.append(t)
            return t

        return map_tensors(real(tree, device), tag)

    monkeypatch.setattr(pipeline, "to_device", tagging_to_device)
    model = model_of("encoder-decoder", 0)
    arrived = {"encoder": [], "decoder": []}
    for name in arrived:  # the stage's own forward runs after every hook: it sees what finally arrives
        stage = getattr(model, name)

        def forward(x, name=name, inner=stage.forward):
            arrived[name].append(sent_to.get(id(x)))
            return inner(x)

        stage.forward = forward
    step_got = []

    def step(model, batch):
        step_got.append([sent_to.get(id(t)) for t in batch])
        return classify(model, batch)

    state = make_state(model=model)
    train = ct.pipeline_split({"encoder": "cpu:0", "decoder": "cpu:1"}, chunks=chunks)(step)
    for i in range(2):
        train(state, make_batch(9, seed=i))
    assert step_got == [[last, last]] * 2  # inputs and targets: the targets meet the outputs there
    assert arrived == {"encoder": [first] * 2 * chunks, "decoder": [last] * 2 * chunks}
    assert state.step == 2


@pytest.mark.parametrize(
    ("placement", "pattern"),
    [
        (
            {"encoder": "cpu", "head": "cpu"},
            r"the model has no submodule \['head'\]; its children are \['encoder', 'decoder'\]",
        ),
        ({"encoder": "cpu"}, r"leaves \['decoder.weight', 'decoder.bias'\] on no device"),
        (
            {"encoder": "cpu", "encoder.0": "cpu", "decoder": "cpu"},
            r"encoder.0.weight is placed twice, by \['encoder', 'encoder.0'\]",
        ),
    ],
)
def test_placements_that_do_not_cover_the_model_once_are_refused_before_anything_moves(placement, pattern):
    state = make_state(model=model_of("encoder-decoder", 0))
    before = [p.detach().clone() for p in state.model.parameters()]
    with pytest.raises(ValueError, match=pattern):
        ct.pipeline_split(placement)(classify)(state, make_batch(4))
    assert state.step == 0 and all(torch.equal(p, q) for p, q in zip(before, state.model.parameters(), strict=True))


def test_tied_weights_across_devices_are_refused_and_on_one_device_are_fine():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(7, 7)
            self.head = nn.Linear(7, 7, bias=False)
            self.head.weight = self.embed.weight  # tied

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    def step(model, batch):
        return F.cross_entropy(model(batch), batch)

    state = make_state(model=Tied())
    # two distinct devices without a GPU: the check itself, on device labels ('meta' cannot train)
    two = {"embed": torch.device("cpu"), "head": torch.device("meta")}
    with pytest.raises(ValueError, match=r"is shared \(tied\) by \{'embed': 'cpu', 'head': 'meta'\}"):
        check_placement(state.model, two, "pipeline_split")
    out = ct.pipeline_split({"embed": "cpu", "head": "cpu"})(step)(state, torch.randint(0, 7, (4,)))
    assert state.step == 1 and out.loss.isfinite()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "pattern"),
    [
        (({},), {}, ValueError, r"pipeline_split: placement must name at least one submodule"),
        (({"encoder": "tpu:9"},), {}, ValueError, r"placement\['encoder'\] = 'tpu:9' is not a device"),
        (({"encoder": "cuda:5"},), {}, ValueError, r"placement\['encoder'\] = 'cuda:5' does not exist here"),
        (({"encoder": "cpu"},), {"chunks": 0}, ValueError, r"chunks must be a positive int, got 0"),
        (({1: "cpu"},), {}, TypeError, r"placement keys must be submodule names, got 1 \(int\)"),
    ],
)
def test_bad_arguments_are_clear_errors(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        ct.pipeline_split(*args, **kwargs)


def test_batchnorm_with_chunks_is_reported():
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).double()
    expected = "the model has BatchNorm layers in training mode; they normalise each micro-batch"
    with pytest.warns(UserWarning, match=expected):
        ct.pipeline_split({"0": "cpu", "1": "cpu", "2": "cpu"}, chunks=2)(classify)(
            make_state(model=model), make_batch(8)
        )


def test_mix_both_each_rank_splits_its_model():
    """distributed(pipeline_split(...)) over 2 gloo ranks equals one process on the global batch."""
    pool = Pool(2)
    try:
        results = pool.run(__name__, "distributed_pipeline", 4)
    finally:
        pool.close()
    reference = distributed_pipeline(None, 2, 4)
    for r in results:
        for p, q in zip(r, reference, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("chunks", [1, 4])
def test_a_cpu_and_gpu_placement_trains_like_one_device(chunks):
    a = make_state(model=model_of("encoder-decoder", 0))
    b = make_state(model=model_of("encoder-decoder", 0))
    train = ct.pipeline_split({"encoder": "cuda:0", "decoder": "cpu"}, chunks=chunks)(classify)
    for i in range(3):
        out = train(a, make_batch(16, seed=i))
        assert out.loss.device.type == "cpu"  # the last stage's device
        ct.train_step(classify)(b, make_batch(16, seed=i))
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-7, atol=1e-9)


class ReturnsItsLoss(nn.Module):
    """A model that returns (logits, its own mean loss), as Hugging Face models do."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        self.decoder = nn.Linear(8, 3)

    def forward(self, x, y=None):
        logits = self.decoder(self.encoder(x))
        loss = None if y is None else F.cross_entropy(logits, y)  # only given labels, as in Hugging Face
        return logits, loss, torch.tensor(7.0, dtype=torch.float64)


def sgd_state(kind, seed=0):
    torch.manual_seed(seed)
    model = kind().double()
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def own_loss(model, batch):
    x, y = batch
    _, loss, _ = model(x, y)
    return loss


@pytest.mark.parametrize("chunks", [2, 3])
def test_a_models_own_mean_loss_with_chunks_is_refused_not_taken_from_the_first_chunk(chunks):
    """Pitfall 24: each chunk returns its own 0-dim mean; keeping chunk 1's trained on a third of the batch."""
    state = sgd_state(ReturnsItsLoss)
    before = snapshot(state)
    train = ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"}, chunks=chunks)(own_loss)
    with pytest.raises(
        ValueError,
        match=r"0-dim tensor \(output leaf 1, such as its own mean loss\) that differs "
        rf"between the {chunks} chunks; .*compute the loss in the step, or use chunks=1",
    ):
        train(state, make_batch(9))
    assert_untouched(state, before)


def test_a_models_own_loss_trains_exactly_with_one_chunk_and_constant_scalars_pass_through():
    a, ref = sgd_state(ReturnsItsLoss), sgd_state(ReturnsItsLoss)
    batch = make_batch(9)
    ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"})(own_loss)(a, batch)
    ct.train_step(own_loss)(ref, batch)
    assert_states_close(a, ref)

    def logits_loss(model, batch):  # per-sample outputs chunked, a constant 0-dim output alongside
        x, y = batch
        logits, _, seven = model(x)
        assert seven.item() == 7.0
        return F.cross_entropy(logits, y)

    c, d = sgd_state(ReturnsItsLoss), sgd_state(ReturnsItsLoss)
    ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"}, chunks=3)(logits_loss)(c, batch)
    ct.train_step(logits_loss)(d, batch)
    assert_states_close(c, d)


class ReducesOverTheBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        self.decoder = nn.Linear(8, 3)

    def forward(self, x):
        h = self.encoder(x)
        return self.decoder(h), h.mean(0)  # the second is one vector for the whole batch, not per sample


def test_outputs_that_are_not_per_sample_are_refused_with_chunks():
    def step(model, batch):
        x, y = get_xy(batch)
        logits, centre = model(x)
        return F.cross_entropy(logits, y) + centre.pow(2).sum()

    state = sgd_state(ReducesOverTheBatch)
    before = snapshot(state)
    with pytest.raises(
        ValueError,
        match=r"output leaf 1 of the model has first sizes \[8, 8, 8\] for chunks of "
        r"\[3, 3, 3\] samples; .*not reduced over the batch",
    ):
        ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"}, chunks=3)(step)(state, make_batch(9))
    assert_untouched(state, before)
    a, b = sgd_state(ReducesOverTheBatch), sgd_state(ReducesOverTheBatch)  # without chunks it is exact
    ct.pipeline_split({"encoder": "cpu", "decoder": "cpu"})(step)(a, make_batch(9))
    ct.train_step(step)(b, make_batch(9))
    assert_states_close(a, b)


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# distributed(pipeline_split(...)) on the ranks, and its single-process reference (rank None).


def distributed_pipeline(rank, world, chunks):
    state = make_state(model=model_of("encoder-decoder", 0 if rank is None else rank))
    split = ct.pipeline_split(PLACEMENTS["encoder-decoder"], chunks=chunks)
    train = split(classify) if rank is None else ct.distributed(split(ct.accumulate(2)(classify)))
    for i in range(3):
        batch = make_batch(8 * world, seed=i)
        if rank is not None:
            batch = tuple(t[8 * rank : 8 * (rank + 1)] for t in batch)
        train(state, batch)
    return [p.detach().clone() for p in state.model.parameters()]

"""checkpoint_activations: bit-identical updates, real recomputation, freed activations, clear errors."""

import gc
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from helpers import Net, assert_untouched, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import composetrain as ct


class CountingBlock(nn.Module):
    """A residual block with dropout that counts its forward calls and keeps weak references to
    the activations it makes, so that tests can see them recomputed and freed."""

    def __init__(self, width: int, p: float, norm: str = "layer") -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.drop = nn.Dropout(p)
        self.down = nn.Linear(2 * width, width)
        self.norm = nn.BatchNorm1d(width) if norm == "batch" else nn.LayerNorm(width)
        self.calls = 0
        self.made: list[weakref.ref] = []

    def forward(self, x):
        self.calls += 1
        hidden = self.up(x)
        self.made.append(weakref.ref(hidden))  # sin keeps its input for backward (tanh keeps its output)
        return x + self.norm(self.down(self.drop(torch.sin(hidden))))


def counting_net(depth=3, p=0.2, norm="layer", width=6):
    """embed, blocks (a Sequential of ``depth`` CountingBlocks), head."""
    return Net(
        width=width,
        input_layer="embed",
        output_layer="head",
        blocks=lambda: nn.Sequential(*[CountingBlock(width, p, norm) for _ in range(depth)]),
    )


def step(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).double().mean()}


def make(seed=0, optimizer="sgd", **net):
    torch.manual_seed(seed)
    model = counting_net(**net).double()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, 2, 0.5))


def batches(count, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (size,), generator=g))
        for _ in range(count)
    ]


def train(step_fn, state, data, rng_seed=7):
    """Run the updates from one global random state; return the outputs and the random state after."""
    torch.manual_seed(rng_seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # accumulate's BatchNorm warning
        outs = [step_fn(state, b) for b in data]
    return outs, torch.get_rng_state()


def assert_bit_identical(a, b):
    assert a.step == b.step
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), k  # parameters and buffers (running statistics)
    for sa, sb in zip(
        a.optimizer.state_dict()["state"].values(), b.optimizer.state_dict()["state"].values(), strict=True
    ):
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k


SELECTIONS = {
    "class": CountingBlock,
    "names": ["blocks.0", "blocks.2"],
    "predicate": lambda m: isinstance(m, CountingBlock),
    "container": "blocks",
}


@settings(deadline=None)
@given(
    selection=st.sampled_from(sorted(SELECTIONS)),
    outside=st.booleans(),
    n=st.integers(1, 4),
    p=st.sampled_from([0.0, 0.3]),
    depth=st.integers(1, 3),
    size=st.integers(1, 12),
    optimizer=st.sampled_from(["sgd", "adamw"]),
    seed=st.integers(0, 999),
)
def test_updates_are_bit_identical_to_no_checkpointing(selection, outside, n, p, depth, size, optimizer, seed):
    """float64, dropout on or off, in either order with accumulate(n): parameters, optimizer state, losses,
    metrics and the global random stream afterwards are bit for bit those without checkpointing."""
    chosen = SELECTIONS[selection]
    if selection == "names" and depth < 3:
        chosen = [f"blocks.{i}" for i in range(depth)]
    ckpt, acc = ct.checkpoint_activations(chosen), ct.accumulate(n)
    composed = ct.compose(ckpt, acc) if outside else ct.compose(acc, ckpt)
    data = batches(3, size, seed)
    a, b = make(seed, optimizer, depth=depth, p=p), make(seed, optimizer, depth=depth, p=p)
    outs_a, rng_a = train(composed(step), a, data)
    outs_b, rng_b = train(acc(step), b, data)
    assert_bit_identical(a, b)
    assert torch.equal(rng_a, rng_b), "the global random stream moved"
    for x, y in zip(outs_a, outs_b, strict=True):
        assert torch.equal(x.loss, y.loss) and torch.equal(x.metrics["acc"], y.metrics["acc"])
    # the chosen blocks really ran twice per micro-batch: once in forward, once recomputed in backward
    micro = min(n, size)
    for i, block in enumerate(a.model.blocks):
        picked = selection != "names" or f"blocks.{i}" in chosen
        assert block.calls == 3 * micro * (2 if picked else 1), (i, block.calls)
        assert b.model.blocks[i].calls == 3 * micro


def test_batchnorm_statistics_are_updated_once_as_without_checkpointing():
    """Recomputing a BatchNorm in training mode would update its running statistics a second time
    (torch's own checkpoint does); they are restored after the recomputation."""
    data = batches(3, 8)
    a, b = make(norm="batch"), make(norm="batch")
    train(ct.checkpoint_activations(CountingBlock)(step), a, data)
    train(ct.train_step(step), b, data)
    assert_bit_identical(a, b)
    assert a.model.blocks[0].norm.num_batches_tracked.item() == 3
    # the hazard itself: torch.utils.checkpoint alone counts every batch twice
    norm = nn.BatchNorm1d(4).double()
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    torch.utils.checkpoint.checkpoint(norm, x, use_reentrant=False).sum().backward()
    assert norm.num_batches_tracked.item() == 2


def test_the_chosen_modules_activations_are_freed_after_forward():
    """Between forward and backward, the activations made inside checkpointed blocks are gone; without
    checkpointing they are kept for backward."""
    alive = {}

    def probe(model, batch):
        for block in model.blocks:
            block.made = []
        loss, metrics = step(model, batch)
        gc.collect()
        alive[len(alive)] = [[r() is not None for r in block.made] for block in model.blocks]
        return loss, metrics

    for selection in (CountingBlock, ["blocks.1"]):
        state = make()
        ct.checkpoint_activations(selection)(probe)(state, batches(1, 8)[0])
        ct.train_step(probe)(state, batches(1, 8)[0])
    assert alive[0] == [[False], [False], [False]]  # every block checkpointed
    assert alive[1] == [[True], [True], [True]]  # the same blocks, later, without checkpointing
    assert alive[2] == [[True], [False], [True]]  # only blocks.1


def test_saved_activation_memory_shrinks():
    """The bytes autograd keeps for backward, counted by a saved-tensors hook around the forward."""

    def saved_bytes(train_step):
        state = make(width=64, depth=4)
        sizes = []

        def pack(t):
            sizes.append(t.numel() * t.element_size())
            return t

        def counted(model, batch):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                return step(model, batch)

        train_step(counted)(state, batches(1, 256)[0])
        return sum(sizes)

    plain = saved_bytes(ct.train_step)
    checkpointed = saved_bytes(ct.checkpoint_activations(CountingBlock))
    assert checkpointed < plain / 3, (checkpointed, plain)


@pytest.mark.parametrize("order", ["outside", "inside"])
def test_mixed_precision_in_either_order_is_bit_identical(order):
    data = batches(3, 10)
    mp, ckpt = ct.mixed_precision(dtype="bf16"), ct.checkpoint_activations(CountingBlock)
    composed = ct.compose(mp, ckpt, ct.accumulate(2)) if order == "inside" else ct.compose(ckpt, mp, ct.accumulate(2))
    a, b = make(p=0.3), make(p=0.3)
    for s in (a, b):
        s.model.float()
    train(composed(step), a, [(x.float(), y) for x, y in data])
    train(ct.compose(mp, ct.accumulate(2))(step), b, [(x.float(), y) for x, y in data])
    assert_bit_identical(a, b)


def test_nothing_stays_on_the_model_also_when_the_step_fails():
    state = make()
    train_step = ct.checkpoint_activations(CountingBlock)(step)
    train_step(state, batches(1, 4)[0])
    assert all("forward" not in m.__dict__ for m in state.model.modules())
    before = snapshot(state)

    def failing(model, batch):
        model(batch[0])
        raise KeyError("boom")

    with pytest.raises(KeyError):
        ct.checkpoint_activations(CountingBlock)(failing)(state, batches(1, 4)[0])
    assert all("forward" not in m.__dict__ for m in state.model.modules())
    assert_untouched(state, before)
    calls = state.model.blocks[0].calls
    with torch.no_grad():  # evaluation afterwards: one plain forward
        state.model(batches(1, 4)[0][0])
    assert state.model.blocks[0].calls == calls + 1


def test_a_forward_set_on_the_instance_is_kept():
    state = make()
    block = state.model.blocks[0]
    scaled = lambda x: type(block).forward(block, x) * 2  # noqa: E731
    block.forward = scaled
    ct.checkpoint_activations("blocks.0")(step)(state, batches(1, 4)[0])
    assert block.forward is scaled


def test_bad_selections_are_clear_errors():
    state = make()
    data = batches(1, 4)[0]
    with pytest.raises(
        ValueError, match=r"Net has no submodule 'blocks.9'; did you mean 'blocks.2', 'blocks.1', 'blocks.0'\?"
    ):
        ct.checkpoint_activations(["blocks.9"])(step)(state, data)
    with pytest.raises(ValueError, match="no submodule of Net is selected by Conv2d"):
        ct.checkpoint_activations(nn.Conv2d)(step)(state, data)
    with pytest.raises(
        ValueError, match=r"submodule 'blocks.1' is chosen twice \(as 'blocks.1' by 'blocks.1', and by CountingBlock\)"
    ):
        ct.checkpoint_activations(["blocks.1", CountingBlock])(step)(state, data)
    with pytest.raises(ValueError, match=r"'blocks.0' lies inside 'blocks', which is checkpointed whole"):
        ct.checkpoint_activations(["blocks", "blocks.0"])(step)(state, data)
    with pytest.raises(ValueError, match=r"'blocks.0' is given 2 times; give each once"):
        ct.checkpoint_activations(["blocks.0", "blocks.0"])
    with pytest.raises(ValueError, match="modules is empty"):
        ct.checkpoint_activations([])
    with pytest.raises(ValueError, match="the name '' is the whole model"):
        ct.checkpoint_activations("")
    with pytest.raises(TypeError, match=r"modules must be a submodule name.*got 3 \(int\)"):
        ct.checkpoint_activations(3)
    with pytest.raises(TypeError, match=r"the class int is not an nn\.Module"):
        ct.checkpoint_activations(int)
    with pytest.raises(
        TypeError, match=r"modules is required, got a step instead: step\(model, batch\), a function of two arguments"
    ):
        ct.checkpoint_activations(step)
    with pytest.raises(TypeError, match=r"give modules first, then the step: checkpoint_activations\(Block\)\(step\)"):
        ct.checkpoint_activations(ct.train_step(step))
    with pytest.raises(TypeError, match=r"got the predicate <lambda>\(a, b, c\), which takes 3 arguments"):
        ct.checkpoint_activations(lambda a, b, c: True)
    with pytest.raises(ValueError, match="data_parallel's replicas are copies"):
        ct.checkpoint_activations(CountingBlock)(ct.data_parallel(["cpu", "cpu"])(step))
    with pytest.raises(ValueError, match="data_parallel's replicas are copies"):
        ct.data_parallel(["cpu", "cpu"])(ct.checkpoint_activations(CountingBlock)(step))
    with pytest.raises(ValueError, match="use checkpoint_activations once"):
        ct.checkpoint_activations(CountingBlock)(ct.checkpoint_activations("head")(step))
    # nothing was applied by the failed calls
    assert state.step == 0 and all("forward" not in m.__dict__ for m in state.model.modules())


def test_shown_and_compared_as_configured():
    assert (
        repr(ct.checkpoint_activations(["blocks.0", CountingBlock])(step))
        == "checkpoint_activations('blocks.0', CountingBlock)(step)"
    )
    assert ct.checkpoint_activations(CountingBlock)(step) == ct.checkpoint_activations(CountingBlock)(step)
    assert ct.checkpoint_activations(CountingBlock)(step) != ct.checkpoint_activations("blocks.0")(step)

"""checkpoint_activations replays Python's, NumPy's and torch's random numbers in the recomputation, and
leaves every stream after the step where the plain step leaves it (pitfall 31)."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import Net
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import composetrain as ct


class Chancy(nn.Module):
    """A residual block that draws from all three global generators: a layer drop from ``random``, a
    random scale from NumPy, a dropout mask from torch."""

    def __init__(self, width: int, p_drop: float, p_mask: float) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.drop = nn.Dropout(p_mask)
        self.p_drop = p_drop

    def forward(self, x):
        if random.random() < self.p_drop:  # layer drop: the graph itself depends on the draw
            return x
        scale = float(np.random.rand()) + 0.5
        return x + scale * self.drop(torch.tanh(self.lin(x)))


def chancy_net(depth: int, p_drop: float, p_mask: float, width: int = 4) -> nn.Module:
    """embed, blocks (a Sequential of ``depth`` Chancy blocks), head."""
    return Net(
        width=width,
        input_layer="embed",
        output_layer="head",
        blocks=lambda: nn.Sequential(*[Chancy(width, p_drop, p_mask) for _ in range(depth)]),
    )


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make(seed: int, **net) -> tuple[ct.TrainState, list[list[torch.Tensor]]]:
    """A float64 state whose optimizer records the gradients it is handed at each update."""
    torch.manual_seed(seed)
    model = chancy_net(**net).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen: list[list[torch.Tensor]] = []
    grads = lambda: [None if p.grad is None else p.grad.clone() for p in model.parameters()]  # noqa: E731
    opt.register_step_pre_hook(lambda o, a, k: seen.append(grads()))
    return ct.TrainState(model, opt), seen


def batches(count: int, size: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (size,), generator=g))
        for _ in range(count)
    ]


def train(train_step, state, data, seed: int):
    """The updates from one seed of every global generator; the three streams' states after them."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    for batch in data:
        train_step(state, batch)
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def assert_same_run(a, b, seen_a, seen_b, streams_a, streams_b):
    assert len(seen_a) == len(seen_b)
    for update, (ga, gb) in enumerate(zip(seen_a, seen_b, strict=True)):
        for i, (x, y) in enumerate(zip(ga, gb, strict=True)):
            if x is None or y is None:  # a dropped layer's parameters get no gradient
                assert x is None and y is None, f"update {update}, parameter {i}: {x} vs {y}"
                continue
            assert torch.equal(x, y), f"update {update}, parameter {i}: max diff {(x - y).abs().max().item():.3g}"
    for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(x, y)
    (py_a, np_a, torch_a), (py_b, np_b, torch_b) = streams_a, streams_b
    assert py_a == py_b, "Python's random stream after the step differs"
    assert np_a[0] == np_b[0] and np.array_equal(np_a[1], np_b[1]) and np_a[2:] == np_b[2:], "NumPy's stream differs"
    assert torch.equal(torch_a, torch_b), "torch's stream differs"


@pytest.mark.parametrize("p_mask", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_python_and_numpy_draws_are_replayed(p_mask):
    """The fixed case of issue 19 (before the fix: gradients off by 1e-3..1e-1, streams moved)."""
    data = batches(3, 8, seed=1)
    a, seen_a = make(0, depth=3, p_drop=0.4, p_mask=p_mask)
    b, seen_b = make(0, depth=3, p_drop=0.4, p_mask=p_mask)
    streams_a = train(ct.checkpoint_activations(Chancy)(step), a, data, seed=5)
    streams_b = train(ct.train_step(step), b, data, seed=5)
    assert_same_run(a, b, seen_a, seen_b, streams_a, streams_b)


@settings(deadline=None, max_examples=25)
@given(
    n=st.integers(1, 3),
    outside=st.booleans(),
    p_drop=st.sampled_from([0.0, 0.3, 0.6]),
    p_mask=st.sampled_from([0.0, 0.3]),
    depth=st.integers(1, 3),
    size=st.integers(1, 7),
    seed=st.integers(0, 999),
    chosen=st.sampled_from(["class", "first", "predicate"]),
)
def test_replayed_under_accumulate_in_either_order(n, outside, p_drop, p_mask, depth, size, seed, chosen):
    """Gradients, parameters and the Python, NumPy and torch streams after the steps are bit for bit those
    of the same accumulate(n) without checkpointing, with checkpointing outside or inside accumulate."""
    modules = {"class": Chancy, "first": "blocks.0", "predicate": lambda m: isinstance(m, Chancy)}[chosen]
    ckpt, acc = ct.checkpoint_activations(modules), ct.accumulate(n)
    composed = ct.compose(ckpt, acc) if outside else ct.compose(acc, ckpt)
    data = batches(2, size, seed)
    a, seen_a = make(seed, depth=depth, p_drop=p_drop, p_mask=p_mask)
    b, seen_b = make(seed, depth=depth, p_drop=p_drop, p_mask=p_mask)
    streams_a = train(composed(step), a, data, seed)
    streams_b = train(acc(step), b, data, seed)
    assert_same_run(a, b, seen_a, seen_b, streams_a, streams_b)


class Noisy(nn.Module):
    """Noise from Python's and NumPy's generators inside a tensor that backward needs (the product saves it): a
    recomputation that drew other numbers would give other gradients, even with the streams put back after it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        noise = torch.from_numpy(np.random.rand(*x.shape)) + random.random()
        return torch.sin(self.lin(x) * noise.to(x.dtype))


def test_the_recomputation_draws_the_forwards_numbers_where_backward_needs_them():
    data = batches(2, 6, seed=2)
    states = []
    for checkpointed in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 4), Noisy(), Noisy(), nn.Linear(4, 3)).double()
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
        build = ct.checkpoint_activations(Noisy) if checkpointed else ct.train_step
        states.append(train(build(step), state, data, seed=3))
        states.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(states[1], states[3], strict=True))


def test_draws_after_the_forward_are_not_replayed_into_the_recomputation():
    """A step that draws from every stream between forward and backward (a random loss weight): the
    recomputation still replays the forward's numbers, and the later draws are the plain step's."""

    def noisy(model, batch):
        x, y = batch
        logits = model(x)
        weight = 1 + random.random() + float(np.random.rand()) + torch.rand(()).item()
        return weight * F.cross_entropy(logits, y)

    data = batches(2, 6, seed=3)
    a, seen_a = make(4, depth=2, p_drop=0.3, p_mask=0.3)
    b, seen_b = make(4, depth=2, p_drop=0.3, p_mask=0.3)
    streams_a = train(ct.checkpoint_activations(Chancy)(noisy), a, data, seed=9)
    streams_b = train(ct.train_step(noisy), b, data, seed=9)
    assert_same_run(a, b, seen_a, seen_b, streams_a, streams_b)


def test_without_numpy_python_draws_are_still_replayed():
    """NumPy is not a dependency of torch or composetrain: without it, Python's draws are replayed."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import random, sys
        sys.modules["numpy"] = None  # import numpy now raises ImportError
        import torch, torch.nn.functional as F
        from torch import nn
        import composetrain as ct
        from composetrain.core.rng import HOST, Generators
        assert Generators(HOST).np_rng is None  # the replay sees no NumPy

        class Drop(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
            def forward(self, x):
                return x if random.random() < 0.5 else x + torch.tanh(self.lin(x)) * random.random()

        def run(build):
            torch.manual_seed(0)
            random.seed(0)
            model = nn.Sequential(nn.Linear(5, 4), Drop(), Drop(), Drop(), nn.Linear(4, 3)).double()
            state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
            x, y = torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 3, (6,))
            for _ in range(4):
                build(lambda m, b: F.cross_entropy(m(b[0]), b[1]))(state, (x, y))
            return [p.detach().clone() for p in model.parameters()], random.getstate()

        (a, ra), (b, rb) = run(ct.checkpoint_activations(Drop)), run(ct.train_step)
        assert ra == rb and all(torch.equal(p, q) for p, q in zip(a, b)), "differs"
        print("same")
        """
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-3000:]


def test_a_graph_recomputed_twice_replays_twice():
    """A step that differentiates its loss once itself (retain_graph, e.g. to look at a gradient norm)
    before the update's backward: each backward recomputes the blocks, each replays the same numbers."""

    def looks_first(model, batch):
        loss = step(model, batch)
        torch.autograd.grad(loss, list(model.blocks.parameters()), retain_graph=True, allow_unused=True)
        return loss

    data = batches(2, 5, seed=8)
    a, seen_a = make(2, depth=2, p_drop=0.3, p_mask=0.3)
    b, seen_b = make(2, depth=2, p_drop=0.3, p_mask=0.3)
    streams_a = train(ct.checkpoint_activations(Chancy)(looks_first), a, data, seed=2)
    streams_b = train(ct.train_step(looks_first), b, data, seed=2)
    assert_same_run(a, b, seen_a, seen_b, streams_a, streams_b)

"""accumulate("auto"): an attempt that runs out of memory leaves nothing behind that the retry could see.

Each case pits accumulate("auto") against accumulate(n) for the n it settles on, in float64, bit for bit:
the update, the gradients from before the call, every random stream and every buffer of the model.
"""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import make_batch
from torch import nn

import composetrain as ct

OOM = torch.OutOfMemoryError


class Noisy(nn.Module):
    """A model with buffers of its own: a counter bumped in place, a sum of inputs, and one replaced outright."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 3))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("seen", torch.zeros(5))
        self.register_buffer("last", torch.zeros(5), persistent=False)

    def forward(self, x):
        self.calls += 1
        self.seen.add_(x.sum(0))
        self.last = x.mean(0).detach()  # rebinds the attribute: a new tensor, not an in-place change
        return self.net(x)


def state_of(model, seed=0):
    torch.manual_seed(seed)
    model = model()
    model.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    # gradients present before the call are added into its update, as in a plain loop; the weights have some,
    # the biases none (a failed attempt's gradients must go from those too)
    for name, p in model.named_parameters():
        if name.endswith("weight"):
            p.grad = torch.full_like(p, 0.01 * len(name))
    return ct.TrainState(model, opt)


def drawing(limit):
    """A step that draws from Python's random and NumPy's global generator and changes buffers, then runs
    out of memory (after its forward) when its micro-batch holds more than ``limit`` samples."""

    def step(model, batch):
        x, y = batch
        jitter = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
        loss = F.cross_entropy(model(x + jitter), y)
        if limit is not None and x.shape[0] > limit:
            raise OOM(f"CUDA out of memory. Tried to allocate {x.shape[0]} GiB")
        return loss

    return step


def streams():
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def assert_same(auto, split):
    a, b = auto.model.state_dict(keep_vars=True), split.model.state_dict(keep_vars=True)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert torch.equal(auto.model.last, split.model.last)  # non-persistent: not in the state_dict
    for p, q in zip(auto.model.parameters(), split.model.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None)
    sa, sb = auto.optimizer.state_dict()["state"], split.optimizer.state_dict()["state"]
    for key in sa:
        assert torch.equal(sa[key]["momentum_buffer"], sb[key]["momentum_buffer"])


def test_python_numpy_torch_streams_and_every_buffer_are_those_of_accumulate_n():
    """12 samples, out of memory above 3: attempts of 12 and 6 fail after their forward (random numbers
    drawn, buffers changed); the result is accumulate(4)'s, every stream and buffer included."""
    batches = [make_batch(12, seed=i) for i in range(2)]
    results = []
    for train in (ct.accumulate("auto")(drawing(3)), ct.accumulate(4)(drawing(None))):
        state = state_of(Noisy)
        seed_all(5)
        for batch in batches:
            train(state, batch)
        results.append((state, streams()))
    (auto, (py_a, np_a, torch_a)), (split, (py_s, np_s, torch_s)) = results
    assert_same(auto, split)
    assert int(auto.model.calls) == 8  # the 2 failed forwards of the first update are not counted
    assert py_a == py_s
    assert all(np.array_equal(u, v) if isinstance(u, np.ndarray) else u == v for u, v in zip(np_a, np_s, strict=True))
    assert torch.equal(torch_a, torch_s)


def late_micro_batch(model_batch_limit, poisoned_start):
    """Out of memory above ``model_batch_limit`` samples, and also for a micro-batch of more than 3 samples that
    starts at sample ``poisoned_start``: there the attempt fails after its earlier micro-batches' backward added
    into ``.grad``."""

    def step(model, batch):
        x, y = batch
        first = int(x[0, 0].mul(1e6).round())
        if x.shape[0] > model_batch_limit or (first == poisoned_start and x.shape[0] > 3):
            raise OOM("CUDA out of memory (injected)")
        return F.cross_entropy(model(x), y)

    return step


def marked_batch(size, seed=0):
    x, y = make_batch(size, seed=seed)
    x[:, 0] = torch.arange(size, dtype=x.dtype) * 1e-6  # each sample knows its index
    return x, y


@pytest.mark.parametrize("outer", ["", "clip"])
def test_an_oom_in_a_later_micro_batch_restores_the_gradients_from_before_the_call(outer):
    """12 samples: the attempt of 1 x 12 fails at once; the attempt of 2 x 6 fails in its second micro-batch,
    after the first one's backward added into gradients that were there before the call; 4 x 3 fits.
    The update must be accumulate(4)'s: the gradients put back are copies, not tensors backward added into."""
    extra = [ct.clip_grad_norm(0.5)] if outer else []
    seen = compare_with_split(extra, [ct.accumulate("auto")], [ct.accumulate(4)])
    assert seen[:4] == [12, 6, 6, 3]  # the failing attempt did run a backward before it failed


def test_an_oom_in_the_first_attempt_after_a_backward_restores_the_gradients_from_before_the_call():
    """accumulate('auto')(accumulate(2)(step)): the very first attempt (1 x 2 x 6) fails in its second
    micro-batch, after a backward added into the gradients the call found (no retry has replaced them yet).
    The snapshot taken before the call must be a copy, not those very tensors."""
    seen = compare_with_split([], [ct.accumulate("auto"), ct.accumulate(2)], [ct.accumulate(2), ct.accumulate(2)])
    assert seen[:3] == [6, 6, 3]


def compare_with_split(extra, auto, split):
    """``extra + auto`` against ``extra + split`` on 12 marked samples, out of memory above 6 and for a
    micro-batch of more than 3 starting at sample 6: equal parameters and momentum. Returns auto's sizes."""
    mlp = lambda: nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))  # noqa: E731
    results, seen = [], []
    for inner, limit in ((auto, 6), (split, 12)):
        state = state_of(mlp)
        step = late_micro_batch(limit, 6)

        def spy(model, batch, step=step):
            seen.append(batch[0].shape[0])
            return step(model, batch)

        ct.compose(*extra, *inner)(spy)(state, marked_batch(12))
        results.append(state)
    auto_state, split_state = results
    for p, q in zip(auto_state.model.parameters(), split_state.model.parameters(), strict=True):
        assert torch.equal(p, q)
    mine, theirs = auto_state.optimizer.state_dict()["state"], split_state.optimizer.state_dict()["state"]
    for key, entry in mine.items():
        assert torch.equal(entry["momentum_buffer"], theirs[key]["momentum_buffer"])
    return seen


def test_the_retry_sees_exactly_the_gradients_from_before_the_call():
    """Spied where the final attempt's first backward starts: the gradients are the pre-call ones, untouched."""
    state = state_of(lambda: nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)))
    before = [None if p.grad is None else p.grad.clone() for p in state.model.parameters()]
    inner = late_micro_batch(6, 6)
    calls = []

    def step(model, batch):
        if batch[0].shape[0] == 3 and not calls:  # the first micro-batch of the attempt that fits
            calls.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        return inner(model, batch)

    ct.accumulate("auto")(step)(state, marked_batch(12))
    for g, b in zip(calls[0], before, strict=True):
        assert (g is None and b is None) or torch.equal(g, b)


def test_what_is_not_restored_is_said():
    """The docstring names what a failed attempt's rollback covers and what it cannot."""
    doc = ct.accumulate.__doc__
    for covered in ("Python's ``random``", "NumPy", "every buffer"):
        assert covered in doc, covered
    assert "not restored" in doc

"""checkpoint_activations hands every keyword argument to the chosen module, also those that share a name
with torch.utils.checkpoint.checkpoint's own options (issue 19.5)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import composetrain as ct

# checkpoint's options: a module keyword of one of these names was taken by checkpoint (early_stop,
# debug, determinism_check, context_fn silently or with a misleading error) or clashed with ours.
NAMES = ["early_stop", "debug", "use_reentrant", "determinism_check", "context_fn", "preserve_rng_state"]
VALUES = [True, "on", object(), 0.5]


class Gate(nn.Module):
    """Takes one keyword of any name and records what arrived; its value changes the output, so a
    keyword lost on the way changes the gradients too."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list[dict] = []

    def forward(self, x, **options):
        self.seen.append(options)
        (value,) = options.values()
        return torch.tanh(self.lin(x)) * (2.0 if value is True else 1.0 + len(str(type(value))) / 100)


class GatedNet(nn.Module):
    def __init__(self, name: str, value) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 4)
        self.gate = Gate()
        self.out = nn.Linear(4, 3)
        self.name, self.value = name, value

    def forward(self, x):
        return self.out(self.gate(self.inp(x), **{self.name: self.value}))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make(name, value):
    torch.manual_seed(0)
    model = GatedNet(name, value).double()
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("value", VALUES, ids=["True", "str", "object", "float"])
@pytest.mark.parametrize("name", NAMES)
def test_every_keyword_reaches_the_module_unchanged(name, value):
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))
    a, b = make(name, value), make(name, value)
    ct.checkpoint_activations("gate")(step)(a, batch)
    ct.train_step(step)(b, batch)
    # forward, then the recomputation in backward: both with the module's own keyword
    assert len(a.model.gate.seen) == 2 and all(s == {name: value} for s in a.model.gate.seen)
    assert all(s[name] is value for s in a.model.gate.seen)
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), k


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, *, context):
        return torch.sin(self.lin(x)) * context


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.ctx, self.mix, self.out = nn.Linear(5, 4), nn.Linear(5, 4), Mixer(), nn.Linear(4, 3)

    def forward(self, x):
        return self.out(self.mix(self.inp(x), context=self.ctx(x)))


def test_a_keyword_tensor_that_needs_gradients_gets_them():
    """The gradient flows back through a keyword argument as through a positional one."""
    g = torch.Generator().manual_seed(2)
    batch = (torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))
    states = []
    for build in (ct.checkpoint_activations(Mixer), ct.train_step):
        torch.manual_seed(0)
        model = Two().double()
        before = model.ctx.weight.detach().clone()
        states.append(ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)))
        build(step)(states[-1], batch)
    a, b = states
    assert not torch.equal(a.model.ctx.weight, before)  # the keyword's producer was trained
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), k


def test_keyword_tensors_are_seen_where_torch_looks_for_the_device(monkeypatch):
    """torch's checkpoint picks the device whose generator state and autocast it replays from the positional
    arguments only; a module given its tensors by keyword (block(x=h)) must show them there too, or on CUDA
    its dropout masks would not be replayed. Seen on the CPU through the function torch asks."""
    import torch.utils.checkpoint as torch_checkpoint

    seen = []
    infer = torch_checkpoint._infer_device_type

    def spy(*args):
        seen.append([a for a in args if isinstance(a, torch.Tensor)])
        return infer(*args)

    monkeypatch.setattr(torch_checkpoint, "_infer_device_type", spy)

    class KeywordOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, *, x):
            return torch.tanh(self.lin(x))

    class KeywordOnlyNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.block, self.out = nn.Linear(5, 4), KeywordOnly(), nn.Linear(4, 3)

        def forward(self, x):
            return self.out(self.block(x=self.inp(x)))

    model = KeywordOnlyNet().double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ct.checkpoint_activations(KeywordOnly)(step)(
        state, (torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 0]))
    )
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].shape == (4, 4)


class Several(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list[tuple] = []

    def forward(self, x, y, *, a, early_stop, debug):
        self.seen.append((a, early_stop, debug))
        return torch.tanh(self.lin(x)) * a + y * early_stop - debug


class Host(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.several, self.out = nn.Linear(5, 4), Several(), nn.Linear(4, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.out(self.several(h, h * 2, debug=0.25, a=3.0, early_stop=h.sin()))


def test_several_keywords_keep_their_names_and_no_grad_forwards_get_them_too():
    """Several keywords in any order, beside positional arguments, each arrives under its own name; a
    forward without gradients (a teacher pass, evaluation inside the step) gets them as well."""

    def with_a_look(model, batch):
        with torch.no_grad():
            model(batch[0])
        return step(model, batch)

    g = torch.Generator().manual_seed(3)
    batch = (torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))
    states = []
    for build in (ct.checkpoint_activations("several"), ct.train_step):
        torch.manual_seed(0)
        model = Host().double()
        states.append(ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)))
        build(with_a_look)(states[-1], batch)
    a, b = states
    assert [(s[0], s[2]) for s in a.model.several.seen] == [(3.0, 0.25)] * 3  # no_grad, forward, recomputation
    assert all(s[1].shape == (6, 4) for s in a.model.several.seen)
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), k

"""What a predicate ``fn(module) -> bool`` answers, in checkpoint_activations(modules) and sharded(modules=).

Found by the adversarial pass: the answer was used for its truth value, so a predicate that forgot its
``return`` (None for every module) was reported as "selects no submodule", one returning a tensor of
several values failed with torch's bare "Boolean value of Tensor ... is ambiguous", and one that raised
on some submodule surfaced with no word of the predicate, the transform or the submodule. Now the
answer must be a bool (NumPy's too), and both failures name the transform, the predicate, the
submodule and what came back, before anything is wrapped.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import Block, Net

import composetrain as ct
from composetrain.transforms._shard_units import select_units


def net():
    """inp, block (a Block), out."""
    return Net(block=Block)


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def forgot_return(module):
    isinstance(module, Block)


def several(module):
    return torch.ones(2)


def by_name(module):
    return "yes" if isinstance(module, Block) else ""


def only_blocks(module):
    return module.lin is not None  # AttributeError on every other module


def train_once(pick):
    model = net()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    try:
        ct.checkpoint_activations(pick)(step)(state, (torch.randn(4, 5), torch.randint(0, 3, (4,))))
    finally:
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))  # nothing applied
        assert "forward" not in model.block.__dict__  # nothing left wrapped


@pytest.mark.parametrize(
    ("pick", "shown"),
    [(forgot_return, r"None \(NoneType\)"), (several, r"tensor\(\[1\., 1\.\]\) \(Tensor\)"), (by_name, r"'' \(str\)")],
)
def test_an_answer_that_is_no_bool_is_refused_by_both(pick, shown):
    with pytest.raises(
        TypeError,
        match=rf"checkpoint_activations\({pick.__name__}\)\(step\): the predicate "
        rf"{pick.__name__} answered {shown} for submodule 'inp' \(Linear\); a predicate returns "
        r"True or False",
    ):
        train_once(pick)
    with pytest.raises(
        TypeError,
        match=rf"^sharded: the predicate {pick.__name__} answered {shown} for "
        r"submodule 'inp' \(Linear\)",
    ):
        select_units(net(), pick, "sharded")


def test_a_predicate_that_raises_is_named_with_the_submodule():
    with pytest.raises(
        RuntimeError,
        match=r"checkpoint_activations\(only_blocks\)\(step\): the predicate only_blocks "
        r"raised AttributeError\(.*\) on submodule 'inp' \(Linear\); it is called on every "
        r"submodule",
    ) as caught:
        train_once(only_blocks)
    assert isinstance(caught.value.__cause__, AttributeError)
    with pytest.raises(RuntimeError, match=r"^sharded: the predicate only_blocks raised AttributeError"):
        select_units(net(), only_blocks, "sharded")


@pytest.mark.parametrize("answer", [lambda m: isinstance(m, Block), lambda m: np.bool_(isinstance(m, Block))])
def test_python_and_numpy_bools_choose(answer):
    assert [n for n, _ in select_units(net(), answer, "sharded")] == ["block"]
    model = net()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    seen = []
    model.block.register_forward_hook(lambda m, a, o: seen.append("forward" in m.__dict__))
    ct.checkpoint_activations(answer)(step)(state, (torch.randn(4, 5), torch.randint(0, 3, (4,))))
    assert seen == [True]  # the block ran checkpointed

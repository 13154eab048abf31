"""One convention for the predicates that choose submodules: ``fn(module) -> bool``, in
``checkpoint_activations(modules)`` and ``sharded(modules=)`` alike; the other form is refused when the
transform is built, naming the function, the argument, the signature that arrived and the fix.

(Why one argument: a two-argument function given to ``checkpoint_activations`` cannot be told from a
``step(model, batch)`` used bare, which is refused when the composition is built; torch's own
``apply_activation_checkpointing(check_fn=)`` takes the module alone as well.)
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import Block, Net
from torch import nn

import composetrain as ct
from composetrain.transforms._shard_units import check_units_argument, select_units


def net():
    """inp, layers.0 and layers.1 (two Blocks), out."""
    return Net(layers=lambda: nn.ModuleList([Block(), Block()]))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def is_block(module):
    return isinstance(module, Block)


def named_block(name, module):
    return isinstance(module, Block)


def test_sharded_takes_a_predicate_of_the_module():
    """A one-argument predicate chooses the units (before: it was accepted, then called with (name,
    module) at the first update and failed there)."""
    units = check_units_argument(is_block)
    chosen = select_units(net(), units, "sharded(modules=is_block)")
    assert [n for n, _ in chosen] == ["layers.1", "layers.0"]  # innermost (here: last) first
    assert repr(ct.sharded(modules=lambda m: isinstance(m, Block))) == "sharded(modules=<lambda>)"


@pytest.mark.parametrize(
    ("pick", "shown"),
    [
        (named_block, r"named_block\(name, module\)"),
        (lambda n, m: True, r"<lambda>\(n, m\)"),
        (lambda n, m, flag=False: True, r"<lambda>\(n, m, flag=False\)"),
    ],
)
def test_a_predicate_of_name_and_module_is_refused_by_both_when_built(pick, shown):
    with pytest.raises(
        TypeError,
        match=rf"^sharded: modules got the predicate {shown}, which takes 2 arguments; a predicate takes the "
        r"module alone: modules=lambda module: isinstance\(module, Block\) \(to choose by name, give the names: "
        r"modules=\['layers\.0', 'layers\.1'\]\)$",
    ):
        ct.sharded(modules=pick)
    with pytest.raises(
        TypeError,
        match=rf"^checkpoint_activations: modules is required, got a step instead: .*{shown}.*; a predicate takes "
        r"the module alone: checkpoint_activations\(lambda module: isinstance\(module, Block\)\); give modules "
        r"first, then the step: checkpoint_activations\(Block\)\(step\)$",
    ):
        ct.checkpoint_activations(pick)


def test_a_function_of_no_or_three_arguments_is_refused_by_both_when_built():
    for pick, shown in ((lambda: True, r"<lambda>\(\)"), (lambda a, b, c: True, r"<lambda>\(a, b, c\)")):
        with pytest.raises(TypeError, match=rf"^sharded: modules got the predicate {shown}, which takes"):
            ct.sharded(modules=pick)
        with pytest.raises(TypeError, match=rf"^checkpoint_activations: modules got the predicate {shown}, which "):
            ct.checkpoint_activations(pick)


def test_a_module_instance_is_no_predicate():
    with pytest.raises(TypeError, match=r"^sharded: modules got an nn\.Module instance, Linear\(.*\); give its name"):
        ct.sharded(modules=nn.Linear(2, 2))


def test_checkpoint_activations_takes_the_same_predicate():
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(4, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (4,), generator=g))
    states = []
    for build in (ct.checkpoint_activations(is_block), ct.train_step):
        torch.manual_seed(0)
        model = net().double()
        states.append(ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)))
        build(step)(states[-1], batch)
    for x, y in zip(states[0].model.parameters(), states[1].model.parameters(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("given", [[Block, nn.Linear], (Block, nn.Linear)])
def test_sharded_takes_classes_as_a_list_or_a_tuple_as_checkpoint_activations_does(given):
    """A list of classes chooses the same units as the tuple (before: a list of classes was refused as
    'must be submodule names', while checkpoint_activations took the same list; found by the a-hf adversary
    with modules=[GPT2Block, nn.Embedding])."""
    chosen = select_units(net(), check_units_argument(given), "sharded(test)")
    assert sorted(n for n, _ in chosen) == ["inp", "layers.0", "layers.0.lin", "layers.1", "layers.1.lin", "out"]
    assert repr(ct.sharded(modules=given)) == "sharded(modules=Block, Linear)"

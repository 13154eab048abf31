"""sharded's choice of units refuses a weight tied across two units, also when the units nest
(``modules=["enc", "enc.layer"]``): each parameter belongs to the innermost unit that holds it (issue 20.4).
The check runs before any process group or fully_shard is needed, so it is tested in one process."""

import pytest
import torch
from torch import nn

from composetrain.transforms._shard_units import check_units_argument, select_units


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.layer = Layer()

    def forward(self, x):
        return self.layer(self.proj(x))


class EncoderHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = Encoder()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        return self.head(self.enc(x))


def choose(model, modules):
    return [n for n, _ in select_units(model, check_units_argument(modules), "sharded(test)")]


@pytest.mark.parametrize("modules", [["enc", "enc.layer"], ["enc.layer", "enc"]])
def test_a_weight_tied_between_an_inner_and_its_outer_unit_is_refused_naming_both(modules):
    model = EncoderHead()
    model.enc.layer.lin.weight = model.enc.proj.weight  # used by enc.layer, and by enc outside enc.layer
    with pytest.raises(
        ValueError,
        match=r"^sharded\(test\): parameters \['enc\.proj\.weight', 'enc\.layer\.lin\.weight'\] are one tensor "
        r"\(tied weights\) used in units \['enc', 'enc\.layer'\]",
    ):
        choose(model, modules)


def test_a_weight_tied_between_an_inner_unit_and_the_root_is_refused():
    model = EncoderHead()
    model.head.weight = model.enc.layer.lin.weight
    with pytest.raises(ValueError, match=r"used in units \['<root>', 'enc\.layer'\]"):
        choose(model, ["enc", "enc.layer"])


def test_untied_nested_units_and_ties_inside_one_unit_are_accepted():
    model = EncoderHead()
    assert choose(model, ["enc", "enc.layer"]) == ["enc.layer", "enc"]  # inner units are sharded first
    model.enc.proj.weight = nn.Parameter(torch.eye(4))
    model.enc.layer.lin.weight = model.enc.proj.weight  # both uses inside the unit 'enc'
    assert choose(model, ["enc"]) == ["enc"]
    assert choose(model, lambda m: m is model.enc) == ["enc"]

"""The composition rules (``core/composition_rules.py``): every ordered pair of the transforms, one around the other,
is either refused when built, with exactly the table's reason (or, for a transform that may appear once, around
itself), or accepted and ``ct.check``-equal to the plain step.

On one process (no process group) ``distributed`` and ``sharded`` are the plain step, so their accepted pairs are
compared as such (``tests/test_distributed.py`` and ``tests/test_sharded.py`` compare them over real processes);
``compile`` uses the "eager" backend (TorchDynamo without a compiler), as its ordering does not depend on one.
"""

import pytest
import torch
from helpers import classify, make_batch, make_state
from torch._dynamo.utils import counters
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import composetrain as ct
from composetrain.core.composition_rules import FULLGRAPH, REFUSED

TRANSFORMS = {  # each transform by its name in the table: a fresh one
    "accumulate": lambda: ct.accumulate(2),
    "accumulate(micro_batch)": lambda: ct.accumulate(micro_batch=5),  # 12 samples: 5, 5, 2
    "accumulate_auto": lambda: ct.accumulate("auto"),
    "mixed_precision": lambda: ct.mixed_precision(),
    "clip_grad_norm": lambda: ct.clip_grad_norm(0.05),
    "clip_grad_value": lambda: ct.clip_grad_value(0.01),
    "adaptive_clip_grad": lambda: ct.adaptive_clip_grad(0.02),
    "distributed": lambda: ct.distributed(),
    "sharded": lambda: ct.sharded(),
    "data_parallel": lambda: ct.data_parallel(["cpu", "cpu"]),
    "pipeline_split": lambda: ct.pipeline_split({"0": "cpu", "2": "cpu"}, chunks=2),
    "checkpoint_activations": lambda: ct.checkpoint_activations(["0"]),
    "compile": lambda: ct.compile(backend="eager"),
    FULLGRAPH: lambda: ct.compile(backend="eager", fullgraph=True),
    "ema": lambda: ct.ema(0.9),
    "tensor_parallel": lambda: ct.tensor_parallel({"0": ColwiseParallel(), "2": RowwiseParallel()}, size=2),
    "pipeline": lambda: ct.pipeline([["0", "1"], ["2"]], microbatches=2),
    "skip_spikes": lambda: ct.skip_spikes(watch="both"),  # no order rule: it judges the root's pass in verify
}
# a transform listed under another name than its table's: accumulate's two forms share one row
TABLE_NAME = {"accumulate(micro_batch)": "accumulate"}

# The orders that cannot be made correct (DESIGN: refused when built, naming the order to use), outer first: what
# the table holds, no more and no less
REFUSED_ORDERS = {
    *(
        (outer, inner)
        for a, b in [
            ("data_parallel", "distributed"),
            ("data_parallel", "sharded"),
            ("data_parallel", "pipeline_split"),
            ("data_parallel", "accumulate_auto"),
            ("distributed", "sharded"),
            ("sharded", "accumulate_auto"),
            ("sharded", "pipeline_split"),
            ("data_parallel", "checkpoint_activations"),
            *((FULLGRAPH, role) for role in ("checkpoint_activations", "distributed", "pipeline_split", "sharded")),
            *(
                (split, other)
                for split in ("tensor_parallel", "pipeline")
                for other in ("data_parallel", "pipeline_split", "accumulate_auto", "compile")
            ),
            ("tensor_parallel", "pipeline"),
        ]
        for outer, inner in [(a, b), (b, a)]
    ),
    ("data_parallel", "mixed_precision"),
    ("accumulate", "accumulate_auto"),
    ("accumulate_auto", "mixed_precision"),
    # a model split across processes first, data parallelism around it
    *((split, dp) for split in ("tensor_parallel", "pipeline") for dp in ("distributed", "sharded")),
    # the transforms that take part in the passes go outside a pipeline, which runs the passes itself
    *(("pipeline", inner) for inner in ("accumulate", "mixed_precision", "checkpoint_activations")),
}


def test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct():
    assert set(REFUSED) == REFUSED_ORDERS
    assert all(isinstance(why, str) and why for why in REFUSED.values())


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_a_transforms_refuses_inside_is_its_row_of_the_table(name):
    step = TRANSFORMS[name]()(classify)
    # a fullgraph compile is checked as FULLGRAPH when built
    row = "compile" if name == FULLGRAPH else TABLE_NAME.get(name, name)
    assert dict(type(step).refuses_inside) == {inner: why for (outer, inner), why in REFUSED.items() if outer == row}


def expected_refusal(outer: str, inner: str) -> str | None:
    """The message that building ``outer(inner(step))`` must fail with, or None where it composes: the table's
    reason for the first role (by name) the step inside applies that the outer's rows refuse (a fullgraph
    compile's, then any compile's)."""
    label = repr(TRANSFORMS[outer]())
    inside = TRANSFORMS[inner]()(classify)
    for row in [FULLGRAPH, "compile"] if outer == FULLGRAPH else [TABLE_NAME.get(outer, outer)]:
        hit = sorted(role for role in inside.roles if (row, role) in REFUSED)
        if hit:
            return f"{label}: cannot wrap a step that applies {hit[0]}: {REFUSED[row, hit[0]]}"
    role = type(TRANSFORMS[outer]()(classify)).role
    if role in inside.roles:  # a transform that may appear once in a composition (compile, fullgraph or not)
        return f"{label}: the step inside, {inside!r}, already applies {role}; use {role} once in a composition"
    return None


PAIRS = [(outer, inner) for outer in TRANSFORMS for inner in TRANSFORMS]


@pytest.mark.usefixtures("fresh_dynamo")  # conftest.py: a compiled pair counts its own compilations
@pytest.mark.parametrize(("outer", "inner"), PAIRS, ids=[f"{o}({i})" for o, i in PAIRS])
def test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step(outer, inner):
    refusal = expected_refusal(outer, inner)
    if refusal is not None:
        with pytest.raises(ValueError) as refused:
            TRANSFORMS[outer]()(TRANSFORMS[inner]()(classify))
        assert str(refused.value) == refusal
        if "cannot wrap" in refusal:  # from anywhere inside, not only right inside
            with pytest.raises(ValueError) as deeper:
                TRANSFORMS[outer]()(ct.ema(0.5)(TRANSFORMS[inner]()(classify)))
            assert str(deeper.value) == refusal
        return
    step = TRANSFORMS[outer]()(TRANSFORMS[inner]()(classify))
    result = ct.check(step, make_state(1), make_batch(12, seed=2))
    assert result and result.dtype is torch.float64 and result.grads.scale > 0, result
    assert result.params.largest <= 1e-12, result
    if "compile" in step.roles:  # compiled, not a silent fallback to eager
        assert counters["stats"]["unique_graphs"] >= 1


def test_a_step_breaking_two_rules_is_refused_for_the_first_by_name_whatever_the_order_inside():
    """data_parallel refuses both distributed and mixed_precision inside it: one message, the same either way."""
    why = REFUSED["data_parallel", "distributed"]
    for inside in (ct.mixed_precision(ct.distributed(classify)), ct.distributed(ct.mixed_precision(classify))):
        with pytest.raises(ValueError) as refused:
            ct.data_parallel(["cpu"])(inside)
        assert str(refused.value) == f"data_parallel(['cpu']): cannot wrap a step that applies distributed: {why}"


def test_every_order_the_table_refuses_is_refused_when_built():
    """Each refused pair of the table, as the transforms themselves build it: ``expected_refusal`` reads the roles a
    step applies, so a transform missing from its step's roles would let its pairs compose unseen (``accumulate(n)``
    applied no role, and ``pipeline(accumulate(n)(step))``, refused by the table, was built)."""
    unrefused = []
    for outer, inner in PAIRS:
        if (TABLE_NAME.get(outer, outer), TABLE_NAME.get(inner, inner)) in REFUSED:
            try:
                TRANSFORMS[outer]()(ct.ema(0.5)(TRANSFORMS[inner]()(classify)))
            except ValueError:
                continue
            unrefused.append(f"{outer}({inner})")
    assert unrefused == []
    with pytest.raises(ValueError) as refused:
        ct.pipeline([["0", "1"], ["2"]], microbatches=2)(ct.accumulate(micro_batch=5)(classify))
    why = REFUSED["pipeline", "accumulate"]
    assert str(refused.value).endswith(f"cannot wrap a step that applies accumulate: {why}")

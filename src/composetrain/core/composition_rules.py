"""The composition rules: which transform cannot wrap which, why, and the order to use, in one table.

A transform is named here by its ``role`` (``TrainStep.role``); ``accumulate(n)``, which may nest and so has no
role, by ``"accumulate"``; a ``ct.compile(fullgraph=True)`` also by ``FULLGRAPH``, the role it adds to the
composition's. ``REFUSED[(outer, inner)]`` says why a step applying ``outer`` cannot wrap a step that applies
``inner`` anywhere inside it, and what to do instead. A transform's ``refuses_inside`` is its row of the table
(``refused_inside(role)``), checked when a composition is built (``TrainStep.__init__``, through ``check_inside``);
every order of two transforms that the table does not name composes to the plain step's update
(``tests/test_composition_rules.py`` walks them all).

Each reason is written once: a pair refused in either order for the same reason stands once in ``_EITHER``, and
the graph breaks that ``fullgraph=True`` forbids once in ``_BREAKS_GRAPH``.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from types import MappingProxyType

__all__ = ["FULLGRAPH", "REFUSED", "check_inside", "refused_inside"]

# the role a fullgraph compile adds to the composition's, so that the transforms that break its graph can refuse
# it from outside too
FULLGRAPH = "compile(fullgraph=True)"

# refused in either order, for one reason
_EITHER: dict[tuple[str, str], str] = {
    ("data_parallel", "distributed"): "DDP reduces the gradients of one module, not of thread replicas; run one "
    "process per device instead (torchrun --nproc-per-node=<devices>): DDP over DP, also on one node",
    ("data_parallel", "sharded"): "FSDP shards one module across processes, not thread replicas; run one process "
    "per device (torchrun --nproc-per-node=<devices>) with ct.sharded alone",
    ("data_parallel", "pipeline_split"): "a model split across devices cannot also be replicated on each of them",
    ("data_parallel", "accumulate_auto"): "a retry must start again from the whole batch, not from one replica's "
    "shard; run one process per device with distributed(accumulate('auto')(step))",
    ("distributed", "sharded"): "a model is either replicated (DDP) or sharded (FSDP), not both; use ct.sharded alone",
    ("sharded", "accumulate_auto"): "an out-of-memory retry must be agreed by every rank before FSDP2's "
    "collectives, which sharded does not arrange yet: use a fixed accumulate(n) inside sharded, or "
    "distributed(accumulate('auto')(step))",
    ("data_parallel", "tensor_parallel"): "tensor parallelism splits layers across processes, not thread replicas; "
    "run one process per device (torchrun --nproc-per-node=<devices>)",
    ("data_parallel", "pipeline"): "pipeline puts its stages on processes, not on thread replicas; run one process "
    "per device (torchrun --nproc-per-node=<devices>)",
    ("pipeline_split", "tensor_parallel"): "tensor parallelism here holds the model on one device per process; "
    "give each process its own device instead of pipeline_split",
    ("pipeline_split", "pipeline"): "pipeline puts its stages on processes, pipeline_split on one process's "
    "devices; use ct.pipeline with one process per device",
    ("accumulate_auto", "tensor_parallel"): "an out-of-memory retry must be agreed by every rank before the "
    "forward's collectives (tensor parallelism joins each split layer's pieces), which is not arranged: use a "
    "fixed accumulate(n)",
    ("accumulate_auto", "pipeline"): "an out-of-memory retry must be agreed by every stage before the sends and "
    "receives of its forward, which is not arranged: size the micro-batches with pipeline's microbatches=",
    ("tensor_parallel", "pipeline"): "tensor and pipeline parallelism in one composition (a 3-D mesh) are not "
    "arranged yet; use one of them, with sharded or distributed for the data dimension",
    ("compile", "tensor_parallel"): "torch.compile over tensor-parallel DTensor layers is not arranged (nor "
    "tested) here yet; leave ct.compile out",
    ("compile", "pipeline"): "the pipeline's stages run the model's submodules themselves, not the plain step "
    "ct.compile compiles; leave ct.compile out",
}

# refused with the first outside the second only: (outer, inner)
_ONE_WAY: dict[tuple[str, str], str] = {
    ("data_parallel", "mixed_precision"): "it would unscale each replica's gradients before they are summed; use "
    "mixed_precision(data_parallel(...)(step))",
    ("data_parallel", "checkpoint_activations"): "data_parallel's replicas are copies of the model that the chosen "
    "submodules are not part of; run one process per device with distributed instead",
    ("checkpoint_activations", "data_parallel"): "data_parallel's replicas are copies of the model that the chosen "
    "submodules are not part of; run one process per device with distributed instead: "
    "distributed(checkpoint_activations(modules)(step))",
    ("sharded", "pipeline_split"): "FSDP2 here shards a model on one device per process; split the model with "
    "modules= (its units are gathered one at a time) instead of pipeline_split",
    ("pipeline_split", "sharded"): "FSDP2 here shards a model on one device per process; split the model with "
    "sharded's modules= (its units are gathered one at a time) instead of pipeline_split",
    ("accumulate", "accumulate_auto"): "a retry after an out-of-memory error starts again from the whole batch of "
    "the update, not from one micro-batch of it; put accumulate('auto') outside: "
    "accumulate('auto')(accumulate(n)(step))",
    ("accumulate_auto", "mixed_precision"): "mixed_precision unscales the gradients after the last pass, and which "
    "pass is last is known only once every pass fitted; use mixed_precision(accumulate('auto')(step))",
    ("tensor_parallel", "distributed"): "the model is split first, then data parallelism wraps each piece "
    "(torchtitan's order: TP, then FSDP); put tensor_parallel inside: distributed(tensor_parallel(plan, size=T)(step))",
    ("tensor_parallel", "sharded"): "the model is split first, then FSDP shards each piece (torchtitan's order: TP, "
    "then FSDP); put tensor_parallel inside: sharded(tensor_parallel(plan, size=T)(step))",
    ("pipeline", "distributed"): "the model is split into stages first, then data parallelism wraps each stage; put "
    "pipeline inside: distributed(pipeline(stages, microbatches=M)(step))",
    ("pipeline", "sharded"): "the model is split into stages first, then FSDP shards each stage; put pipeline "
    "inside: sharded(pipeline(stages, microbatches=M)(step))",
    **{
        ("pipeline", role): f"pipeline runs the passes itself, micro-batch by micro-batch through the stages, so "
        f"{what} goes outside it: {fix}"
        for role, what, fix in (
            ("accumulate", "accumulate", "accumulate(n)(pipeline(...)(step)), or raise microbatches="),
            (
                "mixed_precision",
                "mixed_precision (it unscales after the last pass)",
                "mixed_precision(pipeline(...)(step))",
            ),
            (
                "checkpoint_activations",
                "checkpoint_activations (it wraps the passes)",
                "checkpoint_activations(Block)(pipeline(...)(step))",
            ),
        )
    },
}

# The transforms whose hooks run eagerly between the compiled graphs (graph breaks, by design): fullgraph=True
# forbids them, in either order
_BREAKS_GRAPH: dict[str, str] = {
    "checkpoint_activations": "the chosen submodules run eagerly between the compiled graphs (TorchDynamo cannot "
    "trace checkpoint's exact replay)",
    "distributed": "DDP's forward runs its own bookkeeping (the reducer's logging, the buckets' preparation) "
    "eagerly, between the compiled graphs",
    "pipeline_split": "its hooks move activations between devices eagerly, between the compiled graphs",
    "sharded": "FSDP2's hooks gather and free the shards eagerly, between the compiled graphs",
}
_FULLGRAPH_FIX = "a graph break that fullgraph=True forbids; use ct.compile(fullgraph=False) (the default)"


def _table() -> dict[tuple[str, str], str]:
    table = dict(_ONE_WAY)
    for (a, b), why in _EITHER.items():
        table[a, b] = table[b, a] = why
    for role, why in _BREAKS_GRAPH.items():
        table[FULLGRAPH, role] = table[role, FULLGRAPH] = f"{why}, {_FULLGRAPH_FIX}"
    return table


# (outer, inner) -> why the outer cannot wrap the inner, with the order or the transform to use instead
REFUSED: Mapping[tuple[str, str], str] = MappingProxyType(_table())


def refused_inside(outer: str) -> Mapping[str, str]:
    """The row of ``outer``: each role a step applying it cannot wrap, and why (a transform's ``refuses_inside``)."""
    return MappingProxyType({inner: why for (o, inner), why in REFUSED.items() if o == outer})


def check_inside(who: str, refused: Mapping[str, str], inside: Set[str]) -> None:
    """Refuse wrapping a step that applies the roles ``inside``, if ``refused`` (a row of the table) names one of
    them: the first by name, with its reason."""
    for role in sorted(inside & refused.keys()):
        raise ValueError(f"{who}: cannot wrap a step that applies {role}: {refused[role]}")

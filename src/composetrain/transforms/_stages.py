"""A model split into pipeline stages across processes (internal): what each stage holds, the model pruned to
one stage, weights tied across stages, and the TrainState's view of the whole model for checkpoints.

Every process builds the whole model; ``split`` checks the stages against it (each parameter and buffer in
exactly one stage, but for a weight tied across stages, such as an input embedding shared with the output
layer), then removes from it every submodule of the other stages: ``state.model`` stays the same object, its
names the unsplit model's (``blocks.3.up.weight`` on the stage holding ``blocks.3``), and its ``forward`` runs
the stage's submodules one after the other. A checkpoint holds the whole model's state: ``StageView.whole``
gathers the stages' parts (model, optimizer state by parameter name, transform state) on every process, and
``StageView.own`` takes this stage's part back out, so a pipeline's checkpoint loads into the unsplit model.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from composetrain.core.state import TrainState
from composetrain.launch.agree import gathered

__all__ = ["Parts", "Plan", "StageView", "chain", "check_stages", "prune", "tied_sum"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the whole model splits. Names are ``named_parameters(remove_duplicate=False)`` paths; a parameter's
    canonical name is its first path in the whole model (the unsplit optimizer's and checkpoint's key).

    Attributes:
        stages: the submodule names of each stage, in forward order.
        holders: canonical parameter name -> the stages holding it (more than one: tied).
        canonical: path -> canonical name, for every parameter path of the whole model.
        groups: the optimizer's groups as canonical names, in the unsplit optimizer's order.
        paths: every state-dict key of the whole model (parameters and buffers).
        shapes: canonical name -> the parameter's shape.
        dtypes: canonical name -> the parameter's dtype (what a stage that does not hold it sends in its place).
    """

    stages: tuple[tuple[str, ...], ...]
    holders: dict[str, tuple[int, ...]]
    canonical: dict[str, str]
    groups: list[list[str]]
    paths: frozenset[str]
    shapes: dict[str, torch.Size]
    dtypes: dict[str, torch.dtype] = dataclasses.field(default_factory=dict)

    def stage_of(self, path: str) -> int | None:
        for i, names in enumerate(self.stages):
            if any(path == n or path.startswith(n + ".") for n in names):
                return i
        return None

    def tied(self) -> list[str]:
        """The canonical names of the parameters several stages hold, in one order on every process."""
        return sorted(n for n, held in self.holders.items() if len(held) > 1)


def check_stages(
    model: nn.Module, optimizer: torch.optim.Optimizer, stages: tuple[tuple[str, ...], ...], who: object
) -> Plan:
    """The split of ``model`` into ``stages``, checked: every name a submodule, none inside another, every
    parameter and buffer in a stage, the optimizer's parameters the model's."""
    modules = dict(model.named_modules())
    flat = [n for names in stages for n in names]
    for n in flat:
        if n not in modules or n == "":
            close = [m for m in modules if m and m.rsplit(".", 1)[-1] == n.rsplit(".", 1)[-1]]
            raise ValueError(
                f"{who!r}: stages name {n!r}, which is not a submodule of the model ({type(model).__name__}); "
                f"names ending alike: {close[:6]}; the names are model.named_modules()'s, the root excluded"
            )
    for a in flat:
        inside = [b for b in flat if b != a and (a == b or a.startswith(b + "."))]
        if inside or flat.count(a) > 1:
            raise ValueError(
                f"{who!r}: stages name {a!r} {'twice' if flat.count(a) > 1 else f'inside {inside[0]!r}'}; each "
                "submodule belongs to one stage"
            )
    holders: dict[str, set[int]] = {}
    canonical: dict[str, str] = {}
    first: dict[int, str] = {}
    shapes: dict[str, torch.Size] = {}
    dtypes: dict[str, torch.dtype] = {}
    plan = Plan(stages, {}, {}, [], frozenset(), {})
    for path, p in model.named_parameters(remove_duplicate=False):
        name = first.setdefault(id(p), path)
        canonical[path] = name
        shapes[name], dtypes[name] = p.shape, p.dtype
        stage = plan.stage_of(path)
        if stage is None:
            raise ValueError(
                f"{who!r}: parameter {path!r} lies in no stage ({_stages_shown(stages)}); every parameter must "
                "be inside a submodule of one stage: name its module in a stage"
            )
        holders.setdefault(name, set()).add(stage)
    for path, _ in model.named_buffers():
        if plan.stage_of(path) is None:
            raise ValueError(
                f"{who!r}: buffer {path!r} lies in no stage ({_stages_shown(stages)}); name its module in a stage"
            )
    names = {id(p): first[id(p)] for p in model.parameters()}
    groups = []
    for g in optimizer.param_groups:
        foreign = [i for i, p in enumerate(g["params"]) if id(p) not in names]
        if foreign:
            raise ValueError(
                f"{who!r}: the optimizer holds {len(foreign)} parameter(s) that are not the model's; each stage keeps "
                "the optimizer's settings for its own parameters, found by name: build it over model.parameters()"
            )
        groups.append([names[id(p)] for p in g["params"]])
    paths = frozenset(model.state_dict(keep_vars=True).keys())
    return Plan(stages, {n: tuple(sorted(s)) for n, s in holders.items()}, canonical, groups, paths, shapes, dtypes)


def _stages_shown(stages: tuple[tuple[str, ...], ...]) -> str:
    return " | ".join(", ".join(names) for names in stages)


def prune(model: nn.Module, keep: Sequence[str]) -> None:
    """Remove from ``model`` every submodule that is neither one of ``keep`` (with all inside it) nor on the way
    to one: their registrations become None, so ``state_dict`` and ``parameters()`` skip them, and their
    tensors are freed once nothing else holds them."""

    def walk(module: nn.Module, prefix: str) -> None:
        for child, sub in list(module._modules.items()):
            if sub is None:
                continue
            path = f"{prefix}{child}"
            if path in keep:
                continue
            if any(k.startswith(path + ".") for k in keep):
                walk(sub, path + ".")
            else:
                module._modules[child] = None

    walk(model, "")


def chain(model: nn.Module, names: Sequence[str]) -> Any:
    """The stage's forward: its submodules one after the other, each given the previous one's output (a tuple
    spread into arguments), the first the stage's inputs."""
    modules = [model.get_submodule(n) for n in names]

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = modules[0](*args, **kwargs)
        for module in modules[1:]:
            out = module(*out) if isinstance(out, tuple) else module(out)
        return out

    return forward


def _whole(value: Any) -> Any:
    """A DTensor's whole tensor (a collective over its mesh), anything else as it is; in nested dicts too."""
    if hasattr(value, "full_tensor"):
        return value.full_tensor()
    if isinstance(value, dict):
        return type(value)((k, _whole(v)) for k, v in value.items())
    return value


def _union(values: list[Any]) -> Any:
    """Nested dicts merged, the first stage's value where several hold one key (alike: tied, or the same
    setting everywhere)."""
    if all(isinstance(v, Mapping) for v in values):
        keys: dict[Any, None] = {}
        for v in values:
            keys.update(dict.fromkeys(v))
        return {k: _union([v[k] for v in values if k in v]) for k in keys}
    return values[0]


class StageView:
    """The TrainState's view of the whole model while it holds one stage (``TrainState.view``)."""

    def __init__(self, state: TrainState, plan: Plan, stage: int, group: Any) -> None:
        self.state, self.plan, self.stage, self.group = state, plan, stage, group

    def agree(self, problem: Exception | None, who: str) -> None:
        """Raise ``problem`` here, or on a stage whose own part was fine, what another stage raised (a collective
        over the stages): a refusal on one stage is on all, before any writes."""
        every = gathered(None if problem is None else f"{type(problem).__name__}: {problem}", self.group)
        if problem is not None:
            raise problem
        refused = [(s, text) for s, text in enumerate(every) if text is not None]
        if refused:
            stage, text = refused[0]
            raise ValueError(
                f"{who}: pipeline stage {stage} refused its part of the checkpoint ({text}); so does this stage "
                f"({self.stage}), loading nothing: every stage resumes from it or none"
            )

    def _own_paths(self) -> dict[int, str]:
        found: dict[int, str] = {}
        for path, p in self.state.model.named_parameters(remove_duplicate=False):
            found.setdefault(id(p), path)
        return found

    def whole(self, here: dict[str, Any]) -> dict[str, Any]:
        """This stage's state dict made the whole model's: every stage's part, gathered (a collective over the
        stages; every process gets it, whole tensors)."""
        path_of = self._own_paths()
        flat = [p for g in self.state.optimizer.param_groups for p in g["params"]]
        optimizer = here["optimizer"]
        by_name = {self.plan.canonical[path_of[id(flat[i])]]: _whole(entry) for i, entry in optimizer["state"].items()}
        # the transforms' state by the unsplit model's names too (ct.ema's averages): a weight tied across stages is
        # its first name's on every stage, as in the unsplit model (where the other name is no parameter of its own)
        aliases = {path: self.plan.canonical[path] for path in path_of.values()}
        transforms = _renamed(_whole(here["transforms"]), {a: c for a, c in aliases.items() if a != c})
        mine = {"model": _whole(dict(here["model"])), "optimizer": by_name, "transforms": transforms}
        every = gathered(mine, self.group)
        model = _union([e["model"] for e in every])
        states = _union([e["optimizer"] for e in every])
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer["param_groups"]]
        order = [n for names in self.plan.groups for n in names]
        index = {n: i for i, n in enumerate(order)}
        groups = [{**h, "params": [index[n] for n in names]} for h, names in zip(hyper, self.plan.groups, strict=True)]
        whole = dict(here)
        whole["model"] = {k: model[k] for k in self.plan.paths if k in model}
        whole["optimizer"] = {"state": {index[n]: states[n] for n in order if n in states}, "param_groups": groups}
        whole["transforms"] = _union([e["transforms"] for e in every])
        return whole

    def own(self, whole: Mapping[str, Any]) -> dict[str, Any]:
        """This stage's part of the whole model's state dict (tensors laid out as this stage's: its shards
        under ``ct.sharded``)."""
        live = self.state.model.state_dict()
        mine = dict(whole)
        model = whole["model"]
        if isinstance(model, Mapping):
            mine["model"] = {k: _like(model[k], live[k]) if k in model else None for k in live}
            mine["model"] = {k: v for k, v in mine["model"].items() if v is not None}
        optimizer = whole["optimizer"]
        if isinstance(optimizer, Mapping) and isinstance(optimizer.get("param_groups"), list):
            order = [n for names in self.plan.groups for n in names]
            index = {n: i for i, n in enumerate(order)}
            path_of = self._own_paths()
            saved = optimizer.get("state", {})
            state: dict[int, Any] = {}
            groups: list[dict[str, Any]] = []
            i = 0
            for g, live_group in zip(optimizer["param_groups"], self.state.optimizer.param_groups, strict=False):
                own = []
                for p in live_group["params"]:
                    unsplit = index[self.plan.canonical[path_of[id(p)]]]
                    if isinstance(saved, Mapping) and unsplit in saved:
                        state[i] = {k: _like(v, p) for k, v in saved[unsplit].items()}
                    own.append(i)
                    i += 1
                groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": own})
            mine["optimizer"] = {"state": state, "param_groups": groups}
        transforms = whole["transforms"]
        if isinstance(transforms, Mapping):
            others = self.plan.paths - set(live)
            back = {self.plan.canonical[path]: path for path in self._own_paths().values()}
            transforms = _renamed(transforms, {c: a for c, a in back.items() if a != c})
            mine["transforms"] = _without(transforms, others, live)
        return mine


def _like(value: Any, like: Any) -> Any:
    """``value`` laid out as ``like``: a whole tensor distributed as a DTensor shard where ``like`` is one."""
    plain = isinstance(value, torch.Tensor) and not hasattr(value, "device_mesh")
    if plain and hasattr(like, "device_mesh") and value.shape == like.shape:
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(value.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return value


def _renamed(value: Any, names: Mapping[str, str]) -> Any:
    """Nested dicts with their keys in ``names`` renamed (a tied weight's name on one stage and in the unsplit
    model)."""
    if isinstance(value, Mapping):
        return {names.get(k, k) if isinstance(k, str) else k: _renamed(v, names) for k, v in value.items()}
    return value


def _without(value: Any, others: frozenset[str] | set[str], live: Mapping[str, Any]) -> Any:
    """Nested dicts without the keys that name another stage's parameters or buffers (``ct.ema``'s averages,
    by name); this stage's tensors laid out as its own."""
    if isinstance(value, Mapping):
        return {
            k: _without(_like(v, live[k]) if isinstance(k, str) and k in live else v, others, live)
            for k, v in value.items()
            if not (isinstance(k, str) and k in others)
        }
    return value


def tied_sum(model: nn.Module, plan: Plan, group: Any, shard: tuple[int, int]) -> None:
    """Add up the gradients of the weights tied across stages, over the stages (one all-reduce): each holder
    then steps the same tied weight alike. A stage that does not hold one adds zeros, shaped as a holder's
    piece: ``shard`` = (shards, this one) where ``ct.sharded`` cuts each parameter's first dimension."""
    from torch.distributed.tensor import DTensor

    tied = plan.tied()
    if not tied:
        return
    here = {plan.canonical[path]: p for path, p in model.named_parameters(remove_duplicate=False)}
    grads = []
    for name in tied:
        p = here.get(name)
        grads.append(None if p is None else p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)
    sample = next((p for p in model.parameters()), None)  # a stage may hold no parameter at all
    device = sample.device if sample is not None else torch.device("cpu")
    shards, index = shard
    pieces = []
    for g, name in zip(grads, tied, strict=True):
        if g is None:  # not held here (or no gradient): zeros of the piece's shape and the weight's dtype, on every
            # stage alike (a stage holding no parameter must not send another dtype: gloo aborts the process)
            chunks = torch.empty(plan.shapes[name], device="meta").chunk(shards)
            shape = chunks[index].shape if index < len(chunks) else (0, *plan.shapes[name][1:])
            g = torch.zeros(shape, dtype=plan.dtypes[name], device=device)
        pieces.append(g)
    flat = torch.cat([g.reshape(-1) for g in pieces])
    dist.all_reduce(flat, group=group)
    start = 0
    for g, name in zip(grads, tied, strict=True):
        size = pieces[tied.index(name)].numel()
        if g is not None:
            g.copy_(flat[start : start + size].view_as(g))
        start += size


class Parts:
    """``Context.model_parts`` of a pipeline: the stages' group, and what this stage counts in a norm."""

    def __init__(self, group: Any, plan: Plan, stage: int, model: nn.Module) -> None:
        self.group = group
        names = {id(p): plan.canonical[path] for path, p in model.named_parameters(remove_duplicate=False)}
        # a weight tied across stages counts once: on the first stage that holds it
        self._elsewhere = {i for i, n in names.items() if plan.holders[n][0] != stage}
        # the whole model's norm's dtype, as the plain loop's (torch stacks the per-tensor norms: promoted); a stage
        # whose part has no gradient (frozen, or no parameter) must send the others' dtype: gloo aborts on a mismatch
        floating = [d for d in plan.dtypes.values() if d.is_floating_point]
        self.dtype = functools.reduce(torch.promote_types, floating) if floating else torch.get_default_dtype()

    def counted(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t for t in tensors if id(t) not in self._elsewhere]

    def combined(self, norm: torch.Tensor, norm_type: float) -> torch.Tensor:
        """The norm over every stage's gradients, from each stage's own: their p-th powers added (the largest
        for the infinity norm), on every stage."""
        if norm_type == float("inf"):
            total = norm.to(self.dtype, copy=True)
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self.group)
            return total
        total = norm.to(self.dtype).pow(norm_type)
        dist.all_reduce(total, group=self.group)
        return total.pow(1.0 / norm_type)

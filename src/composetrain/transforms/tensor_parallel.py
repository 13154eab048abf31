"""tensor_parallel: split layers across the processes of a group, with a ``parallelize_module`` plan."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import TENSOR_PARALLEL, check_int, name, show
from composetrain.launch.agree import differing, largest
from composetrain.launch.rendezvous import group_world
from composetrain.transforms._mesh import MeshPlace, data_layout, mesh_for, mesh_with
from composetrain.transforms._shard_optimizer import only_initial_state, remake_initial_state

__all__ = ["tensor_parallel"]

Plan = Mapping[str, Any] | Callable[..., Any]
_WHOLE_ONLY = ("ColwiseParallel", "RowwiseParallel")  # torch's styles that split an nn.Linear or nn.Embedding only


@transform_factory
def tensor_parallel(plan: Plan, *, size: int) -> Transform:
    """Tensor parallel: each layer the plan names is split across ``size`` processes (Megatron's column and row
    split), through torch's ``parallelize_module``.

    The W processes form groups of ``size`` consecutive ranks (the innermost dimension of the mesh, as
    torchtitan lays it out: a group on one node); the ranks of a group read the same batch (rank r reads data
    shard ``r // size``; ``ct.run`` arranges it), each computes its pieces of the split layers, and the layers'
    collectives join them. Around it, ``ct.sharded`` shards each piece over the groups (TP inside a node, FSDP
    across: a ``(shard, tp)`` mesh; ``replicate=`` gives ``(replicate, shard, tp)``) and ``ct.distributed``
    all-reduces the pieces' gradients over them. The loss is normalised over the data-parallel processes only:
    a group's ranks see the same tokens, which count once (pitfall 44). ``clip_grad_norm``'s norm covers every
    piece of every layer once. Applied at the first update (after the model's replicas are made identical),
    the optimizer re-pointed at the split parameters by name; checkpoints hold DTensors, which load onto any
    other split (another ``size``, plain ``sharded``, one process) through DCP. With one process it is the plain
    step.

    Dropout in training mode is refused: torch draws a sharded activation's mask from each process's own
    generator, not as the unsplit layer would (its DTensor random-number tracker needs a CUDA device and covers
    DTensor operations only), so the update would not be the plain step's; use ``p=0`` (or ``model.eval()``
    for those modules). Random draws in the step itself are the same on a group's ranks (they share the data
    shard's seeds under ``ct.run``).

    Args:
        plan: what ``parallelize_module`` takes: submodule names (``fnmatch`` patterns per dotted part, such as
            ``"blocks.*.attn.q"``) mapped to ``ColwiseParallel()``, ``RowwiseParallel()``, ``SequenceParallel()``,
            ``PrepareModuleInput(...)``, ...; or a function ``plan(model, tp_mesh)`` that applies one itself
            (torchtitan's ``apply_tp``), which every rank must give alike (compared by qualified name). Every name
            must match a submodule (torch would skip it with a warning); a function must split something.
        size: T, the processes per tensor-parallel group; it must divide the world size.

    Returns:
        A transform: ``tensor_parallel(plan, size=2)(step) -> TrainStep``.

    Example:
        >>> plan = {f"blocks.*.{n}": ColwiseParallel() for n in ("q", "k", "v", "up")}
        >>> plan |= {"blocks.*.out": RowwiseParallel(), "blocks.*.down": RowwiseParallel()}
        >>> train = ct.sharded(ct.tensor_parallel(plan, size=2)(ct.clip_grad_norm(1.0)(step)), modules=Block)
        >>> ct.run(train, ct.TrainState(model, optimizer), dataset, batch_size=8)   # torchrun --nproc-per-node=4
    """
    if isinstance(plan, (TrainStep, Transform)):  # a function of two arguments may be a plan: see _apply
        refuse_step(plan, TENSOR_PARALLEL, "plan", 'tensor_parallel({"blocks.*.up": ColwiseParallel(), ...}, size=2)')
    size = check_int(size, TENSOR_PARALLEL, "size", example="tensor_parallel(plan, size=2)")
    shown = _checked_plan(plan)
    label = f"{TENSOR_PARALLEL}({shown}, size={size})"
    return Transform(label, lambda inner: _TensorParallel(inner, label, plan, size, shown))


def _checked_plan(plan: Any) -> str:
    """How the plan prints, once it is checked (when the transform is built)."""
    from torch.distributed.tensor.parallel import ParallelStyle

    example = 'e.g. {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}'
    if isinstance(plan, Mapping):
        if not plan:
            raise ValueError(f"{TENSOR_PARALLEL}: plan must name at least one submodule, got {{}}; {example}")
        for key, style in plan.items():
            if not isinstance(key, str):
                raise TypeError(f"{TENSOR_PARALLEL}: plan's keys must be submodule names, got {show(key)}; {example}")
            if not isinstance(style, ParallelStyle):
                raise TypeError(
                    f"{TENSOR_PARALLEL}: plan[{key!r}] must be a ParallelStyle (ColwiseParallel(), RowwiseParallel(), "
                    f"SequenceParallel(), ...), got {show(style)}; {example}"
                )
        return "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in plan.items()) + "}"
    if isinstance(plan, ParallelStyle):
        raise TypeError(
            f"{TENSOR_PARALLEL}: plan must map submodule names to styles, got the style {type(plan).__name__} alone; "
            f'name the submodule: {{"name": {type(plan).__name__}()}}'
        )
    if not callable(plan) or isinstance(plan, (nn.Module, type, Transform)):
        raise TypeError(
            f"{TENSOR_PARALLEL}: plan must map submodule names to ParallelStyles, or be a function plan(model, "
            f"tp_mesh) applying one, got {show(plan)}; {example}"
        )
    return name(plan)


def _style(style: Any) -> Any:
    """A style with its settings, comparable (its repr holds no addresses)."""
    return type(style).__name__, sorted((a, repr(b)) for a, b in vars(style).items())


def _described(plan: Plan) -> Any:
    """What every rank must agree on: the names and the styles with their settings (their reprs hold no
    addresses); a function by its qualified name."""
    if not isinstance(plan, Mapping):
        return f"{getattr(plan, '__module__', '')}.{getattr(plan, '__qualname__', name(plan))}"
    return sorted((k, *_style(v)) for k, v in plan.items())


class _Split(RuntimeState):
    """Whether the state's model is split, and whether its first forward since has run (never checkpointed)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.first_pass = True


class _TensorParallel(TrainStep):
    role = "tensor_parallel"
    syncs_processes = True
    forward_needs_every_rank = True  # each forward joins the group's pieces
    refuses_inside = refused_inside(role)

    def __init__(self, inner: TrainStep, label: str, plan: Plan, size: int, shown: str) -> None:
        self.label, self.plan, self.size, self.shown = label, plan, size, shown
        self.data_ranks = (1, size)
        super().__init__(inner)

    def _place(self, state: TrainState) -> MeshPlace:
        found = mesh_with(state, "tp", self.size)  # laid out by a data-parallel transform outside
        if found is not None:
            return found
        world, _ = group_world(None, self)
        return mesh_for(state, lambda: self._layout(world), self)

    def _layout(self, world: int) -> tuple[tuple[str, int], ...]:
        layout = data_layout(world, (("dp", None),), (1, self.size), self)
        if dict(layout)["dp"] > 1:
            raise ValueError(
                f"{self!r}: {world} processes make {world // self.size} tensor-parallel groups of {self.size}, each "
                "reading its own data, but nothing synchronises the groups: wrap it in a data-parallel transform, "
                "sharded(tensor_parallel(...)(step)) or distributed(tensor_parallel(...)(step)), or run "
                f"{self.size} processes"
            )
        return layout

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        world, _ = group_world(None, self)
        if world == 1 or self.size == 1:  # what does not apply is a no-op
            return self._inner().prepare(state, batch, ctx)
        place = self._place(state)
        self.split_model(state)
        _refuse_dropout(state.model, self)
        if ctx.agree is None:  # alone: a refusal on one rank of the group is on all
            ctx = ctx._replace(agree=functools.partial(largest, group=place.world_group))
        return self._inner().prepare(state, batch, ctx)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        split = state.transform_state(self.role, _Split)
        if split.model is None or not split.first_pass:
            return self._inner().grads(state, batch, ctx)
        try:
            done = self._inner().grads(state, batch, ctx)
        except RuntimeError as e:  # torch's shape errors: said again with what most likely caused them
            raise RuntimeError(
                f"{self!r}: the first forward since the plan split the model failed ({e}); a layer the plan leaves "
                "whole that receives a split activation fails so: pair each ColwiseParallel with the RowwiseParallel "
                "that joins its output (or give it use_local_output=False and a PrepareModuleInput)"
            ) from e
        split.first_pass = False
        return done

    def setup(self, state: TrainState) -> None:
        """Split before a checkpoint is resumed: its DTensors load straight into the pieces."""
        world, _ = group_world(None, self)
        if world > 1 and self.size > 1:
            self._place(state)
            self.split_model(state)
        super().setup(state)

    def split_model(self, state: TrainState) -> None:
        """Apply the plan to the state's model over its tensor-parallel group, once; re-point the optimizer."""
        super().split_model(state)
        world, _ = group_world(None, self)
        split = state.transform_state(self.role, _Split)
        if world == 1 or self.size == 1 or split.model is state.model:
            return
        place = self._place(state)
        model = state.model
        problem, initial = None, False
        try:  # every check on every rank first; then the ranks agree, and only then is anything changed
            initial = only_initial_state(self, state.optimizer)  # raises if it holds state training made
            _refuse_dropout(model, self)
            if isinstance(self.plan, Mapping):
                _check_names(model, self.plan, self)
                _check_ties(model, self.plan, self)
        except Exception as e:
            problem = e
        every = differing((type(problem).__name__ if problem else None, _described(self.plan), self.size))
        if problem is not None:
            raise problem
        if every is not None:
            rank, other = next((r, p) for r, p in enumerate(every) if p != every[0])
            why = (
                f"rank {rank} refused its model (see its error)"
                if other[0]
                else f"rank 0 {every[0][1:]}, rank {rank} {other[1:]}"
            )
            raise ValueError(
                f"{self!r}: the ranks disagree on the plan: {why}; build the same tensor_parallel(plan, size=) on "
                "every rank"
            )
        _apply(model, self.plan, place, state)
        if initial:  # the state the optimizer's __init__ made (Adagrad's sums), made again for the pieces
            remake_initial_state(state.optimizer)
        split.model, split.first_pass = model, True

    def _config(self) -> tuple[Any, ...]:
        return (self.shown, id(self.plan), self.size)


def _check_names(model: nn.Module, plan: Mapping[str, Any], who: object) -> None:
    """Every key of the plan matches a submodule, no submodule is matched by two keys with different styles, and
    torch's Linear-only styles meet Linears or Embeddings."""
    seen: dict[str, tuple[str, Any]] = {}
    for key, style in plan.items():
        found = _resolved(model, key)
        for n, _ in found:
            if n in seen and _style(seen[n][1]) != _style(style):
                raise ValueError(
                    f"{who!r}: plan[{seen[n][0]!r}] ({type(seen[n][1]).__name__}) and plan[{key!r}] "
                    f"({type(style).__name__}) both match {n!r}; a submodule is split one way: only one would apply "
                    "(the later), the other silently dropped. Narrow the patterns so that each submodule meets one "
                    "style"
                )
            seen[n] = (key, style)
        if not found:
            close = [n for n, _ in model.named_modules() if n and n.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
            raise ValueError(
                f"{who!r}: plan names {key!r}, which matches no submodule of the model ({type(model).__name__}); "
                f"parallelize_module would skip it with a warning and train that layer whole. Names ending alike: "
                f"{close[:6]}; the names are model.named_modules()'s, parts may be fnmatch patterns ('blocks.*.up')"
            )
        kind = type(style).__name__
        if kind in _WHOLE_ONLY:
            wrong = [n for n, m in found if not isinstance(m, (nn.Linear, nn.Embedding))]
            if wrong:
                raise ValueError(
                    f"{who!r}: plan[{key!r}] is {kind}, which splits an nn.Linear or nn.Embedding only, but matches "
                    f"{[(n, type(m).__name__) for n, m in found if n in wrong][:4]}; name the Linear layers inside it"
                )


_LEAVES_PARAMETERS = ("PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput")


def _tied(model: nn.Module) -> list[list[str]]:
    """The paths of each parameter the model holds under several names (an embedding tied to the output layer)."""
    paths: dict[int, list[str]] = {}
    for path, p in model.named_parameters(remove_duplicate=False):
        paths.setdefault(id(p), []).append(path)
    return [found for found in paths.values() if len(found) > 1]


def _check_ties(model: nn.Module, plan: Mapping[str, Any], who: object) -> None:
    """No style of the plan distributes a parameter the model also holds under another name: parallelize_module
    gives the split module a DTensor copy of it, the other holder keeps the plain tensor, and the tie breaks
    without a word (each trains apart, or not at all: the update would not be the plain step's)."""
    tied = {path: paths for paths in _tied(model) for path in paths}
    if not tied:
        return
    for key, style in plan.items():
        if type(style).__name__ in _LEAVES_PARAMETERS:
            continue
        for where, module in _resolved(model, key):
            for local, _ in module.named_parameters():
                path = f"{where}.{local}"
                if path in tied:
                    others = [q for q in tied[path] if q != path]
                    raise ValueError(
                        f"{who!r}: plan[{key!r}] ({type(style).__name__}) splits {path!r}, the same Parameter as "
                        f"{others[:4]} (tied weights); parallelize_module would give {where!r} a split copy and leave "
                        "the other holder the whole tensor, so the tie would break silently and the update would not "
                        "be the plain step's: leave the tied modules out of the plan, or untie them in the model"
                    )


def _resolved(model: nn.Module, key: str) -> list[tuple[str, nn.Module]]:
    """The submodules ``key`` names, matched as ``parallelize_module`` does: each dotted part an ``fnmatch``
    pattern over the children."""
    level = [("", model)]
    for token in key.split("."):
        level = [
            (f"{prefix}.{child}" if prefix else child, module)
            for prefix, parent in level
            for child, module in parent.named_children()
            if fnmatch.fnmatch(child, token)
        ]
    return level


def _refuse_dropout(model: nn.Module, who: object) -> None:
    active = [
        n for n, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]
    if active:
        raise ValueError(
            f"{who!r}: the model has dropout in training mode ({active[:4]}); under tensor parallelism each process "
            "draws a split activation's mask from its own generator, not as the unsplit layer would (torch's DTensor "
            "random-number tracker needs a CUDA device and covers DTensor operations only), so the update would not "
            "be the plain step's: set their p=0, or put those modules in eval mode"
        )


def _apply(model: nn.Module, plan: Plan, place: MeshPlace, state: TrainState) -> None:
    """The group's ranks start from the same weights (its first rank's), then the plan splits the layers; the
    optimizer (and the list of parameters it does not hold) is re-pointed at the split parameters by name."""
    from torch.distributed.tensor.parallel import parallelize_module

    group = place.group("tp")
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    ties = _tied(model)
    held = [p for g in state.optimizer.param_groups for p in g["params"]]
    foreign = [i for i, p in enumerate(held) if id(p) not in names]
    if foreign:
        raise ValueError(
            f"tensor_parallel: the optimizer holds {len(foreign)} parameter(s) that are not the model's (positions "
            f"{foreign[:8]}); the split re-points the optimizer by name: build it over model.parameters()"
        )
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
    tp_mesh = place.sub(("tp",))
    if isinstance(plan, Mapping):  # each pattern as the names it matches: torch warns at every branch one misses
        parallelize_module(model, tp_mesh, {n: style for key, style in plan.items() for n, _ in _resolved(model, key)})
    else:
        try:
            plan(model, tp_mesh)
        except Exception as e:
            raise RuntimeError(
                f"tensor_parallel: the plan {name(plan)} raised {type(e).__name__}: {e}; a plan given as a function "
                "is called as plan(model, tp_mesh) and applies parallelize_module(model, tp_mesh, {...}) itself"
            ) from e
        if not any(hasattr(p, "device_mesh") for p in model.parameters()):
            raise ValueError(
                f"tensor_parallel: the plan {name(plan)} split no parameter; a plan given as a function is called as "
                "plan(model, tp_mesh) and must apply parallelize_module(model, tp_mesh, {...}) (a step given as the "
                "plan does not)"
            )
    now = dict(model.named_parameters(remove_duplicate=False))
    broken = [paths for paths in ties if len({id(now[q]) for q in paths}) > 1]
    if broken:  # a plan given as a function (a mapping is checked before): the model is split, and stays unusable
        state.unusable = (
            f"tensor_parallel: the plan {name(plan)} broke the tie of {broken[0]} (one Parameter before, "
            "a split copy and a whole one after); build a fresh TrainState"
        )
        raise ValueError(
            f"tensor_parallel: the plan {name(plan)} split {broken[0]}, which were one Parameter (tied weights), into "
            "a split copy and a whole one: the tie broke, and the update would not be the plain step's. Leave the "
            "tied modules out of the plan (or untie them in the model), and build a fresh TrainState: this one's "
            "model is split"
        )
    for g in state.optimizer.param_groups:
        g["params"] = [now[names[id(p)]] for p in g["params"]]
    state._unheld = [now[names[id(p)]] for p in state._unheld]

"""The device mesh of a composition that splits the model across processes or shards it in two dimensions (internal).

``ct.sharded(replicate=R)`` (HSDP), ``ct.tensor_parallel(size=T)`` and ``ct.pipeline(stages)`` lay the W processes
out on one ``DeviceMesh`` whose dimensions are, outermost first, ``pp`` (pipeline stages: they may sit on different
nodes), the data-parallel ones (``replicate`` and ``shard`` under ``sharded``, ``dp`` under ``distributed``) and
``tp`` (a tensor-parallel group: consecutive ranks, on one node), as torchtitan lays out its mesh. So rank r is
stage ``r // (W / P)``, reads data shard ``(r // T) % D`` of the D shards, and holds tensor-parallel piece
``r % T``; ``Capabilities.data_shard`` says the same to the driver.

The mesh is built once per TrainState (it is bound to the model that was split or sharded over it), by the
outermost transform of the composition that needs one: the data-parallel transform, which knows the whole layout
(its inner steps' ``data_ranks`` give the pipeline and tensor-parallel sizes), else the tensor-parallel or pipeline
transform alone. Inner transforms find their dimension in it by name. Every group of the mesh is made here with
the timeout of the job's own process group: ``init_device_mesh`` would give its sub-groups torch's default of 30
minutes, and gloo's send and receive honour only the timeout a group was made with.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from composetrain.core.state import RuntimeState, TrainState

__all__ = ["KEY", "MeshPlace", "agreed_layout", "average_gradients", "data_layout", "mesh_for", "mesh_with"]

KEY = "mesh"  # its state in TrainState.transform_state (a RuntimeState: never checkpointed)
ORDER = ("pp", "replicate", "shard", "dp", "tp")  # outermost first
DATA = ("replicate", "shard", "dp")  # the dimensions that split the data


@dataclasses.dataclass(frozen=True)
class MeshPlace:
    """This process's place on the mesh: the mesh, its layout, and the groups the transforms use.

    Attributes:
        mesh: the ``DeviceMesh`` (dimension names as in ``layout``).
        layout: ``((name, size), ...)``, outermost first.
        data_group: the processes that hold the same part of the model and read different data (every data
            dimension at once): what a data-parallel transform reduces over.
        data_index: which data shard this process reads, of ``data_size``.
        world_group: the job's group the mesh spans.
    """

    mesh: Any
    layout: tuple[tuple[str, int], ...]
    data_group: Any
    data_index: int
    data_size: int
    world_group: Any

    def size(self, name: str) -> int:
        return dict(self.layout).get(name, 1)

    def group(self, name: str) -> Any:
        return self.mesh.get_group(name)

    def coordinate(self, name: str) -> int:
        names = [n for n, _ in self.layout]
        return int(self.mesh.get_coordinate()[names.index(name)])

    def sub(self, names: tuple[str, ...]) -> Any:
        """The sub-mesh of ``names`` that holds this process (a 1-D or 2-D mesh)."""
        return self.mesh[names[0]] if len(names) == 1 else self.mesh[names]


class _Meshes(RuntimeState):
    """The mesh a TrainState's model was laid out on (rebuilt never: the model is bound to it)."""

    def __init__(self) -> None:
        self.place: MeshPlace | None = None
        self.released = False
        self.agreed = False  # the ranks compared their layouts (agreed_layout), once

    def release(self) -> None:
        # the process group is about to be destroyed: a model laid out on it cannot move to another one
        self.released = self.place is not None


def data_layout(
    world: int, data: tuple[tuple[str, int | None], ...], split: tuple[int, int], who: object
) -> tuple[tuple[str, int], ...]:
    """The mesh layout of ``world`` processes: the pipeline stages and tensor-parallel groups of ``split`` =
    ``(P, T)`` and the data dimensions ``data`` (sizes, one None: what the others leave). Raises, naming every
    number and the choices that divide, when they do not divide ``world``."""
    stages, tp = split
    given = math.prod(size for _, size in data if size is not None)
    fixed = stages * tp * given
    if world % fixed != 0:
        parts = [f"{name}={size}" for name, size in (("pp", stages), *data, ("tp", tp)) if size not in (None, 1)]
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        raise ValueError(
            f"{who!r}: {' x '.join(parts) or '1'} = {fixed} does not divide the {world} processes of the job; "
            f"each size must divide W={world} and their product too (divisors of {world}: {divisors})"
        )
    rest = world // fixed
    sizes = {name: (rest if size is None else size) for name, size in data}
    sizes.update(pp=stages, tp=tp)
    return tuple((name, sizes[name]) for name in ORDER if name in sizes and (sizes[name] > 1 or name in dict(data)))


Layout = tuple[tuple[str, int], ...]


def agreed_layout(state: TrainState, layout_of: Callable[[], Layout | None], who: object, group: Any = None) -> Any:
    """``layout_of()`` (a layout, or None for a data-parallel transform with nothing split inside), the first time
    for ``state`` compared over the job's processes (one tiny all-reduce): ranks that build different layouts
    (another ``replicate=``, ``tensor_parallel`` size or number of stages) would make different groups and
    collectives, which hangs or aborts the job; they are refused on every rank, as a layout one rank refuses
    (a size that does not divide) is, before any group is made."""
    from composetrain.launch.agree import differing

    held = state.transform_state(KEY, _Meshes)
    if held.agreed:
        return layout_of()
    problem: Exception | None = None
    layout: Layout | None = None
    try:
        layout = layout_of()
    except ValueError as e:
        problem = e
    every = differing((type(problem).__name__ if problem else None, layout), group)
    if problem is not None:
        raise problem
    if every is not None:
        shown = [
            f"rank {r}: " + ("refused it (see its error)" if p else "no mesh" if lay is None else _shown(lay))
            for r, (p, lay) in enumerate(every)
        ]
        raise ValueError(
            f"{who!r}: the ranks lay out the job differently ({'; '.join(shown)}); every rank must build the same "
            "composition (the same sharded(replicate=), tensor_parallel(size=) and pipeline(stages)), or they "
            "would make different groups and wait on each other for ever"
        )
    held.agreed = True
    return layout


def mesh_for(state: TrainState, layout_of: Callable[[], Layout | None], who: object, group: Any = None) -> MeshPlace:
    """The mesh of the layout ``layout_of()`` gives for ``state``'s model: the one it was laid out on, or a new one
    (a collective: every process builds it alike, after the ranks agree on the layout). A model already laid out
    on another mesh is refused."""
    held = state.transform_state(KEY, _Meshes)
    if held.released:
        raise RuntimeError(
            f"{who!r}: the TrainState's model was laid out on a device mesh whose process group was released "
            "(TrainState.release_runtime, which ct.run calls when the process exits); a model split or sharded "
            "over a mesh cannot move to a new one: build a fresh TrainState and load a checkpoint into it"
        )
    layout = agreed_layout(state, layout_of, who, group)
    assert layout is not None  # called by the transforms that lay out a mesh only
    if held.place is not None:
        if held.place.layout != layout:
            raise RuntimeError(
                f"{who!r}: the TrainState's model is laid out on the mesh {_shown(held.place.layout)}, not "
                f"{_shown(layout)}; a model split or sharded over a mesh stays there: build a fresh TrainState "
                "(and load a checkpoint into it) to train on another mesh shape"
            )
        return held.place
    held.place = _build(layout, group)
    return held.place


def mesh_with(state: TrainState, name: str, size: int) -> MeshPlace | None:
    """The mesh ``state``'s model is laid out on, if it has dimension ``name`` of ``size``, else None."""
    held = state.transform_state(KEY, _Meshes)
    place = held.place
    if place is None or held.released or dict(place.layout).get(name) != size:
        return None
    return place


def _shown(layout: tuple[tuple[str, int], ...]) -> str:
    return "(" + ", ".join(f"{name}={size}" for name, size in layout) + ")"


def _build(layout: tuple[tuple[str, int], ...], group: Any) -> MeshPlace:
    from torch.distributed.device_mesh import DeviceMesh

    world_group: Any = group if group is not None else dist.group.WORLD
    names = tuple(name for name, _ in layout)
    shape = tuple(size for _, size in layout)
    world = dist.get_world_size(world_group)
    ranks = torch.tensor([dist.get_global_rank(world_group, i) for i in range(world)]).reshape(shape)
    me = dist.get_rank()
    timeout = _timeout(world_group)
    groups = []
    for d in range(len(shape)):
        groups.append(_groups_along(ranks, (d,), me, timeout))
    data = tuple(d for d, name in enumerate(names) if name in DATA)
    data_group = groups[data[0]] if len(data) == 1 else _groups_along(ranks, data, me, timeout)
    device = "cuda" if dist.get_backend(world_group) == "nccl" else "cpu"
    if len(shape) == 1:
        mesh = DeviceMesh.from_group(groups[0], device, mesh_dim_names=names)
    else:
        mesh = DeviceMesh.from_group(groups, device, mesh=ranks, mesh_dim_names=names)
    where = mesh.get_coordinate()
    assert where is not None  # every process of the job is on its mesh
    index, size = 0, 1
    for d in data:
        index, size = index * shape[d] + int(where[d]), size * shape[d]
    return MeshPlace(mesh, layout, data_group, index, size, world_group)


def _groups_along(ranks: torch.Tensor, dims: tuple[int, ...], me: int, timeout: datetime.timedelta | None) -> Any:
    """Every group of the processes that differ only along ``dims`` (made on every process, in one order, as
    ``new_group`` requires), with ``timeout``; returns this process's."""
    rest = [d for d in range(ranks.dim()) if d not in dims]
    rows = ranks.permute(*rest, *dims).reshape(-1, math.prod(ranks.shape[d] for d in dims))
    mine = None
    for row in rows.tolist():
        made = dist.new_group(row, timeout=timeout) if timeout is not None else dist.new_group(row)
        if me in row:
            mine = made
    return mine


def _timeout(group: Any) -> datetime.timedelta | None:
    """The timeout ``group`` was made with (torch has no public getter: its backend's options), or None."""
    for device in ("cpu", "cuda"):
        try:
            value = group._get_backend(torch.device(device)).options._timeout
        except Exception:
            continue
        if isinstance(value, datetime.timedelta):
            return value
    return None


def average_gradients(state: TrainState, group: Any, size: int) -> None:
    """Average the gradients of ``state``'s parameters (DTensor pieces: their local tensors) over ``group``: one
    all-reduce per dtype and device, of their concatenation. A gradient None on this process stays None (every
    process of a part's group holds the same parameters, and gets gradients for the same ones)."""
    from torch.distributed.tensor import DTensor

    held = (p for g in state.optimizer.param_groups for p in g["params"])
    params = list({id(p): p for p in (*state.model.parameters(), *held)}.values())
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params if p.grad is not None]
    kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for g in grads:
        kinds.setdefault((g.dtype, g.device), []).append(g)
    for same in kinds.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, group=group)
        flat /= size
        start = 0
        for g in same:
            g.copy_(flat[start : start + g.numel()].view_as(g))
            start += g.numel()

"""sharded: fully sharded data parallel on torch's FSDP2 (``torch.distributed.fsdp.fully_shard``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from composetrain.core.batching import samples
from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import PlainStep, Transform, transform_factory
from composetrain.core.util import SHARDED, check_bool, check_int, show
from composetrain.launch.agree import differing, gathered_numbers, largest
from composetrain.launch.rendezvous import group_world
from composetrain.transforms._deferred_sync import LastSync, grads_telling_the_others
from composetrain.transforms._mesh import MeshPlace, agreed_layout, data_layout, mesh_for
from composetrain.transforms._shard_optimizer import only_initial_state, remake_initial_state
from composetrain.transforms._shard_units import Units, check_units_argument, describe_units, select_units

__all__ = ["apply_sharding", "sharded"]


@transform_factory
def sharded(
    step: PlainStep | TrainStep | None = None,
    *,
    modules: Units = None,
    reshard_after_forward: bool = True,
    sync_every_micro_batch: bool = False,
    process_group: Any = None,
    replicate: int | None = None,
) -> Any:
    """Fully sharded data parallel over ``torch.distributed`` processes, on FSDP2.

    Parameters, gradients and optimizer state are split across the ranks (each holds
    about 1/W of them); each sharding unit gathers its parameters for its forward and
    backward and frees them after, and gradients are reduce-scattered. At the first
    update, ``fully_shard`` is applied to each unit chosen by ``modules``, then to the
    root; the optimizer the TrainState was built with is re-pointed at the sharded
    parameters by name. As with ``distributed``, the loss is normalised over the units
    of the global batch (one small all-reduce per update), so W ranks with batches B/W
    make exactly the update of one process on B, and with one process (or no process
    group) it is the plain step.

    0-dim parameters (CLIP's ``logit_scale``), which FSDP2 cannot shard, stay whole on every rank
    (``fully_shard(..., ignored_params=...)``), their gradients averaged in one all-reduce after the
    update's last backward. An optimizer holding only the state its ``__init__`` makes (Adagrad) gets
    that state made again for the sharded parameters; any other state is refused.

    HSDP: with ``replicate=R`` the W processes form a 2-D mesh of R replicas x W/R shards (consecutive ranks
    share a replica: keep a replica's shards on one node); parameters are sharded within a replica and
    gradients are reduce-scattered there, then all-reduced across the replicas (FSDP2 over the
    ``(replicate, shard)`` mesh). ``replicate=W`` replicates whole (DDP-like), ``replicate=1`` is plain FSDP.
    Around ``ct.tensor_parallel`` (TP inside a node, FSDP across) or ``ct.pipeline`` it shards each process's
    part of the model over the processes holding the same part (torchtitan's 2-D layout); the loss is
    normalised over the data-parallel processes only, whose batches differ.

    Under ``accumulate``, gradients are reduced once per update by default: earlier
    micro-batches keep the unsharded gradients on every rank (full-gradient memory)
    and the last backward reduce-scatters their sum. ``sync_every_micro_batch=True``
    reduce-scatters after every micro-batch instead: less memory, n times the
    communication.

    Args:
        step: the step to wrap; omit it to get a transform.
        modules: the sharding units besides the root: submodule names, nn.Module classes,
            or a predicate ``fn(module) -> bool``; default: the blocks of every
            ``nn.ModuleList`` (a transformer's layers). Fewer units gather more at once.
        reshard_after_forward: free gathered parameters after each unit's forward (and
            gather them again in backward): less memory, more communication.
        sync_every_micro_batch: reduce-scatter after every backward, not only the last.
        process_group: the group to shard over (default: the whole job; only with neither ``replicate`` nor
            a model split inside, which lay out the whole job).
        replicate: HSDP's number of replicas R (it must divide the world size W, checked at the first update
            with the sizes that do); None: one replica, a 1-D mesh.

    Returns:
        The wrapped TrainStep, or a transform when ``step`` is omitted.

    Example:
        >>> train = ct.sharded(ct.clip_grad_norm(1.0)(ct.accumulate(4)(step)), modules=Block)
        >>> ct.run(train, ct.TrainState(model, optimizer), dataset, batch_size=8)   # under torchrun
        >>> hsdp = ct.sharded(ct.ema(0.999)(step), modules=Block, replicate=2)    # 2 nodes x 8 GPUs: shard per node
    """
    if isinstance(step, (type, str, list, tuple)):  # sharded(Block): the units, in the step's place
        raise TypeError(
            f"{SHARDED}: step must be a function step(model, batch), got {show(step)}; pass the sharding units by "
            f"keyword: sharded(modules={step.__name__ if isinstance(step, type) else repr(step)})"
        )
    units = check_units_argument(modules)
    if replicate is not None:
        replicate = check_int(replicate, SHARDED, "replicate", example="sharded(replicate=2): 2 replicas of W/2 shards")
        if process_group is not None:
            raise ValueError(
                f"{SHARDED}: replicate={replicate} lays out the whole job as a 2-D mesh; it cannot shard over "
                "process_group as well: leave process_group=None"
            )
    for arg, value in (
        ("reshard_after_forward", reshard_after_forward),
        ("sync_every_micro_batch", sync_every_micro_batch),
    ):
        check_bool(value, SHARDED, arg)
    shown = [f"modules={describe_units(units)}"] if units is not None else []
    shown += ["reshard_after_forward=False"] if not reshard_after_forward else []
    shown += ["sync_every_micro_batch=True"] if sync_every_micro_batch else []
    shown += [f"replicate={replicate}"] if replicate is not None else []
    label = f"{SHARDED}({', '.join(shown)})" if shown else SHARDED
    options = (units, reshard_after_forward, sync_every_micro_batch, replicate)
    transform = Transform(label, lambda inner: _Sharded(inner, label, options, process_group))
    return transform if step is None else transform(step)


class _Sharding(RuntimeState):
    """Which process group the state's model is sharded over (the sharded model itself is the state's)."""

    def __init__(self) -> None:
        self.group: Any = None
        self.model: nn.Module | None = None
        self.replicated: list[nn.Parameter] = []  # 0-dim parameters, left whole on every rank (see shard)

    def release(self) -> None:
        # Called just before the process group is destroyed (for a group ct.run created: when the process
        # exits, since the trained model needs it to gather until then). The sharded model stays the
        # state's (its local shards readable), but it must stop holding the group: FSDP2 keeps it
        # in each unit's mesh info and in the mesh's registry, so the group, its gloo threads and
        # its store would outlive destroy_process_group into the interpreter's exit, which a gloo
        # thread freeing its last work can abort. A sharded model cannot move to another group,
        # so the next step refuses it (see shard) rather than rebuilding.
        if self.model is not None:
            _let_go_of_group(self.model)
        self.group, self.model = None, None


class _Sharded(TrainStep):
    role = "sharded"
    syncs_processes = True
    forward_needs_every_rank = True  # each forward gathers the parameters from every rank
    refuses_inside = refused_inside(role)

    def __init__(self, inner: TrainStep, label: str, options: tuple[Any, ...], group: Any) -> None:
        self.label = label
        self.units, self.reshard_after_forward, self.sync_every, self.replicate = options
        self.group = group
        super().__init__(inner)
        # a mesh: two data dimensions (HSDP), or a model split inside (tensor_parallel, pipeline)
        self.meshed = self.replicate is not None or inner.capabilities.data_ranks != (1, 1)
        if self.meshed and group is not None:
            raise ValueError(
                f"{self!r}: the step inside splits its model across processes, which lays out the whole job as "
                "one mesh: leave process_group=None"
            )

    def place(self, state: TrainState) -> MeshPlace | None:
        """The mesh this rank's model is sharded over (built once, a collective), or None for a 1-D group."""
        if not self.meshed:
            return None
        world, _ = group_world(None, self)
        return mesh_for(state, lambda: self._layout(world), self)

    def _layout(self, world: int) -> tuple[tuple[str, int], ...] | None:
        if not self.meshed:
            return None
        data = (("replicate", self.replicate), ("shard", None)) if self.replicate is not None else (("shard", None),)
        return data_layout(world, data, self._inner().capabilities.data_ranks, self)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        world, device = group_world(self.group, self)
        if world == 1:  # what does not apply is a no-op
            return self._inner().prepare(state, batch, ctx)
        agreed_layout(state, lambda: self._layout(world), self, self.group)  # once: before any other collective
        place = self.place(state)
        group = place.data_group if place is not None else self.group  # the processes whose batches differ
        world = place.data_size if place is not None else world
        # the global unit count, so that every rank normalises by the same total (FSDP2 averages the
        # gradients over ranks, hence the total per rank), and every rank's sample count, in one collective
        mine = torch.tensor([float(ctx.total_weight), float(samples(batch, self))], dtype=torch.float64, device=device)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        counts = torch.stack(every).cpu()
        sizes = [int(c) for c in counts[:, 1].tolist()]
        if len(set(sizes)) > 1:  # raised on every rank alike, before any collective of the passes
            raise ValueError(
                f"{self!r}: the ranks' batches hold {sizes} samples; under sharded every rank must run the same "
                "forward and backward passes (each gathers the parameters from all ranks), so give every rank "
                "as many samples (ct.run's DistributedSampler does; with a DataLoader of your own, drop_last=True); "
                "token counts may differ: they are normalised globally"
            )
        per_rank = float(counts[:, 0].sum()) / world
        shard(self, state)  # before the passes: the inner steps see the sharded model
        ctx = self._inner().prepare(state, batch, ctx._replace(total_weight=per_rank))
        model, every = state.model, self.sync_every
        replicated = state.transform_state(self.role, _Sharding).replicated
        if ctx.scale_loss and replicated:  # before any pass; the model is sharded, and stays usable
            whole = sorted(n for n, p in model.named_parameters() if any(p is r for r in replicated))
            raise ValueError(
                f"{self!r}: fp16 loss scaling with the 0-dim parameters {whole}, which stay whole beside FSDP2's "
                "DTensors: torch's GradScaler.unscale_ takes every gradient for a DTensor then, and fails; use "
                "mixed_precision(dtype='bf16'), or give those parameters shape (1,)"
            )

        last = LastSync()  # this update's: an error after the last reduce-scatter is told to the other ranks

        def sync_unless_more_follow(c: Context) -> contextlib.AbstractContextManager[Any]:
            sync = _gradient_sync(model, every or c.last_backward, replicated if c.last_backward else [], group, world)
            return last.around(sync) if c.last_backward else sync

        # a refusal on one rank is on all, a decision every rank takes alike: the whole job's, also the processes
        # holding other parts of the model
        whole = place.world_group if place is not None else self.group
        agree = functools.partial(largest, group=whole)
        gather = functools.partial(gathered_numbers, group=whole)
        return ctx._replace(
            around_pass=(*ctx.around_pass, sync_unless_more_follow),
            agree=agree,
            gather=gather,
            notes={**ctx.notes, self.role: last},
        )

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        return grads_telling_the_others(self._inner(), self.role, state, batch, ctx)

    def setup(self, state: TrainState) -> None:
        """Shard the model before a checkpoint is resumed: its sharded tensors load straight into the shards."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            world = dist.get_world_size(self.group)
            agreed_layout(state, lambda: self._layout(world), self, self.group)
            shard(self, state)
        super().setup(state)

    def _config(self) -> tuple[Any, ...]:
        return (self.units, self.reshard_after_forward, self.sync_every, self.group, self.replicate)


@contextlib.contextmanager
def _gradient_sync(
    model: nn.Module, on: bool, replicated: list[nn.Parameter], group: Any, world: int
) -> Iterator[None]:
    # FSDP2's no_sync: set for the pass's forward and backward; back on afterwards, also on an error
    model.set_requires_gradient_sync(on)  # type: ignore[operator]
    try:
        yield
    finally:
        if not on:
            model.set_requires_gradient_sync(True)  # type: ignore[operator]
    if replicated:  # after the update's last backward only (not after a pass that raised)
        _average_gradients(replicated, group, world)


def _average_gradients(params: list[nn.Parameter], group: Any, world: int) -> None:
    """Average the gradients of the parameters FSDP2 ignores (0-dim ones) over the ranks, as FSDP2 averages
    the others', in one all-reduce: the sum of what every backward of the update added, once. A gradient
    that is None on some ranks counts as zero there; None on every rank stays None (the optimizer skips it)."""
    live = [p for p in params if p.requires_grad]
    if not live:
        return
    # summed in float64, or complex128 when one is complex (float64 would drop its imaginary part)
    wide = torch.complex128 if any(p.is_complex() for p in live) else torch.float64
    zero = torch.zeros((), dtype=wide, device=live[0].device)
    values = [zero if p.grad is None else p.grad.detach().to(wide).reshape(()) for p in live]
    present = [zero + (p.grad is not None) for p in live]
    summed = torch.stack(values + present)
    dist.all_reduce(summed, group=group)
    for p, total, count in zip(live, summed[: len(live)], summed[len(live) :], strict=True):
        p.grad = ((total if p.is_complex() else total.real) / world).to(p.dtype) if count.real > 0 else None


def apply_sharding(train_step: TrainStep, state: TrainState) -> bool:
    """Shard ``state``'s model now, as the first update of ``train_step`` would (and split it, under
    ``ct.tensor_parallel`` or ``ct.pipeline``); False if it has none of them or only one process runs.
    ``ct.run`` does the same (``TrainStep.setup``) before resuming a checkpoint, whose sharded tensors then
    load straight into the shards, and a pipeline's whole state into this process's stage."""
    if train_step.capabilities.data_ranks != (1, 1) and dist.is_available() and dist.is_initialized():
        if dist.get_world_size() == 1:
            return False
        train_step.setup(state)  # the data-parallel transform outside lays out the mesh, then splits, then shards
        return True
    step: TrainStep | None = train_step
    while step is not None and not isinstance(step, _Sharded):
        step = step.inner
    if step is None:
        return False
    world = dist.get_world_size(step.group) if dist.is_available() and dist.is_initialized() else 1
    if world == 1:
        return False
    shard(step, state)
    return True


def shard(step: _Sharded, state: TrainState) -> None:
    """Apply ``fully_shard`` to the state's model (units, then root) once; re-point the optimizer. A model split
    across processes inside (``tensor_parallel``, ``pipeline``) is split first, then sharded over the processes
    that hold the same part (the mesh's data dimensions)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    if state.unusable is not None:
        raise RuntimeError(f"{step!r}: {state.unusable}")
    place = step.place(state)
    world_group: Any = place.world_group if place is not None else step.group
    group: Any = place.data_group if place is not None else (step.group if step.group is not None else dist.group.WORLD)
    sharding = state.transform_state(step.role, _Sharding)
    model = state.model
    if isinstance(model, FSDPModule):
        if sharding.group is not group:
            raise RuntimeError(
                f"{step!r}: the TrainState's model was sharded over a process group that is gone, released "
                "(TrainState.release_runtime, which ct.run calls when the process exits) or another one; a sharded "
                "model cannot move to a new group: build a fresh TrainState and load a checkpoint into it"
            )
        return
    try:  # each rank checks its own model; the ranks then agree, so that none waits for one that raised
        initial, names, held, devices, units = _checked_plan(step, state)
        problem: Exception | None = None
    except Exception as e:  # a predicate of modules= may raise anything, on one rank only
        problem, units = e, []
    _agree(step, model, units, problem, world_group)  # every check done on every rank: now change things
    if place is not None:  # tensor_parallel, pipeline: each splits the model (and re-points the optimizer) first
        step._inner().split_model(state)
        initial, names, held, devices, units = _checked_plan(step, state)  # this rank's part, as split
    # FSDP2 cannot shard a 0-dim parameter (CLIP's logit_scale) and checks that only when it reaches it, at
    # the root after the units (pitfall 32): such parameters stay whole on every rank, ignored by FSDP2,
    # their gradients averaged by _average_gradients after the update's last backward
    scalars = [p for p in model.parameters() if p.dim() == 0]
    with torch.no_grad():  # replicas start identical, rank 0's, as under DDP (pitfall 14)
        for t in [*model.parameters(), *model.buffers()]:
            local = t.to_local() if isinstance(t, DTensor) else t  # a tensor-parallel piece: the same on the group
            dist.broadcast(local, src=dist.get_global_rank(group, 0), group=group)
    if place is not None:
        mesh = place.sub(tuple(n for n in ("replicate", "shard") if n in dict(place.layout)))
    else:
        mesh = DeviceMesh.from_group(group, devices[0])
    done = 0
    try:
        for _, unit in units:
            fully_shard(unit, mesh=mesh, reshard_after_forward=step.reshard_after_forward, ignored_params=set(scalars))
            done += 1
        fully_shard(model, mesh=mesh, reshard_after_forward=step.reshard_after_forward, ignored_params=set(scalars))
    except Exception as e:
        if not any(isinstance(m, FSDPModule) for m in model.modules()):
            raise  # it failed before changing anything: the state is as it was
        # torch has no way back: say so on every later use, rather than let torch fail with puzzles there
        where = "the root module" if done == len(units) else f"unit {units[done][0]!r}"
        state.unusable = (
            f"fully_shard failed on {where} after {done} unit(s) were sharded ({type(e).__name__}: {e}); the "
            "TrainState's model is half-sharded and its optimizer holds parameters the model no longer has, "
            "which cannot be undone: build a fresh model, optimizer and TrainState (and load a checkpoint into "
            "them to continue)"
        )
        raise RuntimeError(f"{step!r}: {state.unusable}") from e
    now = dict(model.named_parameters(remove_duplicate=False))
    new = {id(p): now[n] for p in held for n in [names[id(p)]]}
    for g in state.optimizer.param_groups:
        g["params"] = [new[id(p)] for p in g["params"]]
    if initial:  # the state the optimizer's __init__ made (Adagrad's sums), made again for the shards
        remake_initial_state(state.optimizer)
    state._unheld = [now[names[id(p)]] for p in state._unheld]
    sharding.group, sharding.model, sharding.replicated = group, model, scalars


def _checked_plan(step: _Sharded, state: TrainState) -> tuple[bool, dict[int, str], list[Any], list[str], Any]:
    """The checks ``shard`` makes before changing anything (each raises), and what it needs from them."""
    model = state.model
    initial = only_initial_state(step, state.optimizer)  # raises if it holds state that training made
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    held = [p for g in state.optimizer.param_groups for p in g["params"]]
    foreign = [i for i, p in enumerate(held) if id(p) not in names]
    if foreign:
        raise ValueError(
            f"{step!r}: the optimizer holds {len(foreign)} parameter(s) that are not the model's (positions "
            f"{foreign[:8]}); sharding re-points the optimizer at the sharded parameters by name: build it over "
            "model.parameters()"
        )
    devices = sorted({p.device.type for p in model.parameters()} or {"cpu"})
    if len(devices) != 1:
        raise RuntimeError(f"{step!r}: the model has parameters on {devices}; move it to one device first")
    if dist.get_backend(step.group) == "nccl" and devices[0] != "cuda":
        raise RuntimeError(
            f"{step!r}: the process group uses nccl but the model is on {devices[0]}; move it to the process's "
            "GPU (proc.device) first"
        )
    # FSDP2 checks contiguity only when it reaches a parameter's unit, after the units before it are sharded
    strided = [n for n, p in model.named_parameters() if not p.is_contiguous()]
    if strided:
        raise ValueError(
            f"{step!r}: parameters {strided} are not contiguous (a transposed or sliced view, such as "
            "nn.Parameter(w.t())), which FSDP2 cannot shard; make them contiguous before building the optimizer: "
            "module.weight = nn.Parameter(module.weight.detach().contiguous())"
        )
    units = select_units(model, step.units, repr(step))
    return initial, names, held, devices, units


def _agree(step: _Sharded, model: nn.Module, units: Any, problem: Exception | None, group: Any) -> None:
    """Raise ``problem``, or on every rank alike when the ranks would shard different models or units
    (each rank's FSDP2 collectives would then not match: a crash or a hang, not an error)."""
    plan = (
        type(problem).__name__ if problem is not None else None,
        [n for n, _ in units],
        [(n, tuple(t.shape), str(t.dtype)) for n, t in model.named_parameters(remove_duplicate=False)],
        [(n, tuple(t.shape), str(t.dtype)) for n, t in model.named_buffers()],
    )
    every = differing(plan, group)  # one tiny collective; the plans only if they differ
    if problem is not None:
        raise problem
    if every is None:
        return
    refused = [(r, p[0]) for r, p in enumerate(every) if p[0] is not None]
    rank, other = next((r, p) for r, p in enumerate(every) if p != every[0])
    if refused:
        why = f"rank {refused[0][0]} refused its model ({refused[0][1]}; see its error)"
    elif other[1] != every[0][1]:
        why = f"rank 0 would shard the units {every[0][1]}, rank {rank} {other[1]}"
    else:
        kinds = ("parameters", "buffers")
        i = 2 if other[2] != every[0][2] else 3
        mine, theirs = set(map(str, every[0][i])), set(map(str, other[i]))
        why = (
            f"their {kinds[i - 2]} differ: rank 0 only {sorted(mine - theirs)[:6]}, rank {rank} only "
            f"{sorted(theirs - mine)[:6]}"
        )
    raise ValueError(
        f"{step!r}: the ranks disagree on what to shard: {why}; every rank must build the same model "
        "(names, shapes, dtypes) and give sharded the same modules="
    )


def _let_go_of_group(model: nn.Module) -> None:
    """Drop the references FSDP2 keeps to the model's process group, which is about to be destroyed.

    No torch API does this (2.14): each unit's ``FSDPMeshInfo`` holds the group as attributes, and a
    ``DeviceMesh`` holds it in ``_pg_registry`` (only read under torch.compile; eager code resolves
    the group by name). Caches of torch's DTensor code keep the meshes themselves alive for good,
    so the group must go from the meshes, not only from the model. Private attributes, hence the
    getattr: on a torch without them there is nothing of theirs to drop.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    meshes = {id(p.device_mesh): p.device_mesh for p in model.parameters() if isinstance(p, DTensor)}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        units = getattr(fully_shard.state(module), "_fsdp_param_group", None)  # type: ignore[attr-defined]
        for info in (getattr(units, "mesh_info", None), getattr(units, "post_forward_mesh_info", None)):
            if info is None:
                continue
            if getattr(info, "mesh", None) is not None:
                meshes[id(info.mesh)] = info.mesh
            for name, value in list(vars(info).items()):
                if isinstance(value, dist.ProcessGroup):
                    setattr(info, name, None)
    for mesh in meshes.values():
        registry = getattr(mesh, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()

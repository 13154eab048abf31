"""distributed: multi-process data parallel with DistributedDataParallel."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel

from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import PlainStep, Transform, transform_factory
from composetrain.core.util import DISTRIBUTED, check_bool, check_real, name, show
from composetrain.launch.agree import gathered_numbers, largest
from composetrain.launch.rendezvous import group_world
from composetrain.transforms._deferred_sync import DDPDeferredSync, LastSync, grads_telling_the_others
from composetrain.transforms._mesh import MeshPlace, agreed_layout, average_gradients, data_layout, mesh_for

__all__ = ["distributed"]

_FIRST_BUCKET_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, in MiB


@transform_factory
def distributed(
    step: PlainStep | TrainStep | None = None,
    *,
    find_unused_parameters: bool = False,
    bucket_cap_mb: float = 25.0,
    broadcast_buffers: bool = True,
    gradient_as_bucket_view: bool = False,
    static_graph: bool = False,
    comm_hook: Callable[..., Any] | None = None,
    comm_state: Any = None,
    process_group: Any = None,
) -> Any:
    """Data parallel over ``torch.distributed`` processes, through ``DistributedDataParallel``.

    Each process runs the step on its own shard; DDP all-reduces the gradients in
    buckets, overlapped with backward, once per update: every backward but the
    last of an update (``accumulate``'s micro-batches) runs under ``no_sync``, which
    wraps its forward and its backward. Replicas start identical (DDP broadcasts
    rank 0's parameters and buffers when it wraps the model, on the first update).
    The loss is normalised over all units of the global batch: one small
    all-reduce per update adds up the processes' unit counts, so ranks holding
    different numbers of samples or tokens still give exactly the update of one
    process on the whole batch. With one process (or no process group) it is the
    plain step. The DDP wrapper lives in the TrainState (not in checkpoints).

    Around a model split across processes (``ct.tensor_parallel``, ``ct.pipeline``) it is data parallel over
    the processes that hold the same part of the model (the mesh's ``dp`` dimension), whose DTensor pieces and
    stage modules DDP cannot wrap: the update's gradients are then all-reduced here, in one collective per dtype
    after the last backward (not overlapped with it), and the loss is normalised over those processes only.

    Under it, ``out.loss`` is this rank's share of the global mean, scaled by the
    world size: it is the rank's own mean when ranks hold equal units, and its
    average over ranks is the exact global mean in any case.

    The step must call ``model(...)`` (DDP's forward) for its forward pass; reach
    the wrapped module's attributes as ``model.module``.

    Args:
        step: the step to wrap; omit it to get a transform.
        find_unused_parameters: let micro-batches or branches leave parameters
            unused (DDP's escape hatch; it costs a graph traversal per backward).
        bucket_cap_mb: DDP's gradient bucket size.
        broadcast_buffers: sync buffers (BatchNorm statistics) from rank 0 each forward.
        gradient_as_bucket_view: let gradients alias DDP's buckets (less memory).
        static_graph: promise the same graph every iteration (DDP optimisations).
        comm_hook: a DDP communication hook, e.g. ``fp16_compress_hook``.
        comm_state: the state passed to ``comm_hook``.
        process_group: the group to reduce over (default: the whole job; only without a model split inside,
            which lays out the whole job).

    Returns:
        The wrapped TrainStep, or a transform when ``step`` is omitted.

    Example:
        >>> with ct.rendezvous() as proc:                     # torchrun, srun, or alone
        ...     train = ct.distributed(ct.mixed_precision(ct.accumulate(4)(step)))
        ...     out = train(state, local_batch)              # one update, one gradient sync
    """
    for arg, value in (
        ("find_unused_parameters", find_unused_parameters),
        ("broadcast_buffers", broadcast_buffers),
        ("gradient_as_bucket_view", gradient_as_bucket_view),
        ("static_graph", static_graph),
    ):
        check_bool(value, DISTRIBUTED, arg)
    bucket_cap_mb = check_real(bucket_cap_mb, DISTRIBUTED, "bucket_cap_mb", example="25")
    if comm_hook is not None and not callable(comm_hook):
        raise TypeError(
            f"{DISTRIBUTED}: comm_hook must be a DDP communication hook hook(state, bucket) -> Future, "
            f"got {show(comm_hook)}"
        )
    options = {
        "find_unused_parameters": find_unused_parameters,
        "bucket_cap_mb": float(bucket_cap_mb),
        "broadcast_buffers": broadcast_buffers,
        "gradient_as_bucket_view": gradient_as_bucket_view,
        "static_graph": static_graph,
    }
    defaults = {"find_unused_parameters": False, "bucket_cap_mb": 25.0, "broadcast_buffers": True}
    shown = [f"{k}={v}" for k, v in options.items() if defaults.get(k, False) != v]
    if comm_hook is not None:
        shown.append(f"comm_hook={name(comm_hook)}")
    label = f"{DISTRIBUTED}({', '.join(shown)})" if shown else DISTRIBUTED
    transform = Transform(
        label, lambda inner: _Distributed(inner, label, options, comm_hook, comm_state, process_group)
    )
    return transform if step is None else transform(step)


class _Replica(RuntimeState):
    """The DDP wrapper kept in the TrainState; rebuilt on demand, never checkpointed. Also the seconds this
    process has waited for the others in its collectives (``TrainStep.waited``), a measurement, not state."""

    def __init__(self) -> None:
        self.ddp: DistributedDataParallel | None = None
        self.key: tuple[Any, ...] = ()
        self.split: nn.Module | None = None  # a model split inside, once its replicas were made identical
        self.waited = 0.0
        self.computed_at = 0.0  # when this process's last backward had computed its gradients

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (a collective that blocks until every process joined it), adding its seconds to ``waited``."""

        def call(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.waited += time.perf_counter() - started

        return call

    def mark_backward(self, loss: torch.Tensor) -> torch.Tensor:
        """A ``Context.scale_loss`` that scales nothing: when backward starts, it asks autograd to note the time
        its gradients are computed (a final callback, queued before DDP's own, which then waits for the others'
        gradients): the gradient all-reduce's wait is from then to the pass's end (``wait_for_gradients``)."""
        loss.register_hook(lambda grad: Variable._execution_engine.queue_callback(self._computed))
        return loss

    def _computed(self) -> None:
        self.computed_at = time.perf_counter()

    @contextlib.contextmanager
    def wait_for_gradients(self) -> Iterator[None]:
        """Around the last pass: from its gradients' computation to the end of DDP's all-reduce of them."""
        self.computed_at = 0.0
        yield
        if self.computed_at:
            self.waited += time.perf_counter() - self.computed_at

    def release(self) -> None:
        self.ddp, self.key = None, ()  # DDP holds its process group, which must go when destroyed


class _Distributed(TrainStep):
    role = "distributed"
    syncs_processes = True
    refuses_inside = refused_inside(role)

    def __init__(
        self,
        inner: TrainStep,
        label: str,
        options: dict[str, Any],
        comm_hook: Callable[..., Any] | None,
        comm_state: Any,
        group: Any,
    ) -> None:
        self.label = label
        self.options = options
        self.comm_hook = comm_hook
        self.comm_state = comm_state
        self.group = group
        super().__init__(inner)
        self.meshed = inner.capabilities.data_ranks != (1, 1)  # tensor_parallel, pipeline inside
        if self.meshed and group is not None:
            raise ValueError(
                f"{self!r}: the step inside splits its model across processes, which lays out the whole job as "
                "one mesh: leave process_group=None"
            )

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        world, device = group_world(self.group, self)
        if world == 1:  # what does not apply is a no-op
            return self._inner().prepare(state, batch, ctx)
        agreed_layout(state, lambda: self._layout(world), self, self.group)  # once: before any other collective
        if self.meshed:
            return self._prepare_split(state, batch, ctx, world, device)
        # the global unit count, so that every rank normalises by the same total; DDP averages
        # over ranks, hence the total per rank
        replica = state.transform_state(self.role, _Replica)
        units = torch.tensor(float(ctx.total_weight), dtype=torch.float64, device=device)
        started = time.perf_counter()  # on the CPU the all-reduce blocks until every process has joined it
        dist.all_reduce(units, group=self.group)
        per_rank: float | torch.Tensor = units.item() / world if units.device.type == "cpu" else units / world
        replica.waited += time.perf_counter() - started
        # transforms inside place or wrap the model first (pipeline_split); DDP goes outermost,
        # because its forward must run exactly once per backward
        ctx = self._inner().prepare(state, batch, ctx._replace(total_weight=per_rank))
        if ctx.call_step is not None and self.options["bucket_cap_mb"] < _FIRST_BUCKET_MB:
            # TorchDynamo's DDPOptimizer splits the graph at DDP's buckets, and asserts that DDP's first bucket
            # (1 MiB) is no larger than the others
            raise ValueError(
                f"{self!r}: bucket_cap_mb={self.options['bucket_cap_mb']} is below DDP's first bucket "
                f"({_FIRST_BUCKET_MB} MiB), which torch.compile's DDP graph splitting (DDPOptimizer) does not "
                f"support under ct.compile; use bucket_cap_mb >= {_FIRST_BUCKET_MB}"
            )
        ddp = self._ddp(state, ctx.model)

        last = LastSync()  # this update's: an error after the last all-reduce is told to the other ranks

        def no_sync_unless_last(c: Context) -> contextlib.AbstractContextManager[Any]:
            if c.last_backward:
                return last.around(replica.wait_for_gradients())
            if ddp.static_graph:  # before the pass's forward: nothing has changed yet
                # torch's reducer asserts at the first no_sync backward ("expect_autograd_hooks_ INTERNAL ASSERT")
                raise ValueError(
                    f"{self!r}: DDP's static_graph=True cannot skip the gradient sync of a non-final micro-batch "
                    "(no_sync), which accumulate's micro-batches need; drop static_graph=True, or use accumulate(1)"
                )
            return ddp.no_sync()

        # for accumulate("auto"): synchronise after passes that may run out of memory, never inside them
        deferred = DDPDeferredSync(ddp, self.group, self, replica.timed)
        agree = replica.timed(functools.partial(largest, group=self.group))  # a refusal on one rank is on all
        gather = replica.timed(functools.partial(gathered_numbers, group=self.group))
        return ctx._replace(
            model=ddp,
            around_pass=(*ctx.around_pass, no_sync_unless_last),
            scale_loss=(*ctx.scale_loss, replica.mark_backward),
            deferred_sync=deferred,
            agree=agree,
            gather=gather,
            notes={**ctx.notes, self.role: last},
        )

    def _prepare_split(
        self, state: TrainState, batch: Any, ctx: Context, world: int, device: torch.device | None
    ) -> Context:
        """Data parallel over the processes holding the same part of a model split inside: gradients all-reduced
        after the update's last backward, once."""
        place = self.place(state, world)
        replica = state.transform_state(self.role, _Replica)
        if replica.split is not state.model:
            self._inner().split_model(state)
            _same_start(state.model, place)
            replica.split = state.model
        units = torch.tensor(float(ctx.total_weight), dtype=torch.float64, device=device)
        dist.all_reduce(units, group=place.data_group)  # over the data shards only: a split's ranks share theirs
        per_rank = units.item() / place.data_size if units.device.type == "cpu" else units / place.data_size
        ctx = self._inner().prepare(state, batch, ctx._replace(total_weight=per_rank))
        last = LastSync()

        @contextlib.contextmanager
        def reduced_after(c: Context) -> Any:
            yield
            if c.last_backward:  # after the pass ended normally: what every pass added, once
                average_gradients(state, place.data_group, place.data_size)

        def sync_after_last(c: Context) -> contextlib.AbstractContextManager[Any]:
            return last.around(reduced_after(c)) if c.last_backward else contextlib.nullcontext()

        agree = functools.partial(largest, group=place.world_group)  # the whole job: every part of the model
        return ctx._replace(
            around_pass=(*ctx.around_pass, sync_after_last), agree=agree, notes={**ctx.notes, self.role: last}
        )

    def setup(self, state: TrainState) -> None:
        """Around a model split inside: lay out the mesh first, so the split inside finds its dimension."""
        world, _ = group_world(self.group, self)
        if world > 1:
            agreed_layout(state, lambda: self._layout(world), self, self.group)
        if self.meshed and world > 1:
            self.place(state, world)
        super().setup(state)

    def place(self, state: TrainState, world: int) -> MeshPlace:
        """The mesh of the model split inside, with this transform's ``dp`` dimension (built once)."""
        return mesh_for(state, lambda: self._layout(world), self)

    def _layout(self, world: int) -> tuple[tuple[str, int], ...] | None:
        if not self.meshed:
            return None
        return data_layout(world, (("dp", None),), self._inner().capabilities.data_ranks, self)

    def waited(self, state: TrainState) -> float:
        replica = state.transform_state(self.role, _Replica)
        return replica.waited + self._inner().waited(state)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        return grads_telling_the_others(self._inner(), self.role, state, batch, ctx)

    def _ddp(self, state: TrainState, module: nn.Module) -> DistributedDataParallel:
        replica = state.transform_state(self.role, _Replica)
        # the live group, not None for the default one: a new default group needs a new wrapper
        group = self.group if self.group is not None else dist.group.WORLD
        key = (id(module), group, self._config())
        if replica.ddp is None or replica.key != key or replica.ddp.module is not module:
            replica.ddp = self._wrap(module)
            replica.key = key
        return replica.ddp

    def _wrap(self, model: nn.Module) -> DistributedDataParallel:
        devices = {p.device for p in model.parameters()}
        backend = dist.get_backend(self.group)
        if backend == "nccl" and any(d.type != "cuda" for d in devices):
            raise RuntimeError(
                f"{self!r}: the process group uses nccl but the model has parameters on "
                f"{sorted(str(d) for d in devices)}; move it to the process's GPU (proc.device) first"
            )
        only = next(iter(devices)) if len(devices) == 1 else None
        device_ids = [only] if only is not None and only.type == "cuda" else None
        # only what differs from DDP's defaults: newer torch renames broadcast_buffers, and warns on it
        options = {k: v for k, v in self.options.items() if not (k == "broadcast_buffers" and v)}
        ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=self.group, **options)
        if self.comm_hook is not None:
            ddp.register_comm_hook(self.comm_state, self.comm_hook)
        return ddp

    def _config(self) -> tuple[Any, ...]:
        return (tuple(sorted(self.options.items())), self.comm_hook, id(self.comm_state), self.group)


def _same_start(model: nn.Module, place: MeshPlace) -> None:
    """The replicas of each part start identical, their first rank's (as DDP broadcasts rank 0's, pitfall 14)."""
    from torch.distributed.tensor import DTensor

    group = place.data_group
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            local = t.to_local() if isinstance(t, DTensor) else t
            dist.broadcast(local, src=dist.get_global_rank(group, 0), group=group)

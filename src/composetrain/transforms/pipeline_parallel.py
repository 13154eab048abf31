"""pipeline: the model's stages on different processes, micro-batches pipelined between them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from composetrain.core.batching import leaves, split_weighted, warn_if_batchnorm
from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep, combine
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import Transform, checked_output, refuse_step, transform_factory
from composetrain.core.util import PIPELINE, check_int, show
from composetrain.launch.agree import differing, from_rank, largest
from composetrain.launch.rendezvous import group_world
from composetrain.transforms._mesh import MeshPlace, data_layout, mesh_for, mesh_with
from composetrain.transforms._shard_optimizer import only_initial_state
from composetrain.transforms._stage_calls import Replay, chained, entered, stage_inputs
from composetrain.transforms._stages import Parts, Plan, StageView, chain, check_stages, prune, tied_sum

__all__ = ["pipeline"]

SCHEDULES = ("1f1b", "gpipe")


@transform_factory
def pipeline(stages: Sequence[Sequence[str]], *, microbatches: int, schedule: str = "1f1b") -> Transform:
    """Pipeline parallel: the model's stages on different processes, each batch pushed through them in
    micro-batches (``torch.distributed.pipelining``: a ``PipelineStage`` per process, GPipe or 1F1B).

    ``stages`` lists, for each stage, the submodules it runs, in the order the model's forward runs them: the
    model's forward must be the chain of them all, each given the previous one's output (a tuple spread into
    arguments). A forward that does more between its submodules (adds positions, reshapes) needs that work
    moved into a submodule. With one process the transform runs the chain itself, so
    ``ct.check(train_step, state, batch)`` there compares the chain with the model's own forward.

    The W processes form P = ``len(stages)`` stages, the outermost dimension of the mesh (stage ``r // (W / P)``:
    stages may sit on different nodes); the processes of a stage hold its
    part of the model, and all P read the same batch. Around it, ``ct.distributed`` or ``ct.sharded`` is data
    parallel over the W/P processes of each stage. Each stage keeps its own part: the other submodules are
    removed from the TrainState's model (the names stay the unsplit model's), and the optimizer holds the
    stage's parameters with the settings their group had. A weight tied across stages (an embedding shared
    with the output layer) is held by each, its gradients added over them, so the copies stay equal.

    The update is the plain step's on the whole batch: each micro-batch's loss is weighted by its units over
    the global count (torch's ``scale_grads``, an average of averages, is off: pitfall 43), ``clip_grad_norm``
    adds every stage's gradients to its norm, and ``mixed_precision`` skips an update on every stage when one
    overflows. The plain step is unchanged: on the first stage it is run until it calls ``model(...)``, whose
    arguments are the micro-batch's inputs, and on the last it is run with a stand-in that returns the stages'
    output, computing the loss. Checkpoints hold the whole model's state (gathered from the stages while
    saving), under the unsplit model's names: they load into the unsplit model, on any number of processes.
    Every send and receive runs on groups made with the job's timeout. With one process it is
    ``accumulate(microbatches)`` through the chain of the stages' submodules.

    Args:
        stages: the submodule names of each stage (``model.named_modules()``'s), in forward order, e.g.
            ``[["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "head"]]``.
        microbatches: M, the micro-batches per batch (each batch must split into M equal ones; 1F1B needs
            M >= P).
        schedule: ``"1f1b"`` (one forward, one backward: at most P micro-batches' activations held) or
            ``"gpipe"`` (all forwards, then all backwards).

    Returns:
        A transform: ``pipeline(stages, microbatches=4)(step) -> TrainStep``.

    Example:
        >>> stages = [["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "head"]]
        >>> train = ct.distributed(ct.clip_grad_norm(1.0)(ct.pipeline(stages, microbatches=8)(step)))
        >>> ct.run(train, ct.TrainState(model, optimizer), dataset, batch_size=32)   # torchrun --nproc-per-node=4
    """
    refuse_step(stages, PIPELINE, "stages", 'pipeline([["embed", "blocks.0"], ["blocks.1", "head"]], microbatches=4)')
    example = 'e.g. [["embed", "blocks.0"], ["blocks.1", "head"]]'
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence) or not stages:
        raise TypeError(
            f"{PIPELINE}: stages must be a list of stages, each a list of submodule names, got {show(stages)}; "
            f"{example}"
        )
    for i, names in enumerate(stages):
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not names:
            raise TypeError(
                f"{PIPELINE}: stages[{i}] must be a non-empty list of submodule names, got {show(names)}; {example}"
            )
        for n in names:
            if not isinstance(n, str):
                raise TypeError(f"{PIPELINE}: stages[{i}] holds {show(n)}, not a submodule name; {example}")
    microbatches = check_int(microbatches, PIPELINE, "microbatches", example="pipeline(stages, microbatches=8)")
    if schedule not in SCHEDULES:
        raise ValueError(f"{PIPELINE}: schedule must be '1f1b' or 'gpipe', got {show(schedule)}")
    frozen = tuple(tuple(names) for names in stages)
    if schedule == "1f1b" and microbatches < len(frozen):
        raise ValueError(
            f"{PIPELINE}: schedule='1f1b' needs at least as many micro-batches as stages, got microbatches="
            f"{microbatches} for {len(frozen)} stages; raise microbatches (more also shrinks the pipeline's idle "
            "bubble), or use schedule='gpipe'"
        )
    label = f"{PIPELINE}({[list(n) for n in frozen]}, microbatches={microbatches}, schedule={schedule!r})"
    return Transform(label, lambda inner: _Pipeline(inner, label, frozen, microbatches, schedule))


class _Held(RuntimeState):
    """This process's stage: the split, its PipelineStages and schedules (one per micro-batch shape), and the
    current update's loss function and forward hooks (never checkpointed)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.plan: Plan | None = None
        self.stage = 0
        self.place: MeshPlace | None = None
        self.schedules: dict[Any, Any] = {}
        self.loss: Any = None
        self.hooks: tuple[Any, ...] = ()
        self.ctx: Any = None

    def release(self) -> None:
        self.schedules = {}  # its stages hold the group


class _Pipeline(TrainStep):
    role = "pipeline"
    syncs_processes = True
    forward_needs_every_rank = True  # each forward sends to and receives from the other stages
    refuses_inside = refused_inside(role)

    def __init__(
        self, inner: TrainStep, label: str, stages: tuple[tuple[str, ...], ...], m: int, schedule: str
    ) -> None:
        self.label, self.stages, self.m, self.schedule = label, stages, m, schedule
        self.data_ranks = (len(stages), 1)
        super().__init__(inner)

    def _split(self, state: TrainState) -> bool:
        world, _ = group_world(None, self)
        return world > 1 and len(self.stages) > 1

    def _place(self, state: TrainState) -> MeshPlace:
        found = mesh_with(state, "pp", len(self.stages))  # laid out by a data-parallel transform outside
        if found is not None:
            return found
        world, _ = group_world(None, self)
        return mesh_for(state, lambda: self._layout(world), self)

    def _layout(self, world: int) -> tuple[tuple[str, int], ...]:
        layout = data_layout(world, (("dp", None),), (len(self.stages), 1), self)
        if dict(layout)["dp"] > 1:
            raise ValueError(
                f"{self!r}: {world} processes make {world // len(self.stages)} copies of the {len(self.stages)} "
                "stages, each reading its own data, but nothing synchronises them: wrap it in a data-parallel "
                "transform, distributed(pipeline(...)(step)) or sharded(pipeline(...)(step)), or run "
                f"{len(self.stages)} processes"
            )
        return layout

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        if not self._split(state):  # one process: accumulate(microbatches) on the unsplit model
            return self._inner().prepare(state, batch, ctx)
        place = self._place(state)
        self.split_model(state)
        held = state.transform_state(self.role, _Held)
        assert held.plan is not None  # split_model made it
        first = leaves(batch)
        size = first[0].shape[0] if first and first[0].dim() else 0
        self._check_size(size)  # before any pass: a stage's buffers are shaped for one micro-batch size
        warn_if_batchnorm(state.model, self)
        parts = Parts(place.group("pp"), held.plan, held.stage, state.model)
        if ctx.agree is None:  # alone: a refusal on one stage is on all
            ctx = ctx._replace(agree=functools.partial(largest, group=place.world_group))
        return self._inner().prepare(state, batch, ctx._replace(model_parts=parts))

    def check_batch_size(self, state: TrainState, size: int) -> None:
        if self._split(state):  # one process: accumulate(microbatches), which takes any size
            self._check_size(size)

    def _check_size(self, size: int) -> None:
        if size % self.m != 0:
            raise ValueError(
                f"{self!r}: the batch holds {size} samples, which do not split into microbatches={self.m} equal "
                f"micro-batches (the stages exchange activations of one shape); give every process a batch size "
                f"that is a multiple of {self.m}"
            )

    def setup(self, state: TrainState) -> None:
        """Split before a checkpoint is resumed: it loads into this stage's part."""
        if self._split(state):
            self._place(state)
            self.split_model(state)
        super().setup(state)

    def split_model(self, state: TrainState) -> None:
        """Check the stages against the whole model on every process, then keep this process's stage."""
        super().split_model(state)
        held = state.transform_state(self.role, _Held)
        if not self._split(state) or held.model is state.model:
            return
        place = self._place(state)
        model = state.model
        problem, plan = None, None
        try:
            only_initial_state(self, state.optimizer)
            if state.optimizer.state:
                raise ValueError(
                    f"{self!r}: the optimizer holds state its __init__ made for the whole model's parameters; each "
                    "stage keeps only its own: use an optimizer without initial state (not Adagrad)"
                )
            plan = check_stages(model, state.optimizer, self.stages, self)
        except Exception as e:
            problem = e
        shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
        every = differing((type(problem).__name__ if problem else None, self.stages, self.m, self.schedule, shapes))
        if problem is not None:
            raise problem
        if every is not None:
            rank, other = next((r, p) for r, p in enumerate(every) if p != every[0])
            why = "refused its model (see its error)" if other[0] else f"builds {other[1:4]}, rank 0 {every[0][1:4]}"
            if not other[0] and other[4] != every[0][4]:
                why = "builds another model (its parameters' names or shapes differ from rank 0's)"
            raise ValueError(
                f"{self!r}: the ranks disagree on the pipeline: rank {rank} {why}; build the same model and the "
                "same pipeline(stages, microbatches=, schedule=) on every rank"
            )
        assert plan is not None
        stage = place.coordinate("pp")
        group = place.group("pp")
        with torch.no_grad():  # every stage starts from the same whole model, the first stage's
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
        names = {id(p): path for path, p in model.named_parameters(remove_duplicate=False)}
        prune(model, self.stages[stage])
        kept = {id(p) for p in model.parameters()}
        for g in state.optimizer.param_groups:  # the optimizer per stage: this stage's parameters, their settings
            g["params"] = [p for p in g["params"] if id(p) in kept]
        state._unheld = [p for p in state._unheld if id(p) in kept]
        del names
        held.model, held.plan, held.stage, held.place, held.schedules = model, plan, stage, place, {}
        run = chain(model, self.stages[stage])

        def forward(*args: Any, **kwargs: Any) -> Any:
            with entered(held.hooks, held.ctx):
                return run(*args, **kwargs)

        model.forward = forward  # the stage's forward: FSDP's hooks on the module still run around it
        state.view = StageView(state, plan, stage, group)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        micros, weights = split_weighted(batch, self.m, ctx, self, "micro-batch")
        if not self._split(state):  # one process: the micro-batches one after the other, through the chain
            last = len(micros) - 1
            with chained(state.model, [n for names in self.stages for n in names]):
                passes = [
                    self._inner().grads(
                        state, micro, ctx._replace(piece_weight=w, last_backward=ctx.last_backward and i == last)
                    )
                    for i, (micro, w) in enumerate(zip(micros, weights, strict=True))
                ]
            return combine(passes, self)
        held = state.transform_state(self.role, _Held)
        assert held.plan is not None and held.place is not None
        plain = self._plain()
        stages = len(self.stages)
        is_first, is_last = held.stage == 0, held.stage == stages - 1
        # by micro-batch: torch's first step of a schedule also calls the loss once to infer the gradients'
        # shapes (on micro-batch 0), before the real calls
        shares: dict[int, Pass] = {}

        def loss_fn(output: Any, target: torch.Tensor) -> torch.Tensor:
            i = int(target)
            replay = Replay(output, self)
            with entered(ctx.around_forward, ctx):
                out = plain(replay, micros[i])
            replay.check()
            loss, metrics = checked_output(out, self)
            share = weights[i] / ctx.total_weight  # the global count: never scale_grads' per-step rescale
            loss, metrics = loss * share, {k: v * share for k, v in metrics.items()}
            shares[i] = Pass(loss.detach(), metrics)
            scaled = loss
            for scale in ctx.scale_loss:
                scaled = scale(scaled)
            return scaled

        schedule = self._schedule(held, micros, state)
        group = held.place.group("pp")
        with entered(ctx.around_pass, ctx):
            held.loss, held.hooks, held.ctx = loss_fn, ctx.around_forward, ctx
            try:
                if is_first:
                    inputs = [stage_inputs(plain, micro, self) for micro in micros]
                    schedule.step(
                        arg_mbs=[a for a, _ in inputs], kwarg_mbs=[k for _, k in inputs], return_outputs=False
                    )
                elif is_last:
                    targets = [torch.tensor(i) for i in range(len(micros))]  # which micro-batch: the loss reads it
                    schedule.step(target_mbs=targets, losses=[], return_outputs=False)
                else:
                    schedule.step(return_outputs=False)
            except RuntimeError as e:  # gloo's words for a lost peer: said with where this process stood
                if "Connection" not in str(e) and "Timed out" not in str(e):
                    raise
                raise RuntimeError(
                    f"{self!r}: stage {held.stage} of {stages} (rank {dist.get_rank()}) lost contact with another "
                    f"stage mid-update ({str(e).splitlines()[0]}): a process of the job died or stopped answering; "
                    "see the other ranks' errors (the job must be restarted, e.g. by torchrun --max-restarts)"
                ) from e
            finally:
                held.loss, held.hooks, held.ctx = None, (), None
            shard = (
                held.place.size("shard"),
                held.place.coordinate("shard") if "shard" in dict(held.place.layout) else 0,
            )
            if ctx.last_backward:  # what every pass of the update added, once (a second sum would add the first twice)
                tied_sum(state.model, held.plan, group, shard)
        done = combine([shares[i] for i in range(len(micros))], self) if is_last else None
        return from_rank(done, stages - 1, group)  # the loss, computed on the last stage, on every stage

    def _plain(self) -> Any:
        step: TrainStep = self
        while step.inner is not None:
            step = step.inner
        return getattr(step, "step")  # noqa: B009 - the lifted plain step's function

    def _schedule(self, held: _Held, micros: list[Any], state: TrainState) -> Any:
        """The schedule for micro-batches of these shapes (a stage's buffers are shaped for one), made once."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        key = tuple((tuple(t.shape), t.dtype) for t in leaves(micros[0]))
        found = held.schedules.get(key)
        if found is not None:
            return found
        assert held.place is not None
        device = next((p.device for p in state.model.parameters()), torch.device("cpu"))
        stage = PipelineStage(state.model, held.stage, len(self.stages), device, group=held.place.group("pp"))
        kind = Schedule1F1B if self.schedule == "1f1b" else ScheduleGPipe

        def loss_fn(output: Any, target: Any) -> torch.Tensor:
            return held.loss(output, target)

        made = kind(stage, n_microbatches=len(micros), loss_fn=loss_fn, scale_grads=False)
        held.schedules[key] = made
        return made

    def _config(self) -> tuple[Any, ...]:
        return (self.stages, self.m, self.schedule)

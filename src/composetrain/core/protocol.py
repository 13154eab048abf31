"""The step protocol: TrainStep, its phases and the Context between transforms.

How a TrainStep works
---------------------
``train_step(state, batch)`` performs exactly one optimizer update in four phases,
each of which a transform may wrap (subclass TrainStep, override, call the inner
step's):

1. ``prepare(state, batch, ctx) -> ctx``, once per update, outermost first: set up
   what the whole update needs (e.g. the batch's unit count across processes).
2. ``grads(state, batch, ctx) -> Pass``: forward and backward, adding into
   ``.grad``. A transform that splits the batch calls its inner step's ``grads``
   once per piece; the innermost one runs the plain step.
3. ``verify(state, done, ctx)``, once per update, after the last backward: refuse what only
   the passes show (the step's metrics, a buffer its forward re-registered), changing nothing.
4. ``update(state, ctx) -> Update``: apply the optimizer update, or skip it. It refuses
   nothing: an update phase that raised after ``optimizer.step()`` would have trained.

Transforms talk to the steps inside them through one explicit channel, the
``Context``, never by testing each other's types. Because a composition is a
chain, whatever a transform puts in the context reaches every pass inside it,
whichever order the transforms were nested in:

- ``around_forward``: context managers entered around the plain step's forward
  only (autocast belongs there, never around backward or the optimizer).
- ``around_pass``: context managers entered around forward *and* backward of one
  pass, given that pass's context (DDP's ``no_sync`` must wrap both, and is
  wanted only while ``last_backward`` is false).
- ``scale_loss``: functions applied to the loss for ``backward`` only (loss
  scaling), never to the reported loss.
- ``last_backward``: false while further backward passes of this update follow
  (the moment to synchronise or unscale gradients, once).
- ``skip_update``: set in the update phase by a transform that found the
  gradients unusable; the innermost update then changes nothing, while the
  transforms in between still run (and report their metrics).
- ``notes``: what a transform decided in ``prepare`` for its own later phases of
  this update, under its ``role`` (the context ``prepare`` returns reaches them all).
- ``deferred_sync``: how to synchronise gradients later, for passes that must run
  without any collective among them (``composetrain.transforms._deferred_sync``).
- ``agree``: how the processes tell each other, after the passes, whether any refused the update:
  ``agree(values) -> values``, their elementwise maximum over the processes (one small all-reduce),
  set by the transforms that make processes agree (``distributed``, ``sharded``), so that a
  refusal on one process (a metric, a buffer ``ct.ema`` cannot average) is a refusal on all.
- ``model_parts``: the processes holding the other parts of a model split across processes
  (``ct.pipeline``'s stages), for what concerns the whole model: the gradient norm, an overflow.
- ``gather``: every process's few numbers, by rank (one small all-gather), set by the same transforms:
  what a decision that every process must take alike is taken from (``ct.skip_spikes`` judges the
  global loss, the mean of every process's, never one process's own).
- ``call_step``: what the innermost pass calls the plain step through: given the plain
  step, the callable to call in its place (``ct.compile``'s compiled step). It runs
  with the model every transform has set by then (the DDP wrapper, the sharded
  model), which is where torch recommends compiling, whatever the nesting order.

The loss has exactly one owner of its normalisation: the innermost pass scales
its mean loss by ``piece_weight / total_weight`` before ``backward``, so the
gradients summed over all passes are those of the mean over all units of the
batch, however it was split. The same scaled loss, detached, is the pass's share
of the reported loss: shares add up, with no second weighting.

``__call__`` is the only entry. It validates the state and the batch, builds the
root context, runs the phases and ends with every gradient ``None``. A call that
raises before its update phase (a refusal, the step's own error) changes nothing:
parameters, optimizer, scheduler, ``state.step`` and transform state are untouched
(``prepare`` and ``verify`` only check), and what the passes changed, buffers,
random generators and gradients set before the call, is put back as it was.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeAlias

import torch
from torch import nn
from torch.autograd import profiler as _torch_profiler
from torch.autograd.profiler import record_function

from composetrain.core._rollback import CallUndo
from composetrain.core.batching import check_weights, samples
from composetrain.core.composition_rules import check_inside
from composetrain.core.state import TrainState
from composetrain.core.util import name, show

__all__ = ["Capabilities", "Context", "Pass", "StepOutput", "TrainStep", "Update", "combine"]

Metric: TypeAlias = "torch.Tensor | float"
WeightFn: TypeAlias = "Callable[[Any], int | float | torch.Tensor]"
Hook: TypeAlias = "Callable[[Context], AbstractContextManager[Any]]"


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """What one call of a TrainStep returns. Nothing in it holds an autograd graph.

    Attributes:
        loss: detached scalar tensor, the mean loss over the batch's units, still on
            its device (reading it is the caller's host sync, not the step's).
        metrics: detached scalar tensors, means over the batch's units (metrics the
            step returned as numbers become CPU tensors: reading them is free).
        skipped: bool-like, true when the update was not applied.
        units: the units of this process's batch, as the composition counts them (its samples, or what
            ``accumulate``'s ``weight`` counts: tokens), read once by the call anyway; None where unknown
            (an output restored from a checkpoint). ``ct.run`` adds them up for its records' throughput.
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]
    skipped: bool | torch.Tensor = False
    units: float | None = None


class Context(NamedTuple):
    """What a transform tells the steps inside it (see the module documentation).

    Transforms pass a modified copy, ``ctx._replace(...)``, to their inner step.

    Attributes:
        model: the module the plain step is called with.
        weight: the composition's unit counter ``weight(batch)``, None for samples.
        total_weight: units in the whole batch of this update (across processes, if
            a transform makes it so in ``prepare``).
        piece_weight: units in the batch this call sees.
        last_backward: false while further backward passes of this update follow.
        scale_loss: functions applied, in order, to the loss for backward only.
        around_forward: hooks entered around each forward.
        around_pass: hooks entered around each forward and backward.
        skip_update: the update phase must leave parameters, optimizer and scheduler alone.
        notes: per-update decisions of transforms, by role, made in ``prepare``.
        deferred_sync: set by a transform that synchronises gradients across processes
            (``distributed``), for a transform that must run its passes without any
            collective in between (``accumulate("auto")``): its ``begin()``, ``agree(values)``
            and ``finish()`` are documented in ``composetrain.transforms._deferred_sync``. None alone.
        call_step: ``call_step(plain_step) -> callable`` called in the plain step's place with
            ``(model, batch)``, or None to call the plain step itself.
        agree: ``agree(values) -> values``, the elementwise maximum over the processes, set by a transform
            that makes processes agree; ``__call__`` tells them through it whether this one refused the
            update, after the passes and before any update phase. None alone.
        model_parts: set by a transform that splits the model's parameters across processes, each holding a
            part (``ct.pipeline``'s stages): ``model_parts.group``, the processes holding the other parts (a
            global gradient norm, or an overflow found in one part, concerns them all), and
            ``model_parts.counted(tensors)``, those of this process's tensors that a global norm counts (a
            weight tied across stages counts once). None when every process holds every parameter (or its
            DTensor shard).
        gather: ``gather(values) -> [values of rank 0, of rank 1, ...]``, every process's numbers by rank,
            set by the same transforms (one small all-gather); what a decision every process takes alike is
            computed from, in the update phase (which every process reaches once none refused). None alone.
    """

    model: nn.Module
    weight: WeightFn | None
    total_weight: float | torch.Tensor
    piece_weight: float | torch.Tensor
    last_backward: bool = True
    scale_loss: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = ()
    around_forward: tuple[Hook, ...] = ()
    around_pass: tuple[Hook, ...] = ()
    skip_update: bool = False
    notes: Mapping[str, Any] = MappingProxyType({})
    deferred_sync: Any = None
    call_step: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
    agree: Callable[[list[float]], list[float]] | None = None
    model_parts: Any = None
    gather: Callable[[list[float]], list[list[float]]] | None = None


class Pass(NamedTuple):
    """What a grads phase returns: its share of the update's mean loss and metrics.

    A share is the pass's mean times ``piece_weight / total_weight`` (detached), so
    the shares of all passes of an update add up to the means over the whole batch.
    """

    loss: torch.Tensor
    metrics: dict[str, Metric]


class Update(NamedTuple):
    """What an update phase returns: whether it was skipped, and metrics of its own."""

    skipped: bool | torch.Tensor
    metrics: dict[str, Metric]


def combine(passes: Sequence[Pass], who: object) -> Pass:
    """The sum of several passes' shares: the loss and metrics of their union."""
    names = passes[0].metrics.keys()
    for i, p in enumerate(passes):
        if p.metrics.keys() != names:
            raise ValueError(
                f"{who}: the step returned metrics {sorted(p.metrics)} for piece {i + 1} but "
                f"{sorted(names)} for piece 1; return the same metric names for every batch"
            )
    return Pass(_add([p.loss for p in passes]), {k: _add([p.metrics[k] for p in passes]) for k in names})


def _add(values: list[Any]) -> Any:
    """Sum of tensors (two kernel launches, whatever their number) or numbers."""
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack(values).sum(0)
    return sum(values[1:], values[0])


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a composition does that its driver must know, so that ``ct.run`` never names a transform.

    A transform states its own in TrainStep's class flags of the same names; a composition has a
    capability when any of its steps has it (``train_step.capabilities``).

    Attributes:
        places_model: the composition moves the model to its devices itself (``data_parallel``,
            ``pipeline_split``); the driver leaves it where it is.
        syncs_processes: it makes several processes agree on every update (``distributed``,
            ``sharded``); without it the driver refuses to run on several processes.
        forward_needs_every_rank: each forward gathers from every rank (``sharded``), so a separate
            evaluation, whose ranks may see different numbers of batches, is not supported.
        compile_cache: it compiles with torch.compile and wants torch's compile caches kept beside
            the checkpoints (``ct.compile``), so that a resumed run starts warm.
        data_ranks: ``(P, T)``: how many processes read each batch. The model is split across
            processes that must see the same data: the P pipeline stages (``ct.pipeline``), whose ranks
            lie ``W / P`` apart (the outermost dimension of the mesh), and the T ranks of a
            tensor-parallel group (``ct.tensor_parallel``), consecutive (the innermost). ``(1, 1)``: every
            process reads its own shard. ``data_shard`` turns it into this process's shard.
    """

    places_model: bool = False
    syncs_processes: bool = False
    forward_needs_every_rank: bool = False
    compile_cache: bool = False
    data_ranks: tuple[int, int] = (1, 1)

    def __or__(self, other: Capabilities) -> Capabilities:
        either: dict[str, Any] = {
            f.name: getattr(self, f.name) or getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name != "data_ranks"
        }
        # each splitting transform appears once in a composition: the sizes multiply
        (p, t), (q, u) = self.data_ranks, other.data_ranks
        return Capabilities(**either, data_ranks=(p * q, t * u))

    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        """``(index, count)``: the data shard process ``rank`` of ``world`` reads, of ``count`` shards.

        Example:
            >>> Capabilities(data_ranks=(1, 2)).data_shard(3, 4)   # tensor-parallel pairs (0, 1), (2, 3)
            (1, 2)
        """
        stages, tp = self.data_ranks
        count = world // (stages * tp)
        if count < 1 or count * stages * tp != world:
            raise ValueError(
                f"the composition splits its model over {stages} pipeline stage(s) x {tp} tensor-parallel rank(s) = "
                f"{stages * tp} processes per data shard, which does not divide the {world} processes of the job; "
                "run a multiple of that many processes"
            )
        return (rank // tp) % count, count


class TrainStep:
    """One optimizer update per call: ``train_step(state, batch) -> StepOutput``.

    Built by ``ct.train_step`` and by the transforms. A transform subclasses
    TrainStep, overrides ``prepare``, ``grads`` and/or ``update``, calls its inner
    step's, and returns its configuration from ``_config()`` (steps with equal
    configuration around equal inner steps are equal). A transform that may occur
    only once in a composition names itself in the class attribute ``role``; one
    whose update phase reports metrics lists their names in ``reports``; the roles it
    cannot be correct around, with the reason and the order to use, are its row of the
    composition rules (``composetrain.core.composition_rules``), its ``refuses_inside``
    (checked when the composition is built). What the
    driver must know of a transform it states in the flags ``places_model``,
    ``syncs_processes`` and ``forward_needs_every_rank`` (see ``Capabilities``); one that changes the
    update itself rather than how it is computed (``clip_grad_norm``) sets ``changes_update``, so that
    ``ct.check`` keeps it in the plain step it compares with; and what
    it must do to the state before the first update (and before a checkpoint is
    resumed) in ``setup``.

    Args:
        inner: the step this one wraps (None only for the lifted plain step).
        weight: ``weight(batch) -> units`` for the whole composition, or None
            (samples); one composition has at most one weight function.
    """

    inner: TrainStep | None
    weight: WeightFn | None
    __signature__: inspect.Signature
    role: ClassVar[str | None] = None
    reports: ClassVar[frozenset[str]] = frozenset()
    # role -> why, and the order to use: the transform's row of composition_rules.REFUSED
    refuses_inside: ClassVar[Mapping[str, str]] = MappingProxyType({})
    places_model: ClassVar[bool] = False
    syncs_processes: ClassVar[bool] = False
    forward_needs_every_rank: ClassVar[bool] = False
    # the transform changes the update itself (clip_grad_norm), not only how it is computed: ``ct.check`` keeps
    # it around the plain step it compares a composition with
    changes_update: ClassVar[bool] = False
    compile_cache: bool = False  # an instance may set it before calling TrainStep.__init__
    # (P, T): the pipeline stages and tensor-parallel ranks that read each batch (see Capabilities); an instance
    # sets it before calling TrainStep.__init__
    data_ranks: tuple[int, int] = (1, 1)

    def __init__(self, inner: TrainStep | None, *, weight: WeightFn | None = None) -> None:
        inside = inner.roles if inner is not None else frozenset()
        if self.role is not None and self.role in inside:
            raise ValueError(
                f"{self._label()}: the step inside, {inner!r}, already applies {self.role}; "
                f"use {self.role} once in a composition"
            )
        check_inside(self._label(), self.refuses_inside, inside)
        inherited = inner.weight if inner is not None else None
        if weight is not None and inherited is not None and weight is not inherited:
            raise ValueError(
                f"{self._label()}: the step inside already counts units with weight={name(inherited)}, "
                f"not weight={name(weight)}; one composition has one weight function: give weight= to "
                "one accumulate only"
            )
        self.inner = inner
        self.weight = weight if weight is not None else inherited
        self.reported: frozenset[str] = self.reports | (inner.reported if inner is not None else frozenset())
        # what the composition applies, for the driver: e.g. "distributed" in train_step.roles
        self.roles: frozenset[str] = frozenset({self.role} if self.role else ()) | (
            inner.roles if inner is not None else frozenset()
        )
        own = Capabilities(
            self.places_model, self.syncs_processes, self.forward_needs_every_rank, self.compile_cache, self.data_ranks
        )
        self.capabilities: Capabilities = own | inner.capabilities if inner is not None else own
        wrapped = inner if inner is not None else getattr(self, "step", None)
        if wrapped is not None:
            functools.update_wrapper(self, wrapped, updated=())
        # inspect.signature would follow __wrapped__ to the plain step's (model, batch); a TrainStep is
        # called as (state, batch)
        self.__signature__ = _CALLED_AS

    # -- the phases ---------------------------------------------------------------
    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        """Once per update, outermost first: the context for the whole update."""
        return self._inner().prepare(state, batch, ctx)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        """Forward and backward of ``batch``, gradients added into ``.grad``."""
        return self._inner().grads(state, batch, ctx)

    def verify(self, state: TrainState, done: Pass, ctx: Context) -> None:
        """After the last backward, before any update phase: refuse what only the passes show (a buffer the
        forward re-registered, the metrics), changing nothing; outermost first, each calling its inner's."""
        self._inner().verify(state, done, ctx)

    def update(self, state: TrainState, ctx: Context) -> Update:
        """Apply the update from ``.grad`` (or nothing, under ``ctx.skip_update``). It refuses nothing: every
        check is made in ``prepare`` or ``verify``, before the first change to the state."""
        return self._inner().update(state, ctx)

    def setup(self, state: TrainState) -> None:
        """Once, before the first update: what the state needs from this transform before a checkpoint
        loads into it (``ct.sharded`` shards the model, so that the checkpoint's shards load straight
        into the shards). ``ct.run`` calls it after moving the model to its device; outermost first,
        each transform calling its inner step's. Nothing by default."""
        if self.inner is not None:
            self.inner.setup(state)

    def split_model(self, state: TrainState) -> None:
        """Split the state's model across processes now (``ct.tensor_parallel``'s pieces, ``ct.pipeline``'s
        stages), if this transform does, before a data-parallel transform outside wraps or shards it (torchtitan's
        order: the model split first, then FSDP or the gradient all-reduce). Each transform calls its inner
        step's first; done once, later calls change nothing. Nothing by default."""
        if self.inner is not None:
            self.inner.split_model(state)

    def eval_weights(self, state: TrainState) -> dict[str, AbstractContextManager[Any]]:
        """Other weights the driver evaluates besides the model's own, by name: under each context
        manager, ``state.model`` holds those weights (``ct.ema``'s "ema"; ``ct.run`` records its metrics
        under ``"eval_ema"``). Each transform adds its own to its inner step's; none by default."""
        return self.inner.eval_weights(state) if self.inner is not None else {}

    def check_batch_size(self, state: TrainState, size: int) -> None:
        """Raise where the composition cannot take batches of ``size`` samples per process (``ct.pipeline``'s
        micro-batches must split it evenly): ``ct.run`` asks before it makes anything in the run's folder, so
        that such a run is refused with nothing written. Each transform asks its inner step's with the size that
        step is given; one that cuts batches (``accumulate``, ``data_parallel``) asks nothing further (its pieces
        are checked at the update). Nothing by default."""
        if self.inner is not None:
            self.inner.check_batch_size(state, size)

    def forward_size(self, state: TrainState, size: int) -> int:
        """The most samples one forward runs on when the composition is given a batch of ``size``: what a transform
        that cuts batches (``accumulate``, ``data_parallel``) makes of it, each calling its inner step's (``size``
        by default). ``ct.run``'s evaluation of a run defined by its global batch reads batches of it, so that it
        holds no more than training does on any number of processes."""
        return self.inner.forward_size(state, size) if self.inner is not None else size

    def waited(self, state: TrainState) -> float:
        """Seconds this process has spent waiting for the other processes inside this composition's updates, in
        total so far (a transform that makes processes agree measures its own waits: ``ct.distributed``'s
        all-reduces; 0.0 where none is measured). ``ct.run`` reads it at its log points, to tell a rank that is
        slow from the ranks that wait for it (their time in the step is alike: each waits for the slowest)."""
        return self.inner.waited(state) if self.inner is not None else 0.0

    def _inner(self) -> TrainStep:
        if self.inner is None:
            raise NotImplementedError(
                f"{type(self).__name__}: a TrainStep without an inner step must override prepare, "
                "grads and update; wrap a step instead: super().__init__(inner)"
            )
        return self.inner

    # -- the entry ------------------------------------------------------------------
    def __call__(self, state: TrainState, batch: Any) -> StepOutput:
        """Run one optimizer update on ``batch``.

        Args:
            state: the TrainState to update in place.
            batch: a nested batch; tensors share their leading (batch) size.

        Returns:
            The StepOutput: detached mean loss and metrics, and whether the update
            was skipped.
        """
        if not isinstance(state, TrainState):
            raise TypeError(
                f"{self!r}: state must be a ct.TrainState, got {show(state)}; "
                "build one with ct.TrainState(model, optimizer)"
            )
        if state.unusable is not None:
            raise RuntimeError(f"{self!r}: {state.unusable}")
        who = self  # formatted only if an error needs it
        if self.weight is None:
            units = float(samples(batch, who))
        else:
            units = check_weights([self.weight(batch)], who, "the batch")[0]
        ctx = Context(state.model, self.weight, total_weight=units, piece_weight=units)
        params = _params(state)
        kept = CallUndo(params)
        undo: CallUndo | None = kept  # until the update phase begins
        # torch.profiler records now (a plain bool torch keeps for this): name the phases in its trace; a
        # record_function outside a profiler still costs a dispatcher call, so there is none then
        marked = _torch_profiler._is_profiler_enabled
        try:
            ctx = self.prepare(state, batch, ctx)  # checks what it can before the forward, changes nothing
            kept.keep_buffers(state.model)  # after prepare, which may place the model (once)
            if marked:
                with record_function("forward/backward"):
                    done = self.grads(state, batch, ctx)
            else:
                done = self.grads(state, batch, ctx)
            self._verified(state, done, ctx)  # the last refusal: from here on the call changes the state
            undo = None
            if marked:
                with record_function("optimizer"):
                    applied = self.update(state, ctx)
            else:
                applied = self.update(state, ctx)
        finally:
            kept.close()
            state.zero_grad()
            for p in params:  # also of a parameter the model gained after the TrainState was built
                p.grad = None
            if undo is not None:  # refused after the forward: put back what the passes changed
                undo.restore()
        metrics = {k: _as_tensor(v) for k, v in done.metrics.items()}
        metrics.update((k, _as_tensor(v)) for k, v in applied.metrics.items())
        return StepOutput(done.loss, metrics, applied.skipped, units)

    def _verified(self, state: TrainState, done: Pass, ctx: Context) -> None:
        """The refusals after the passes; under ``ctx.agree`` every process learns whether any refused, so
        that none applies an update another refused (their models would silently part)."""
        try:
            clash = done.metrics.keys() & self.reported
            if clash:
                raise ValueError(
                    f"{self!r}: the step returns metrics {sorted(clash)} that a transform reports as well; "
                    "rename them in the step"
                )
            self.verify(state, done, ctx)
        except Exception:
            if ctx.agree is not None:
                ctx.agree([1.0])  # the others refuse with this one
            raise
        if ctx.agree is not None and ctx.agree([0.0])[0]:
            raise RuntimeError(
                f"{self!r}: another process refused this update after its passes (see its error); nothing was "
                "applied here either, so the processes stay alike"
            )

    # -- identity -------------------------------------------------------------------
    def _config(self) -> tuple[Any, ...] | None:
        """The configuration that, with the inner step, defines this step.

        None (the default) makes the step equal only to itself.
        """
        return None

    def _label(self) -> str:
        """How the transform prints: its ``label`` attribute if it set one, else its class name."""
        return getattr(self, "label", type(self).__name__)

    def __repr__(self) -> str:
        inner = self.inner
        plain = getattr(inner, "step", None) if inner is not None and inner.inner is None else None
        shown = name(plain) if plain is not None else repr(inner)  # a lifted plain step shows as its name
        return f"{self._label()}({shown})"

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return False
        assert isinstance(other, TrainStep)  # for the type checker
        config = self._config()
        if config is None:
            return self is other
        return config == other._config() and self.inner == other.inner

    def __hash__(self) -> int:
        config = self._config()
        return id(self) if config is None else hash((type(self), config, self.inner))


def _params(state: TrainState) -> list[torch.Tensor]:
    """The model's parameters and those the optimizer holds outside it: what ``zero_grad`` clears."""
    held = (p for group in state.optimizer.param_groups for p in group["params"])
    return list({id(p): p for p in (*state.model.parameters(), *held)}.values())


_call = inspect.signature(TrainStep.__call__, eval_str=True)
_CALLED_AS = _call.replace(parameters=list(_call.parameters.values())[1:])  # bound: without self


def _as_tensor(value: Any) -> torch.Tensor:
    """A metric as a tensor; a Python float keeps all its digits (float64), not the default dtype's."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=torch.float64) if isinstance(value, float) else torch.tensor(value)

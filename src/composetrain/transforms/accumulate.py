"""accumulate(n), accumulate(micro_batch=m): one update from micro-batches, exactly the large-batch update."""

from __future__ import annotations

from typing import Any, Literal

from composetrain.core.batching import split_weighted, warn_if_batchnorm
from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep, WeightFn, combine
from composetrain.core.state import TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import ACCUMULATE, check_int, name, show
from composetrain.transforms._auto_accumulate import auto_transform

__all__ = ["accumulate"]


@transform_factory
def accumulate(
    n: int | Literal["auto"] | None = None, *, micro_batch: int | None = None, weight: WeightFn | None = None
) -> Transform:
    """Split each batch into ``n`` micro-batches, or into micro-batches of ``micro_batch`` samples; forward+backward
    each; update once.

    Activation memory falls about ``n``-fold, and the update, loss and metrics are
    those of the plain step on the whole batch: every micro-batch's mean loss is
    weighted by its share of the batch's units, so uneven micro-batches (a batch of
    10 in 4 gives 3, 3, 2, 2) and token-level losses are exact. A batch smaller
    than ``n`` gives fewer micro-batches, never an empty one.

    With ``micro_batch=m`` the size is fixed and the count follows the batch: each batch of b
    samples (its leading size, on this process) is cut into consecutive micro-batches of m, the
    last one short when m does not divide b (10 by 4: 4, 4, 2, the last weighted 2/10), as the
    loops of timm and nanoGPT slice it; a batch of at most m samples is one micro-batch. So memory
    per process stays bounded whatever batch each process gets: a job resumed on half the
    processes (each given twice the samples of a fixed global batch) runs twice the micro-batches
    instead of running out of memory, and a timm-style script whose ``--batch-size`` is the
    micro-batch ports as it is. The size is configuration, not state: the TrainState and
    ``out.metrics`` hold nothing of it (``accumulate("auto")``, whose size changes, reports it).

    With ``n="auto"`` the batch is the optimisation batch and the micro-batch adapts to
    memory: an out-of-memory error (``torch.OutOfMemoryError``, on any device) retries
    the update with micro-batches half as large, leaving nothing of the failed attempt:
    its gradients (those from before the call are put back), the random numbers it drew
    (torch's CPU and CUDA generators, Python's ``random``, NumPy's global generator) and
    every buffer of the model, changed in place or rebound; the CUDA cache is emptied.
    What the step changes elsewhere is not restored: its own generators
    (``np.random.default_rng``), attributes that are not buffers, the batch, files.
    The micro-batch size that fits is kept in the TrainState (checkpointed). It only
    shrinks: later updates never retry a size that failed, so an out-of-memory error
    that was transient (another process's memory, fragmentation) leaves the smaller size
    for the rest of the run, and its checkpoints; the update stays exact either way.
    ``out.metrics["micro_batch"]`` shows the size in use. Under ``distributed`` every
    process adopts the same size in one small all-reduce per attempt, and no pass runs
    inside a gradient synchronisation (see ``composetrain.transforms._deferred_sync``), so an
    out-of-memory error on one process neither hangs nor desynchronises the others. When
    a single sample does not fit, it raises ``torch.OutOfMemoryError`` with the state
    untouched.

    Args:
        n: the number of micro-batches, a positive int, or ``"auto"``.
        micro_batch: instead of ``n``, the number of samples per micro-batch, a positive int
            (the last micro-batch of a batch may hold fewer). Give exactly one of ``n`` and ``micro_batch``.
        weight: ``weight(micro_batch) -> number``: how many units the step's mean
            loss averages over (default: the leading size, i.e. samples). For a
            token-level loss with padding, count the real tokens, e.g.
            ``lambda b: (b["labels"] != -100).sum()``; for a model that shifts its labels
            inside its loss (Hugging Face causal LMs), ``ct.shifted_tokens()``. It must add up over a split,
            and it serves the whole composition (an inner accumulate uses it too).

    Returns:
        A transform: ``accumulate(n)(step) -> TrainStep``.

    Example:
        >>> train = ct.accumulate(4, weight=lambda b: (b[1] != -100).sum())(step)
        >>> out = train(state, (tokens, labels))     # one update, 4 forward+backward passes
        >>> ct.compose(ct.accumulate(2), ct.accumulate(8))(step)   # nests as well
        accumulate(2)(accumulate(8)(step))
        >>> ct.distributed(ct.mixed_precision(ct.accumulate(micro_batch=32)(step)))  # 32 samples per pass
        distributed(mixed_precision(accumulate(micro_batch=32)(step)))

    Notes:
        BatchNorm computes statistics per micro-batch, so with it the update is not
        exactly the large-batch one (PyTorch issue 46516); a warning says so.
        Dropout draws different masks than one large forward would: equal in
        distribution, not bit for bit. Weights returned as tensors on an accelerator
        are read once per update (one host sync): return Python numbers or CPU
        tensors to avoid it.
    """
    refuse_step(n, ACCUMULATE, "n", "accumulate(4)")
    if weight is not None and not callable(weight):
        raise TypeError(
            f"{ACCUMULATE}: weight must be a function micro_batch -> number of units, got {show(weight)}; "
            "e.g. weight=lambda b: (b['labels'] != -100).sum()"
        )
    if isinstance(n, str) and n == "auto" and micro_batch is not None:
        raise TypeError(
            f"{ACCUMULATE}: n='auto' and micro_batch={micro_batch!r} are both given; accumulate('auto') "
            "finds the micro-batch size itself (from the whole batch, halved on each out-of-memory error, and kept "
            f"in the TrainState) and accumulate(micro_batch={micro_batch!r}) fixes it: give one"
        )
    if isinstance(n, str) and n == "auto":
        return auto_transform(weight)
    if n is not None and micro_batch is not None:
        raise TypeError(
            f"{ACCUMULATE}: n={n!r} and micro_batch={micro_batch!r} are both given; "
            "give one: the number of micro-batches, accumulate(4), or their size, accumulate(micro_batch=8)"
        )
    if n is None and micro_batch is None:
        raise TypeError(
            f"{ACCUMULATE}: n must be a positive int, got None (NoneType), and micro_batch is not given either; give "
            "one: the number of micro-batches, e.g. accumulate(4), or their size, e.g. accumulate(micro_batch=8)"
        )
    if micro_batch is not None:
        m = check_int(micro_batch, ACCUMULATE, "micro_batch", example="accumulate(micro_batch=8)")
        return Transform(_label(m, weight, True), lambda step: _Accumulate(step, m, weight, by_size=True))
    n = check_int(n, ACCUMULATE, "n", example="accumulate(4), accumulate(1) for no split, or accumulate('auto')")
    return Transform(_label(n, weight), lambda step: _Accumulate(step, n, weight))


def _label(n: int, weight: WeightFn | None, by_size: bool = False) -> str:
    shown = f"micro_batch={n}" if by_size else f"{n}"
    return f"{ACCUMULATE}({shown})" if weight is None else f"{ACCUMULATE}({shown}, weight={name(weight)})"


class _Accumulate(TrainStep):
    refuses_inside = refused_inside("accumulate")

    def __init__(self, inner: TrainStep, n: int, weight: WeightFn | None, *, by_size: bool = False) -> None:
        self.n = n  # the number of micro-batches, or with by_size their size (micro_batch=)
        self.by_size = by_size
        self.own_weight = weight
        self.label = _label(n, weight, by_size)
        super().__init__(inner, weight=weight)
        # applied for the table's rules (pipeline refuses it inside), not a role it may hold once: it nests
        self.roles = self.roles | {"accumulate"}

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        inner = self._inner()
        who = self  # formatted only if an error needs it
        micros, weights = split_weighted(batch, self.n, ctx, who, "micro-batch", by_size=self.by_size)
        if len(micros) == 1:  # the batch as the plain step takes it
            return inner.grads(state, batch, ctx)
        warn_if_batchnorm(state.model, who)
        last = len(micros) - 1
        passes = [
            inner.grads(state, micro, ctx._replace(piece_weight=w, last_backward=ctx.last_backward and i == last))
            for i, (micro, w) in enumerate(zip(micros, weights, strict=True))
        ]
        return combine(passes, who)

    def check_batch_size(self, state: TrainState, size: int) -> None:
        pass  # its pieces are checked at the update (see TrainStep.check_batch_size)

    def forward_size(self, state: TrainState, size: int) -> int:
        # as split_weighted cuts it: pieces of n samples, the last one short, or n near-equal pieces
        largest = min(self.n, size) if self.by_size else -(-size // max(min(self.n, size), 1))
        return self._inner().forward_size(state, largest)

    def _config(self) -> tuple[Any, ...]:
        return (self.n, self.by_size, self.own_weight)

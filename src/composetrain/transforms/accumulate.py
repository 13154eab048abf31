"""accumulate(n): one update from n micro-batches, exactly the large-batch update."""

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
def accumulate(n: int | Literal["auto"], *, weight: WeightFn | None = None) -> Transform:
    """Split each batch into ``n`` micro-batches; forward+backward each; update once.

    Activation memory falls about ``n``-fold, and the update, loss and metrics are
    those of the plain step on the whole batch: every micro-batch's mean loss is
    weighted by its share of the batch's units, so uneven micro-batches (a batch of
    10 in 4 gives 3, 3, 2, 2) and token-level losses are exact. A batch smaller
    than ``n`` gives fewer micro-batches, never an empty one.

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
    if isinstance(n, str) and n == "auto":
        return auto_transform(weight)
    n = check_int(n, ACCUMULATE, "n", example="accumulate(4), accumulate(1) for no split, or accumulate('auto')")
    return Transform(_label(n, weight), lambda step: _Accumulate(step, n, weight))


def _label(n: int, weight: WeightFn | None) -> str:
    return f"{ACCUMULATE}({n})" if weight is None else f"{ACCUMULATE}({n}, weight={name(weight)})"


class _Accumulate(TrainStep):
    refuses_inside = refused_inside("accumulate")

    def __init__(self, inner: TrainStep, n: int, weight: WeightFn | None) -> None:
        self.n = n
        self.own_weight = weight
        self.label = _label(n, weight)
        super().__init__(inner, weight=weight)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        inner = self._inner()
        who = self  # formatted only if an error needs it
        micros, weights = split_weighted(batch, self.n, ctx, who, "micro-batch")
        if len(micros) == 1:  # the batch as the plain step takes it
            return inner.grads(state, batch, ctx)
        warn_if_batchnorm(state.model, who)
        last = len(micros) - 1
        passes = [
            inner.grads(state, micro, ctx._replace(piece_weight=w, last_backward=ctx.last_backward and i == last))
            for i, (micro, w) in enumerate(zip(micros, weights, strict=True))
        ]
        return combine(passes, who)

    def _config(self) -> tuple[Any, ...]:
        return (self.n, self.own_weight)

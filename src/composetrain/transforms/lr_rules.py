"""The learning-rate rule for large batches: scale with the batch, and warm up."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from composetrain.core.util import SCALED_LR, WARMUP, check_int, check_real, show

__all__ = ["scaled_lr", "warmup"]


def scaled_lr(base_lr: float, batch: int, base_batch: int, *, rule: str = "linear") -> float:
    """The learning rate for a global batch of ``batch`` samples, from one tuned at ``base_batch``.

    ``"linear"`` multiplies by ``batch / base_batch`` (Goyal et al. 2017, "Accurate, Large
    Minibatch SGD": SGD up to batches of about 8k on ImageNet, with warmup); ``"sqrt"``
    by its square root (Krizhevsky 2014; the rule that keeps the noise of Adam-type
    updates constant, Malladi et al. 2022). Either holds up to a critical batch size
    that depends on the task, beyond which larger batches stop paying; combine it with
    ``warmup``. The batch is the *global* one, per-process batch times processes,
    which ``ct.run`` logs as ``global_batch``.

    Args:
        base_lr: the learning rate tuned at ``base_batch``, a positive number.
        batch: the global batch now (samples per optimizer update, all processes together).
        base_batch: the global batch ``base_lr`` was tuned at.
        rule: ``"linear"`` (SGD) or ``"sqrt"`` (Adam, AdamW, LAMB).

    Returns:
        The scaled learning rate.

    Example:
        >>> lr = ct.scaled_lr(0.1, batch=256 * world_size, base_batch=256)       # 0.8 on 8 processes
        >>> opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        >>> sched = torch.optim.lr_scheduler.LambdaLR(opt, ct.warmup(500))    # 500 updates of warmup
        >>> train = ct.distributed(ct.accumulate("auto")(step))
    """
    base_lr = check_real(base_lr, SCALED_LR, "base_lr", example="scaled_lr(0.1, batch=1024, base_batch=256)")
    batch = check_int(batch, SCALED_LR, "batch", example="batch=per_process_batch * world_size")
    base_batch = check_int(base_batch, SCALED_LR, "base_batch", example="base_batch=256")
    if rule not in ("linear", "sqrt"):
        raise ValueError(
            f"{SCALED_LR}: rule must be 'linear' or 'sqrt', got {show(rule)}; 'linear' for SGD, 'sqrt' for Adam"
        )
    try:
        ratio = batch / base_batch
        lr = base_lr * (ratio if rule == "linear" else math.sqrt(ratio))
    except OverflowError:  # the ratio of two huge ints
        lr = math.inf
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(
            f"{SCALED_LR}: base_lr={base_lr!r} scaled from base_batch={base_batch} to batch={batch} by the {rule!r} "
            f"rule is not a positive finite learning rate (got {lr!r}); check batch and base_batch (samples per "
            "update, all processes together)"
        )
    return lr


def warmup(steps: int, *, start: float = 0.0, then: Callable[[int], float] | None = None) -> Callable[[int], float]:
    """A learning-rate multiplier for ``torch.optim.lr_scheduler.LambdaLR``: warm up linearly, then ``then``.

    Over the first ``steps`` updates the multiplier rises linearly from ``start`` to 1
    (update ``i`` gets ``start + (1 - start) * (i + 1) / steps``, so the first update
    already moves), then it is ``then(i - steps)`` (1 if not given): e.g. a cosine
    decay. Large scaled learning rates need it (Goyal et al. 2017 used 5 epochs). It is a
    plain function, so any torch scheduler takes it through ``LambdaLR``, and
    ``SequentialLR``/``ChainedScheduler`` combine it with others; ``TrainState``
    checkpoints the scheduler's position.

    Args:
        steps: warmup length in optimizer updates (0: no warmup).
        start: the multiplier before the first update, in [0, 1).
        then: the multiplier after warmup, as a function of the updates since it ended.

    Returns:
        ``multiplier(update) -> float``.

    Example:
        >>> cosine = lambda i: 0.5 * (1 + math.cos(math.pi * min(i, 9000) / 9000))
        >>> sched = torch.optim.lr_scheduler.LambdaLR(opt, ct.warmup(1000, then=cosine))
        >>> state = ct.TrainState(model, opt, sched)        # steps once per update
    """
    steps = check_int(steps, WARMUP, "steps", minimum=0, example="warmup(500)")
    if steps > 2**53:  # the multiplier divides a float by it: past 1e308 that raises, past 2**53 it rounds
        raise ValueError(f"{WARMUP}: steps must be at most 2**53 updates, got {show(steps)}; e.g. warmup(500)")
    given, start = start, check_real(start, WARMUP, "start", positive=False, example="start=0.0")
    if not 0 <= start < 1:
        raise ValueError(f"{WARMUP}: start must be in [0, 1), got {show(given)}; e.g. start=0.0")
    if then is not None and not callable(then):
        raise TypeError(f"{WARMUP}: then must be a function updates_after_warmup -> multiplier, got {show(then)}")

    def multiplier(update: int) -> float:
        if update < steps:
            return start + (1.0 - start) * (update + 1) / steps
        return 1.0 if then is None else _multiplier(then, update - steps)

    multiplier.__qualname__ = multiplier.__name__ = f"{WARMUP}({steps})"
    return multiplier


def _multiplier(then: Callable[[int], float], since: int) -> float:
    """``then(since)`` as a float, checked at every call: LambdaLR would multiply the learning rate by
    whatever it returns (a negative rate climbs the loss, NaN poisons the weights)."""
    value: object = then(since)
    number = math.nan
    if not isinstance(value, bool) and hasattr(type(value), "__float__"):  # str has no __float__
        # a torch tensor of several numbers (RuntimeError), an int past 1e308 (OverflowError)
        with contextlib.suppress(TypeError, ValueError, RuntimeError, OverflowError):
            number = float(value)  # type: ignore[arg-type]  # a Python, NumPy or one-element torch number
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(
            f"{WARMUP}: then({since}) returned {show(value)}; it must return a finite number >= 0, the multiplier of "
            f"the learning rate {since} update(s) after warmup (then={getattr(then, '__qualname__', then)})"
        )
    return number

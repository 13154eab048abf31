"""The one rule for metric names (pitfall 36), checked where a step returns them: in the TrainStep's pass,
before its backward and update (a refusal after the update is none), and by ``ct.run`` for ``eval_step``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from composetrain.core.util import RUN, show

__all__ = ["EVAL_FIELDS", "MEASURED", "TRAIN_FIELDS", "metric_names"]

# The fields ct.run writes in its records besides the metrics: a metric of the same name would overwrite one.
# "eval" is the key that tells an evaluation record from a training one in the metrics file.
# The fields that measure the machine, not the training: they differ from run to run (and a resumed run's from the
# uninterrupted one's) where everything else is equal
MEASURED = frozenset(
    {"updates_per_s", "data_wait", "samples_per_s", "tokens_per_s", "flops_per_update", "mfu", "peak_memory_mib"}
    | {"stragglers"}  # the ranks the others waited for, in a window where one was
)
TRAIN_FIELDS = frozenset(
    {"step", "epoch", "loss", "lr", "lr_groups", "skipped", "global_batch", "eval"}
    | MEASURED
    | {"compiles", "compile_s"}  # torch.compile's compilations in the window and their seconds, once there are any
)
# an evaluation's metrics are nested under "eval" in the file, those of ct.ema's weights under "eval_ema"
EVAL_FIELDS = frozenset({"step", "epoch", "eval", "eval_ema"})


def metric_names(metrics: Mapping[Any, Any], fields: frozenset[str], whose: str, who: object = RUN) -> dict[str, Any]:
    """``metrics`` named by plain ``str``: the one rule for metric names, which are keys of the log records
    and of the checkpoint (saved and loaded as exact ``str``). A ``str`` subclass (``StrEnum``, ``np.str_``)
    becomes the plain ``str`` it holds; any other name, one UTF-8 cannot encode, one of the record's own
    ``fields``, or two names of the same text (a subclass with its own ``__hash__`` or ``__eq__`` is a key
    beside its text), is refused. ``whose``: "the step" or "eval_step"; ``who`` starts the message (the
    TrainStep, or ``run``)."""
    plain: dict[str, Any] = {}
    keys: dict[Any, Any] = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise TypeError(
                f"{who}: {whose} returns metric {show(k)}; metric names must be str (they are keys of the log "
                f"records and of the checkpoint): name it, e.g. 'class_0' for 0, {{f'class_{{i}}': value}}"
            )
        name = k if type(k) is str else str.__str__(k)  # the text itself, whatever the subclass's __str__ says
        try:
            name.encode()
        except UnicodeEncodeError:  # a lone surrogate (surrogateescape): TensorBoard's writer fails on it
            raise ValueError(
                f"{who}: {whose} returns metric {name!r}, which UTF-8 cannot encode (a lone surrogate, from a "
                "byte string decoded with surrogateescape); name it in text: name.encode(errors='replace').decode()"
            ) from None
        if name in fields:
            kind = "training" if fields is TRAIN_FIELDS else "evaluation"
            raise ValueError(
                f"{who}: {whose} returns metric {name!r}, a name ct.run's {kind} records use for their own field "
                f"(reserved: {sorted(fields)}); rename it in {'the step' if whose == 'the step' else whose}, "
                f"e.g. {(('train_' if kind == 'training' else 'eval_') + name)!r}"
            )
        if name in plain:  # a subclass with its own __hash__ or __eq__: a dict holds it beside its text
            raise ValueError(
                f"{who}: {whose} returns two metrics named {name!r} ({keys[name]!r} and {k!r}); one would overwrite "
                "the other in the records: give them different names"
            )
        plain[name], keys[name] = v, k
    return plain

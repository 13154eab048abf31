"""What TrainState checks before it writes a checkpoint into itself, or before an update (internal).

A checkpoint of another model, optimizer or scheduler must be refused before anything
is written: ``nn.Module.load_state_dict`` copies entry by entry and
``Optimizer.load_state_dict`` accepts another optimizer's state and fails only at
the next update. Each check raises ``ValueError`` (``TypeError`` for a wrong kind of
value) with a message that ends in the fix.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from composetrain.core.util import LOAD_STATE, show

__all__ = [
    "check_loaded_groups",
    "check_model_state",
    "check_optimizer_state",
    "check_schedule_left",
    "check_scheduler_state",
    "exhausted",
    "hyperparameters",
    "needs_closure",
    "qualified",
    "step_needs",
]

# The per-parameter state each of torch.optim's optimizers may keep (all its options together): an
# older checkpoint, saved without its optimizer's class, is recognised as another optimizer's by it.
_STATE_KEYS: dict[str, frozenset[str]] = {
    "SGD": frozenset({"momentum_buffer"}),
    "Muon": frozenset({"momentum_buffer"}),
    "Adam": frozenset({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}),
    "AdamW": frozenset({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}),
    "RAdam": frozenset({"step", "exp_avg", "exp_avg_sq"}),
    "SparseAdam": frozenset({"step", "exp_avg", "exp_avg_sq"}),
    "NAdam": frozenset({"step", "mu_product", "exp_avg", "exp_avg_sq"}),
    "Adamax": frozenset({"step", "exp_avg", "exp_inf"}),
    "Adagrad": frozenset({"step", "sum"}),
    "Adadelta": frozenset({"step", "square_avg", "acc_delta"}),
    "RMSprop": frozenset({"step", "square_avg", "momentum_buffer", "grad_avg"}),
    "Rprop": frozenset({"step", "prev", "step_size"}),
    "ASGD": frozenset({"step", "eta", "mu", "ax"}),
    "Adafactor": frozenset({"step", "row_var", "col_var", "variance"}),
}


# what a parameter group holds besides hyperparameters
_NOT_HYPER = frozenset({"params", "param_names"})


def hyperparameters(group: Mapping[str, Any]) -> set[str]:
    return set(group.keys() - _NOT_HYPER)


def qualified(obj: object) -> str:
    """The class of ``obj`` as a plain string, e.g. ``torch.optim.adamw.AdamW`` (checkpoints hold no classes)."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _from_torch(obj: object) -> bool:
    return type(obj).__module__.startswith("torch.optim")


def needs_closure(optimizer: torch.optim.Optimizer) -> list[str]:
    """The arguments ``optimizer.step()`` cannot do without (LBFGS's closure); empty for most optimizers."""
    return _step_needs(optimizer, own=False)  # a scheduler wraps the instance's step, keeping ``self``


def step_needs(scheduler: Any) -> list[str]:
    """The arguments ``scheduler.step()`` cannot do without (timm's ``epoch``); empty for torch's schedulers
    but ReduceLROnPlateau (its ``metrics``)."""
    return _step_needs(scheduler, own=True)


def _step_needs(obj: Any, own: bool) -> list[str]:
    """The required arguments of the class's ``step``, or (``own``) of a step set on the instance."""
    method, bound = getattr(type(obj), "step", None), 1
    if (own and "step" in getattr(obj, "__dict__", {})) or not callable(method):  # the instance's: no ``self``
        method, bound = obj.step, 0
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):  # a builtin without a signature: assume step() works
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    after_self = list(signature.parameters.values())[bound:]
    return [p.name for p in after_self if p.default is p.empty and p.kind not in variadic]


def check_model_state(model: nn.Module, saved: Any) -> None:
    """Same keys; every tensor entry a tensor of the same shape and dtype, so the copy cannot fail halfway."""
    if not isinstance(saved, Mapping):
        raise TypeError(f"{LOAD_STATE}: state_dict['model'] must be a mapping, got {show(saved)}")
    own = model.state_dict()
    missing = sorted(own.keys() - saved.keys())
    unexpected = sorted(map(str, saved.keys() - own.keys()))
    wrong = []
    for key, value in own.items():
        if key not in saved or not isinstance(value, torch.Tensor):  # extra state (set_extra_state) is free-form
            continue
        theirs = saved[key]
        if not isinstance(theirs, torch.Tensor):
            wrong.append(f"{key}: {show(theirs)}, not a tensor")
        elif theirs.shape != value.shape:
            wrong.append(f"{key}: {tuple(theirs.shape)} vs {tuple(value.shape)}")
        elif theirs.dtype != value.dtype:  # a cast would not resume bit-exactly
            wrong.append(f"{key}: {theirs.dtype} vs {value.dtype}")
    if missing or unexpected or wrong:
        raise ValueError(
            f"{LOAD_STATE}: the checkpoint's model does not match this model (missing keys {missing[:5]}, "
            f"unexpected keys {unexpected[:5]}, mismatched entries (checkpoint vs model) {wrong[:5]}); "
            "load a checkpoint saved from the same architecture, in the same dtype"
        )


def check_optimizer_state(
    optimizer: torch.optim.Optimizer, model: nn.Module, saved: Any, saved_class: str | None
) -> None:
    """The same optimizer class, parameter groups and hyperparameter names; state shaped like its parameters."""
    if not (isinstance(saved, Mapping) and isinstance(saved.get("param_groups"), list)):
        raise TypeError(
            f"{LOAD_STATE}: state_dict['optimizer'] must come from Optimizer.state_dict(), got {show(saved)}"
        )
    per_param, groups = saved.get("state"), saved["param_groups"]
    if not (isinstance(per_param, Mapping) and all(isinstance(g, Mapping) and "params" in g for g in groups)):
        raise TypeError(
            f"{LOAD_STATE}: state_dict['optimizer'] must come from Optimizer.state_dict(), got {show(saved)}"
        )
    _same_class("optimizer", saved_class, optimizer)
    own = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [len(g["params"]) for g in groups]
    if own != theirs:
        added = ""
        if len(theirs) > len(own) and theirs[: len(own)] == own:  # as when a hook unfreezes layers mid-run
            added = (
                f" (the checkpoint's has {len(theirs) - len(own)} group(s) more after the same first {len(own)}: "
                "groups added during the run, by optimizer.add_param_group in a hook such as on_epoch_end, are "
                "not added again before a resume loads: add them to the optimizer before resuming, or build it "
                "with every group from the start)"
            )
        raise ValueError(
            f"{LOAD_STATE}: the checkpoint's optimizer has parameter groups of sizes {theirs}, this one {own}{added}; "
            "load a checkpoint saved with the same optimizer over the same parameters"
        )
    kind = type(optimizer).__name__
    for i, (g_own, g_saved) in enumerate(zip(optimizer.param_groups, groups, strict=True)):
        # an older checkpoint's class shows in its hyperparameters (a newer torch, or a scheduler
        # that was dropped, may add some to the same class's)
        unexpected = sorted(map(str, hyperparameters(g_saved) - hyperparameters(g_own)))
        if saved_class is None and unexpected:
            raise ValueError(
                f"{LOAD_STATE}: parameter group {i} of the checkpoint's optimizer has hyperparameters {unexpected} "
                f"that {kind} does not have (saved from another optimizer?); load a checkpoint saved with {kind}"
            )
    _check_state_keys(optimizer, per_param)
    # parameters are matched by position, as Optimizer.load_state_dict does
    saved_ids = itertools.chain.from_iterable(g["params"] for g in groups)
    params = dict(zip(saved_ids, optimizer_params(optimizer), strict=True))
    names = {id(p): n for n, p in model.named_parameters()}
    for index, entries in per_param.items():
        if index not in params or not isinstance(entries, Mapping):
            raise TypeError(
                f"{LOAD_STATE}: the checkpoint's optimizer state has {show(entries)} under {index!r}, which is not "
                "the state of a parameter in its groups; pass what Optimizer.state_dict() returned"
            )
        param = params[index]
        for key, value in entries.items():
            if isinstance(value, torch.Tensor) and not _fits(optimizer, param, key, value):
                raise ValueError(
                    f"{LOAD_STATE}: the checkpoint's optimizer state {key!r} of parameter {index} has shape "
                    f"{tuple(value.shape)}, but this optimizer's parameter {index} "
                    f"({names.get(id(param), 'not in the model')}) has shape {tuple(param.shape)}; the parameters "
                    "are in another order (layers defined or param groups listed in another order): build the "
                    "model and optimizer as they were when the checkpoint was saved"
                )


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _check_state_keys(optimizer: torch.optim.Optimizer, per_param: Mapping[Any, Any]) -> None:
    """A torch.optim optimizer refuses per-parameter state it never keeps: another optimizer's."""
    allowed = _STATE_KEYS.get(type(optimizer).__name__) if _from_torch(optimizer) else None
    found = {k for entries in per_param.values() if isinstance(entries, Mapping) for k in entries}
    if allowed is None or found <= allowed:
        return
    likely = [n for n, keys in _STATE_KEYS.items() if found <= keys]
    kind = type(optimizer).__name__
    raise ValueError(
        f"{LOAD_STATE}: the checkpoint's optimizer state holds {sorted(map(str, found))} per parameter, which {kind} "
        f"never keeps (saved from {' or '.join(likely) or 'another optimizer'}?); load a checkpoint saved with {kind}"
    )


def _fits(optimizer: torch.optim.Optimizer, param: torch.Tensor, key: str, value: torch.Tensor) -> bool:
    """Whether a state tensor can belong to ``param``.

    The optimizer's own state for the parameter, if it has some, says the shape. Otherwise
    torch.optim's optimizers keep scalars and tensors shaped like the parameter, or
    broadcastable to it (Adafactor's row and column factors); other optimizers (8-bit,
    preconditioners) are not second-guessed.
    """
    live = optimizer.state.get(param, {}).get(key)
    if isinstance(live, torch.Tensor):
        return live.shape == value.shape
    if not _from_torch(optimizer) or value.dim() == 0:
        return True
    return value.dim() == param.dim() and all(a in (b, 1) for a, b in zip(value.shape, param.shape, strict=True))


def check_loaded_groups(optimizer: torch.optim.Optimizer, before: list[set[str]]) -> None:
    """After loading: every hyperparameter the optimizer had is still there.

    Checked after ``load_state_dict``, because optimizers fill in the hyperparameters an
    older torch did not save; what is still missing came from another optimizer.
    """
    kind = type(optimizer).__name__
    for i, (group, keys) in enumerate(zip(optimizer.param_groups, before, strict=True)):
        missing = sorted(keys - hyperparameters(group))
        if missing:
            raise ValueError(
                f"{LOAD_STATE}: parameter group {i} of the checkpoint's optimizer lacks hyperparameters {missing} that "
                f"{kind} needs (saved from another optimizer?); load a checkpoint saved with {kind}"
            )


def check_scheduler_state(scheduler: Any, saved: Any, saved_class: str | None) -> None:
    """A scheduler state from the same class; one saved without its class must not hold another's entries."""
    has, was = scheduler is not None, saved is not None
    if has != was:
        raise ValueError(
            f"{LOAD_STATE}: the checkpoint {'has' if was else 'has no'} scheduler state but this "
            f"TrainState {'has' if has else 'has no'} scheduler; build the state the way it was saved"
        )
    if scheduler is None:
        return
    if not isinstance(saved, Mapping):
        raise TypeError(
            f"{LOAD_STATE}: state_dict['scheduler'] must come from a scheduler's state_dict(), got {show(saved)}"
        )
    _same_class("scheduler", saved_class, scheduler)
    unexpected = sorted(map(str, saved.keys() - scheduler.state_dict().keys()))
    if saved_class is None and unexpected:
        raise ValueError(
            f"{LOAD_STATE}: the checkpoint's scheduler state has entries {unexpected[:5]} that "
            f"{type(scheduler).__name__} does not keep (saved from another scheduler?); build the TrainState with "
            "the scheduler the checkpoint was saved with"
        )


def exhausted(scheduler: Any) -> tuple[Any, int, int] | None:
    """The scheduler that the next ``scheduler.step()`` would step past its ``total_steps`` (OneCycleLR), with
    that horizon and the steps it took, or None: the scheduler itself, or one inside ``SequentialLR`` (the one
    its milestones select next) or ``ChainedScheduler`` (each)."""
    for stepped in _stepped_next(scheduler):
        total, taken = getattr(stepped, "total_steps", None), getattr(stepped, "last_epoch", None)
        if isinstance(total, int) and isinstance(taken, int) and taken >= total:
            return stepped, total, taken
    return None


def _stepped_next(scheduler: Any) -> list[Any]:
    """The schedulers whose own ``step()`` the next ``scheduler.step()`` calls."""
    lr = torch.optim.lr_scheduler
    if isinstance(scheduler, lr.ChainedScheduler):
        return [s for inner in scheduler._schedulers for s in _stepped_next(inner)]
    if isinstance(scheduler, lr.SequentialLR):
        upcoming = scheduler.last_epoch + 1  # as SequentialLR.step counts
        i = bisect.bisect_right(scheduler._milestones, upcoming)
        if i > 0 and scheduler._milestones[i - 1] == upcoming:  # restarted at its milestone, not stepped
            return []
        return _stepped_next(scheduler._schedulers[i])
    return [scheduler]


def check_schedule_left(scheduler: Any, step: int, who: object) -> None:
    """Refuse an update the scheduler has no step left for (OneCycleLR past ``total_steps``, also inside
    SequentialLR or ChainedScheduler).

    Checked before the update starts: the scheduler's own error comes after
    ``optimizer.step()`` has changed the parameters.
    """
    found = exhausted(scheduler)
    if found is not None:
        stepped, total, taken = found
        inside = "" if stepped is scheduler else f" (inside {type(scheduler).__name__})"
        raise ValueError(
            f"{who!r}: the scheduler {type(stepped).__name__}{inside} is exhausted: it was built for "
            f"total_steps={total} updates and has taken {taken}; build it with total_steps of at least the number "
            f"of updates you train for, or stop there: ct.run(..., max_steps={step})"
        )


def _same_class(what: str, saved_class: Any, live: object) -> None:
    """A checkpoint that names its optimizer's or scheduler's class must name this one's."""
    mine = qualified(live)
    if saved_class is not None and saved_class != mine:
        raise ValueError(
            f"{LOAD_STATE}: the checkpoint's {what} is {saved_class}, this TrainState's is {mine}; build the "
            f"TrainState with the {what} the checkpoint was saved with"
        )

"""TrainState: all mutable training state, in one object that a checkpoint sees whole."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from composetrain.core._rollback import keep_model, keep_optimizer, keep_through_state_dict, undo_all
from composetrain.core._state_checks import (
    check_loaded_groups,
    check_model_state,
    check_optimizer_state,
    check_scheduler_state,
    exhausted,
    hyperparameters,
    needs_closure,
    qualified,
)
from composetrain.core.scheduling import as_metric, scheduler_kind
from composetrain.core.util import LOAD_STATE, check_int, show

__all__ = ["INTERVALS", "KEYS", "RuntimeState", "TrainState"]

INTERVALS = ("update", "epoch")  # when TrainState's scheduler steps (Lightning's "step" and "epoch")

# What TrainState.state_dict() always holds, so what load_state_dict and a checkpoint's reader require (it also
# holds "optimizer_class" and "scheduler_class", which older checkpoints lack).
KEYS = frozenset({"model", "optimizer", "scheduler", "step", "transforms"})

T = TypeVar("T")


class RuntimeState:
    """Transform state rebuilt on demand and never checkpointed: a DDP wrapper, replicas, hooks.

    Subclass it for what a transform keeps in ``TrainState.transform_state`` but a
    checkpoint must not carry (it holds modules or threads, and is cheap to rebuild).
    """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, saved: Any) -> None:
        pass

    def release(self) -> None:
        """Let go of what is bound to the process group (a DDP wrapper); rebuilt on next use."""


class TrainState:
    """All mutable training state: model, optimizer, scheduler, update count, transform state.

    Args:
        model: the module being trained.
        optimizer: a ``torch.optim.Optimizer`` over (some of) the model's parameters.
        scheduler: an optional scheduler of that optimizer (``core/scheduling.py`` says how each kind steps):
            a ``torch.optim.lr_scheduler.LRScheduler`` (or any scheduler whose ``step()`` takes no argument),
            stepped once per applied optimizer update, or once per epoch; one that steps both by update and
            by epoch, as timm's do (``step_update(num_updates)`` after each applied update, ``step(epoch)`` at
            each epoch's end, as timm's ``train.py`` calls them); or ``ReduceLROnPlateau`` (with
            ``scheduler_interval="epoch"``), stepped with a metric at each epoch's end.
        scheduler_interval: ``"update"`` (default): the scheduler steps after each applied
            update, inside the TrainStep; ``"epoch"``: it steps at each epoch's end only, when
            ``end_epoch()`` is called (``ct.run`` calls it), for schedules whose numbers count
            epochs (torchvision's recipes: ``CosineAnnealingLR(T_max=epochs)``). Lightning's
            ``lr_scheduler_config["interval"]``, whose ``"step"`` is ``"update"`` here. A scheduler that
            steps both ways takes the default.

    Attributes:
        step: optimizer updates applied so far (skipped updates do not count).
        epoch: epochs ended so far (``end_epoch()`` calls), checkpointed with the state.
        unusable: None, or why this state cannot train any more (a transform that failed half-way
            through changing it, which torch cannot undo, says so here; every step then refuses it).

    Example:
        >>> model = nn.Linear(4, 2)
        >>> state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> out = ct.accumulate(2)(lambda m, b: m(b).pow(2).mean())(state, torch.ones(8, 4))
        >>> state.step
        1
        >>> epochs = ct.TrainState(model, opt, CosineAnnealingLR(opt, T_max=90), scheduler_interval="epoch")
        >>> for epoch in range(90):
        ...     for batch in loader:
        ...         train(epochs, batch)           # the scheduler does not step here
        ...     epochs.end_epoch()                 # it steps here, once per epoch
        >>> timm = ct.TrainState(model, opt, timm.scheduler.CosineLRScheduler(opt, t_initial=90))
        >>> plateau = ct.TrainState(model, opt, ReduceLROnPlateau(opt), scheduler_interval="epoch")
        >>> plateau.end_epoch(metric=val_loss)      # ct.run(..., scheduler_metric="eval.loss") does it
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,  # an LRScheduler, ReduceLROnPlateau, a timm Scheduler, or None: see Args
        *,
        scheduler_interval: str = "update",
    ) -> None:
        if scheduler_interval not in INTERVALS:
            fix = " (Lightning's 'step' is 'update' here)" if scheduler_interval == "step" else ""
            raise ValueError(
                f"TrainState: scheduler_interval must be 'update' or 'epoch', got {show(scheduler_interval)}{fix}; "
                "'epoch' for a schedule whose numbers count epochs (T_max=epochs), else leave the default"
            )
        if not isinstance(model, nn.Module):
            raise TypeError(f"TrainState: model must be a torch.nn.Module, got {show(model)}")
        if isinstance(getattr(model, "_orig_mod", None), nn.Module) and type(model).__name__ == "OptimizedModule":
            raise TypeError(
                f"TrainState: model is torch.compile(model) (an OptimizedModule around {type(model._orig_mod).__name__}"
                "), whose state_dict keys gain the prefix '_orig_mod.', so its checkpoints would not load into the "
                "plain model; pass the plain model and compile the step instead: ct.compile(step) (or compile the "
                "model in place with model.compile(), which keeps its keys)"
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"TrainState: optimizer must be a torch.optim.Optimizer, got {show(optimizer)}; "
                "build one over the model, e.g. torch.optim.SGD(model.parameters(), lr=0.1)"
            )
        needed = needs_closure(optimizer)
        if needed:
            raise TypeError(
                f"TrainState: optimizer {type(optimizer).__name__}'s step() needs {needed} (a closure re-evaluating "
                "the loss within one update), which a TrainStep's single forward and backward cannot give; use an "
                "optimizer whose step() needs no argument, e.g. torch.optim.AdamW(model.parameters())"
            )
        own = {id(p) for p in model.parameters()}
        held = [p for group in optimizer.param_groups for p in group["params"]]
        if held and not any(id(p) in own for p in held):
            raise ValueError(
                "TrainState: none of the optimizer's parameters belong to the model, so training would change "
                "nothing; build the optimizer over this model: torch.optim.SGD(model.parameters(), ...)"
            )
        kind = "torch"
        if scheduler is not None:
            if not all(callable(getattr(scheduler, m, None)) for m in ("step", "state_dict", "load_state_dict")):
                raise TypeError(
                    f"TrainState: scheduler must be a torch.optim.lr_scheduler.LRScheduler or None, "
                    f"got {show(scheduler)}; e.g. torch.optim.lr_scheduler.StepLR(optimizer, 1000)"
                )
            kind = scheduler_kind(scheduler, scheduler_interval)
            if getattr(scheduler, "optimizer", optimizer) is not optimizer:
                raise ValueError(
                    "TrainState: scheduler was built for a different optimizer than the one given; "
                    "build it as Scheduler(optimizer, ...) with this state's optimizer"
                )
        self.model = model
        self.optimizer = optimizer
        self.scheduler: Any = scheduler
        self.scheduler_interval = INTERVALS[INTERVALS.index(scheduler_interval)]  # a plain str, as a checkpoint holds
        self.scheduler_kind = kind  # how it steps: core/scheduling.py
        self.step = 0
        self.epoch = 0
        # parameters the optimizer does not hold: their gradients are cleared too. Found once, not per update,
        # and frozen ones included: a parameter unfrozen later would otherwise keep a growing .grad
        held_ids = {id(p) for p in held}
        self._unheld = [p for p in model.parameters() if id(p) not in held_ids]
        self._transforms: dict[str, Any] = {}  # state owned by transforms (loss scale, ...), by key
        self._pending: dict[str, Any] = {}  # loaded from a checkpoint, not yet claimed by its transform
        # why the state cannot train any more (a transform failed half-way through changing it), or None
        self.unusable: str | None = None
        # set by a transform that keeps only part of the model on this process (ct.pipeline's stage): its
        # whole(state_dict) turns this process's state into the whole model's, which checkpoints hold (a
        # collective), and own(state_dict) takes this process's part back out; None: the state is whole here
        self.view: Any = None

    def transform_state(self, key: str, create: Callable[[], T]) -> T:
        """The state a transform keeps here under ``key``, created on first use.

        Transforms keep everything that changes while training here, never in
        closures, so that ``state_dict()`` sees it. Objects with ``state_dict()`` /
        ``load_state_dict()`` (a ``GradScaler``) are checkpointed through them;
        other values (tensors, numbers) as they are. A value loaded from a
        checkpoint before its transform first ran is applied when it is created.

        Args:
            key: the transform's name for its state, e.g. ``"mixed_precision"``.
            create: builds the initial state.

        Returns:
            The (live) state object.
        """
        try:
            return self._transforms[key]
        except KeyError:
            value = create()
            if key in self._pending:
                value = _restore(value, self._pending[key])
                del self._pending[key]  # only once it applied: a failed restore can be retried
            self._transforms[key] = value
            return value

    def release_runtime(self) -> None:
        """Let transforms drop what is bound to the process group: the DDP wrapper, FSDP2's hold on it.

        A DDP wrapper, or a model sharded by FSDP2, keeps its process group alive: call this
        before ``destroy_process_group`` (``ct.run`` does, for a group it created: at its end, or when
        the process exits if the model is sharded, which needs the group to gather), or the
        group's threads outlive it and may crash the interpreter's exit. The next step
        rebuilds what it needs; a stateful communication hook (PowerSGD's error
        feedback, kept per bucket) then starts again with the new wrapper's buckets. A
        sharded model cannot be rebuilt (its local shards stay readable): its next step
        refuses it.
        """
        for value in self._transforms.values():
            if isinstance(value, RuntimeState):
                value.release()

    def end_epoch(self, metric: float | None = None) -> None:
        """The end of an epoch: ``state.epoch`` counts it, and a scheduler that steps per epoch steps, once.

        ``ct.run`` calls it after each epoch's last update, before that epoch's checkpoint and evaluation, as
        torchvision's recipe calls ``lr_scheduler.step()`` after ``train_one_epoch`` (for a scheduler fed a metric:
        after the evaluation, with its metric); a plain loop calls it after each epoch. A per-update scheduler
        (the default) steps in the TrainStep instead: for it only the count moves, so a loop may always call it.
        A scheduler that steps both ways (timm's) gets ``step(epoch)`` with the epochs ended, as timm's
        ``train.py`` calls ``lr_scheduler.step(epoch + 1, metric)``; one fed a metric (``ReduceLROnPlateau``,
        timm's ``PlateauLRScheduler``) needs ``metric``. Every refusal comes before anything changed.

        Args:
            metric: the metric a scheduler steps on (a validation loss, a Python or NumPy number: ``loss.item()``), or
                None. NaN is passed on as it is: ``ReduceLROnPlateau`` takes it as no improvement.
        """
        value = as_metric(metric, self.scheduler, self.scheduler_kind)
        scheduler, kind = self.scheduler, self.scheduler_kind
        if scheduler is not None and kind == "torch" and self.scheduler_interval == "epoch":
            found = exhausted(scheduler)
            if found is not None:  # before step() changes it
                stepped, total, taken = found
                inside = "" if stepped is scheduler else f" (inside {type(scheduler).__name__})"
                raise ValueError(
                    f"TrainState.end_epoch: the scheduler {type(stepped).__name__}{inside} is exhausted: it was "
                    f"built for total_steps={total} epochs and has taken {taken}; build it with total_steps of at "
                    "least the number of epochs you train for"
                )
            scheduler.step()
        elif kind == "metric":
            scheduler.step(value)
        elif kind == "both":
            scheduler.step(self.epoch + 1) if value is None else scheduler.step(self.epoch + 1, value)
        self.epoch += 1

    def zero_grad(self) -> None:
        """Set every gradient of the optimizer, and of the model's other parameters, to None."""
        self.optimizer.zero_grad(set_to_none=True)
        for p in self._unheld:
            p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: model, optimizer, scheduler, step, transform state.

        Like ``nn.Module.state_dict``, tensors are references to the live ones:
        save or deep-copy the result before training on. Global random number
        generators are not included (``ct.run`` checkpoints those). It holds tensors and
        plain values only (classes as strings), so ``torch.load(..., weights_only=True)``
        reads it back. When the model is split across processes (``ct.pipeline``), it is the
        whole model's state on every process, gathered from the stages (a collective: call it on every rank).
        """
        saved = {k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in self._transforms.items()}
        here = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_class": qualified(self.optimizer),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "scheduler_class": None if self.scheduler is None else qualified(self.scheduler),
            "scheduler_interval": self.scheduler_interval,
            "step": self.step,
            "epoch": self.epoch,
            "transforms": {**self._pending, **saved},
        }
        return here if self.view is None else self.view.whole(here)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what ``state_dict()`` returned; continuing then is bit-identical.

        All or nothing: a checkpoint of another model, optimizer (class, parameter
        groups, hyperparameters, state shapes) or scheduler raises before anything is
        written, and should a write still fail, what was written is restored.
        """
        if self.view is not None and isinstance(state_dict, Mapping) and set(state_dict) >= KEYS:
            # the whole model's state: this process's part of it, checked on every part before any is written (a
            # stage that loaded beside one that refused would leave the job half resumed)
            problem: Exception | None = None
            try:
                state_dict = self.view.own(state_dict)
                step, epoch, transforms = self._check(state_dict)
            except Exception as e:
                problem = e
            self.view.agree(problem, LOAD_STATE)
            assert problem is None  # agree raised it otherwise
        else:
            step, epoch, transforms = self._check(state_dict)
        before = [hyperparameters(g) for g in self.optimizer.param_groups]
        undo: list[Callable[[], None]] = []  # restores what each write changed, should a later one fail
        try:
            # the model last: it is the one write that cannot be undone without a copy
            undo.append(keep_optimizer(self.optimizer))
            self.optimizer.load_state_dict(state_dict["optimizer"])
            check_loaded_groups(self.optimizer, before)
            if self.scheduler is not None:
                undo.append(keep_through_state_dict(self.scheduler))
                self.scheduler.load_state_dict(state_dict["scheduler"])
            undo.append(self._keep_transforms())
            # transform state is exactly the checkpoint's: live objects are reloaded, the rest is
            # applied when its transform first runs, and state the checkpoint lacks starts afresh; runtime
            # state is no checkpoint's (a DDP wrapper, the group a model is sharded over) and stays, also when
            # the checkpoint was saved where it did not exist (on one process, distributed and sharded are
            # the plain step: resumed on several, the model is sharded already)
            self._transforms = {
                k: _restore(v, transforms[k]) if k in transforms else v
                for k, v in self._transforms.items()
                if k in transforms or isinstance(v, RuntimeState)
            }
            self._pending = {k: v for k, v in transforms.items() if k not in self._transforms}
            undo.append(keep_model(self.model))
            self.model.load_state_dict(state_dict["model"])
        except BaseException as error:
            undo_all(undo, error)
            raise
        self.step, self.epoch = step, epoch

    def _check(self, state_dict: Any) -> tuple[int, int, Mapping[str, Any]]:
        """Everything that can be checked before writing; returns the step, the epochs and the transform state."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"{LOAD_STATE}: state_dict must be a mapping from TrainState.state_dict(), got {show(state_dict)}"
            )
        missing = KEYS - set(state_dict)
        if missing:
            raise ValueError(
                f"{LOAD_STATE}: state_dict lacks {sorted(missing)}; pass what TrainState.state_dict() returned"
            )
        classes = {k: state_dict.get(k) for k in ("optimizer_class", "scheduler_class")}  # older checkpoints lack them
        for key, value in classes.items():
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{LOAD_STATE}: state_dict[{key!r}] must be a class name (str), got {show(value)}")
        check_model_state(self.model, state_dict["model"])
        check_scheduler_state(self.scheduler, state_dict["scheduler"], classes["scheduler_class"])
        interval = state_dict.get("scheduler_interval", "update")  # older checkpoints lack it: per update
        if self.scheduler is not None and interval != self.scheduler_interval:
            raise ValueError(
                f"{LOAD_STATE}: the checkpoint's scheduler stepped once per {show(interval)}, this TrainState's "
                f"steps once per {self.scheduler_interval!r}; build it with scheduler_interval={interval!r}, "
                "as it was saved (its position counts those)"
            )
        check_optimizer_state(self.optimizer, self.model, state_dict["optimizer"], classes["optimizer_class"])
        step = check_int(
            state_dict["step"], LOAD_STATE, "step", minimum=0, example="the step TrainState.state_dict() saved"
        )
        saved_epoch = state_dict.get("epoch", 0)  # older checkpoints lack it: 0, read by a scheduler stepping both ways
        epoch = check_int(saved_epoch, LOAD_STATE, "epoch", minimum=0, example="the epoch state_dict() saved")
        transforms = state_dict["transforms"]
        if not isinstance(transforms, Mapping) or not all(isinstance(k, str) for k in transforms):
            raise TypeError(
                f"{LOAD_STATE}: state_dict['transforms'] must map transform names (str) to their state, got "
                f"{show(transforms)}; pass what TrainState.state_dict() returned"
            )
        return step, epoch, transforms

    def _keep_transforms(self) -> Callable[[], None]:
        live, pending = dict(self._transforms), dict(self._pending)
        undos = [keep_through_state_dict(v) for v in live.values() if hasattr(v, "load_state_dict")]

        def restore() -> None:
            for undo in undos:
                undo()
            self._transforms, self._pending = live, pending

        return restore

    def __repr__(self) -> str:
        sched = type(self.scheduler).__name__ if self.scheduler is not None else None
        per = ", scheduler_interval='epoch'" if self.scheduler_interval == "epoch" else ""
        return (
            f"TrainState(step={self.step}, model={type(self.model).__name__}, "
            f"optimizer={type(self.optimizer).__name__}, scheduler={sched}{per})"
        )


def _restore(value: Any, saved: Any) -> Any:
    if hasattr(value, "load_state_dict"):
        value.load_state_dict(saved)
        return value
    return saved

"""ct.run: the small driver. Loaders, devices, rendezvous, logging, evaluation, checkpoints."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sized
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from composetrain._run_checks import check_arguments, loader_options
from composetrain._sharded_checkpoint import ShardFiles
from composetrain._util import show
from composetrain._waiting import Waiting
from composetrain.checkpoint import Checkpoints
from composetrain.core import StepOutput, TrainStep
from composetrain.data import (
    epoch_batches,
    epoch_order,
    generator_states,
    local_world_size,
    make_loader,
    order_problem,
    set_generator_states,
)
from composetrain.evaluation import EvalStep, evaluator
from composetrain.monitor import Meter, MetricsLog, progress_bar
from composetrain.preemption import StopSignal
from composetrain.preemption import requeue as requeue_job
from composetrain.rendezvous import Process, rendezvous
from composetrain.rng import restore_rng, seed_everything
from composetrain.sharded import apply_sharding
from composetrain.state import TrainState
from composetrain.steps import PlainStep
from composetrain.steps import _lift as lift

__all__ = ["RunResult", "run"]


@dataclasses.dataclass
class RunResult:
    """What ``ct.run`` returns (the same on every rank).

    Attributes:
        history: one record per log point: step, epoch, loss, metrics (averaged over
            the updates since the last record and over ranks), lr, updates/s, data wait.
        evals: one record per evaluation: step, epoch and the eval metrics.
        steps: optimizer updates applied in total (``state.step``).
        epochs: epochs completed.
        preempted: the run stopped early on SIGTERM/SIGUSR1, after saving.
        data_wait: the fraction of the loop's time spent waiting for batches.
        bottleneck: a sentence naming what limits throughput, and the fix; and what
            ``num_workers="auto"`` chose, from which timings, and why.
        checkpoint: the last checkpoint written, if any.
    """

    history: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    steps: int
    epochs: int
    preempted: bool
    data_wait: float
    bottleneck: str
    checkpoint: Path | None


@dataclasses.dataclass
class _Progress:
    """Where the loop stands; what a checkpoint must carry to continue exactly."""

    epoch: int = 0
    position: int = 0  # batches of this epoch done
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    window: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # outputs not yet logged (per rank)
    order: dict[str, Any] | None = None  # what a given loader drew this epoch's order from (per rank)


def run(
    train_step: PlainStep | TrainStep,
    state: TrainState,
    data: Any,
    *,
    epochs: int | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    drop_last: bool | None = None,
    num_workers: int | str = "auto",
    collate_fn: Callable[[list[Any]], Any] | None = None,
    eval_step: EvalStep | None = None,
    eval_data: Any = None,
    eval_every: int | None = None,
    log_every: int = 50,
    log_file: str | os.PathLike[str] | None = None,
    progress: bool = True,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = 2,
    seed: int = 0,
    requeue: bool = True,
    timeout: float = 300.0,
    tensorboard: bool | str | os.PathLike[str] = False,
) -> RunResult:
    """Train ``state`` with ``train_step`` over ``data``: one call per batch, one update per call.

    Under torchrun or SLURM it joins the job (``ct.rendezvous``) and leaves it at the
    end; alone it needs no setup. ``epochs`` and ``max_steps`` are totals, so after an
    interruption the same command resumes from the latest valid checkpoint and
    finishes the same training, bit for bit on the CPU.

    Args:
        train_step: a plain step or a composition; it must contain ``ct.distributed``
            when several processes run.
        state: the TrainState; its model moves to this process's device.
        data: a Dataset (``ct.run`` builds the loader) or a DataLoader (used as given).
        epochs: passes over the data (default 1, or as many as ``max_steps`` needs).
        max_steps: stop after this many optimizer updates in total.
        batch_size: samples per update per process (required for a Dataset; a DataLoader batches
            by its own, and a differing batch_size is refused).
        shuffle: reshuffle every epoch (``DistributedSampler.set_epoch``); default True. A DataLoader's
            own sampler decides: a shuffle that contradicts it is refused.
        drop_last: drop each epoch's last, smaller batch; default False (a DataLoader's own, which a
            differing drop_last is refused against).
        num_workers: loader workers (0: read in this process, a whole batch at once from a TensorDataset or
            a dataset with ``__getitems__``), or "auto": the first updates read in this process are timed,
            and workers start only if reading is a large share of the update and cores are spare
            (``RunResult.bottleneck`` says what it chose and why). A dataset that draws random numbers per
            sample (augmentation) resumes exactly with num_workers=0 only: auto's choice depends on timing.
        collate_fn: the loader's collate function.
        eval_step: ``eval_step(model, batch) -> {name: scalar}``, batch means; run under
            ``torch.no_grad()`` in eval mode, averaged over ``eval_data`` and over ranks.
        eval_data: a Dataset or DataLoader to evaluate on.
        eval_every: evaluate every this many updates (default: at each epoch's end).
        log_every: read metrics from the device every this many updates (no host
            sync on the others).
        log_file: JSON-lines metrics file (default ``checkpoint_dir/metrics.jsonl``). A resumed run
            rewrites it from the checkpoint's history; a file that is not this run's is moved aside
            to ``name.1`` (or the next free ``name.N``), never overwritten.
        progress: show a progress bar on rank 0.
        checkpoint_dir: save and resume here; None disables checkpoints.
        checkpoint_every: also save every this many updates (always at each epoch's
            end, at the end, and on SIGTERM/SIGUSR1); needs checkpoint_dir. A save comes before
            the evaluation due at the same update, and a run resumed there evaluates first.
        keep_checkpoints: how many of the newest checkpoints to keep.
        seed: a non-negative int below 2**32; seeds the data order, the workers and (on a fresh start) Python, NumPy and
            torch generators, with each rank's own stream.
        requeue: on SIGUSR1 (SLURM's pre-emption warning) under SLURM, requeue the job after
            saving; SIGTERM (``scancel``) saves and stops without requeueing.
        timeout: seconds to wait for the other processes (rendezvous and collectives).
        tensorboard: also write TensorBoard event files (``pip install tensorboard``): True puts
            them in ``tensorboard/`` beside the metrics file, or give a folder.

    A run that stops inside a logging window (``max_steps``, SIGTERM) logs that window as one
    last, shorter record.

    Returns:
        The RunResult.

    Example:
        >>> train = ct.distributed(ct.mixed_precision(ct.accumulate(4)(step)))
        >>> result = ct.run(train, ct.TrainState(model, opt), dataset, batch_size=256, epochs=3,
        ...                 checkpoint_dir="runs/a")
        >>> result.history[-1]["loss"], result.bottleneck
    """
    who = "run"
    step_fn = lift(train_step, who, "train_step")
    check_arguments(
        state, who, epochs=epochs, max_steps=max_steps, log_every=log_every, checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints, eval_every=eval_every, seed=seed, shuffle=shuffle, drop_last=drop_last,
        progress=progress, requeue=requeue, timeout=timeout, checkpoint_dir=checkpoint_dir, eval_step=eval_step,
        data=data, collate_fn=collate_fn,
    )  # fmt: skip
    seed = int(seed)  # a NumPy integer too: the checkpoint keeps plain types
    batch_size, shuffle, drop_last = loader_options(data, batch_size, shuffle, drop_last, who)
    with rendezvous(timeout=timeout) as proc:
        if proc.world_size > 1 and not step_fn.roles & {"distributed", "sharded"}:
            raise ValueError(
                f"{who}: {proc.world_size} processes are running but {step_fn!r} does not synchronise them; "
                "wrap it: ct.distributed(...)"
            )
        if proc.world_size > 1 and "sharded" in step_fn.roles and eval_step is not None:
            raise ValueError(
                f"{who}: eval_step with ct.sharded on {proc.world_size} processes is not supported yet: each "
                "sharded forward gathers from every rank, and the ranks' shares of eval_data may hold different "
                "numbers of batches; evaluate after the run, or with ct.distributed"
            )
        if not step_fn.roles & {"data_parallel", "pipeline_split"}:  # those place the model themselves
            state.model.to(proc.device)
        apply_sharding(step_fn, state)  # before resuming: a checkpoint's shards load straight into the shards
        loader, sampler = make_loader(
            data, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
            pin_memory=proc.device.type == "cuda", collate_fn=collate_fn, rank=proc.rank,
            world_size=proc.world_size, local_world_size=local_world_size(), seed=seed, who=who,
        )  # fmt: skip
        given = loader if isinstance(loader, DataLoader) else None  # a DataLoader given as is (ct.run's: a Reader)
        evaluate = evaluator(
            eval_step, eval_data, batch_size=batch_size or loader.batch_size, collate_fn=collate_fn,
            num_workers=loader.num_workers, proc=proc, who=who,
        )  # fmt: skip
        # every rank runs the same number of updates per epoch, or DDP would hang (pitfall 11)
        per_epoch = proc.fewest(len(loader))
        if per_epoch == 0:
            raise ValueError(f"{who}: some process has no batch in an epoch: use a smaller batch_size")
        settings = {
            "batch_size": loader.batch_size,
            "samples": len(loader.dataset) if isinstance(loader.dataset, Sized) else None,
            "updates_per_epoch": per_epoch,
            "shuffle": shuffle,
            "drop_last": drop_last,
            "seed": seed,
        }
        checkpoints = None
        if checkpoint_dir is not None:
            checkpoints = Checkpoints(
                checkpoint_dir, proc.rank, proc.world_size, keep_checkpoints, who, shards=ShardFiles(state)
            )
        log_path = Path(log_file) if log_file else Path(checkpoint_dir) / "metrics.jsonl" if checkpoint_dir else None
        board = _tensorboard_dir(tensorboard, log_path, who)
        log = MetricsLog(log_path, proc, board)  # checked writable before anything is resumed
        at = _resume(checkpoints, state, settings, given, proc, seed, who)
        resumed = at.epoch > 0 or at.position > 0  # a checkpoint is never saved before the first update
        log.start(at.history, at.evals, resumed, state.step)
        meter = Meter(proc, state, at.window)
        bar = progress_bar(progress and proc.is_main, max_steps or (epochs or 1) * per_epoch, state.step)
        stop = StopSignal(proc)  # restored in the finally below, whatever happens
        waiting = Waiting(proc, timeout, who)  # names what a rank waited for when another stops answering
        total_epochs = epochs if epochs is not None else 1 if max_steps is None else None  # None: until max_steps

        def reached_max() -> bool:
            return max_steps is not None and state.step >= max_steps

        def save() -> Path:
            assert checkpoints is not None
            waiting.now(f"the save of checkpoint step {state.step}")
            loop = {"epoch": at.epoch, "position": at.position, "history": at.history, "evals": at.evals}
            local = {
                "window": meter.window_on_cpu(),
                "order": at.order if at.position else None,  # replays the epoch's start on resume
                "generators": generator_states(given) if given is not None else [],  # the next epoch draws from them
            }
            return checkpoints.save(state.step, {"state": state.state_dict(), "settings": settings, **loop}, local)

        def log_now() -> None:
            waiting.now(f"the logging after update {state.step} (the metrics' mean over ranks)")
            record = meter.read(at.epoch, state.optimizer.param_groups[0]["lr"])
            # the learning-rate rule's input (ct.scaled_lr): samples per update, all processes together
            record["global_batch"] = None if loader.batch_size is None else loader.batch_size * proc.world_size
            at.history.append(record)
            log.write(record)
            bar.update(state.step - bar.n)
            bar.set_postfix(loss=f"{record['loss']:.4g}", ups=f"{record['updates_per_s']:.1f}")

        def evaluate_now() -> None:
            if evaluate is not None:
                waiting.now(f"the evaluation after update {state.step}")
                at.evals.append({"step": state.step, "epoch": at.epoch, **evaluate(state.model)})
                log.write_eval(at.evals[-1])

        saved_at: Path | None = None
        try:
            if resumed and _evaluation_missed(at, state.step, eval_every):
                evaluate_now()  # saved before its evaluation, which failed or was cut short
            while (total_epochs is None or at.epoch < total_epochs) and not stop.agreed and not reached_max():
                if at.position == 0:
                    at.order = epoch_order(loader, sampler)  # to replay a given loader's shuffle on resume
                batches = epoch_batches(loader, sampler, at.epoch, at.position, at.order, proc.device, per_epoch)
                evaluate_at_end = False
                for at.position, batch, waited in batches:  # at most per_epoch: ranks stop at the fewest
                    waiting.now(f"update {state.step + 1} (its forward, backward and gradient all-reduce)")
                    out, computed = _timed(step_fn, state, batch)
                    meter.add(out, waited, computed)
                    log_due = meter.due("log", log_every)
                    eval_due = meter.due("eval", eval_every)
                    save_due = meter.due("save", checkpoint_every)
                    if log_due or at.position == per_epoch:
                        log_now()
                    waiting.now(f"the agreement on whether to stop after update {state.step}")
                    stopping = stop.check()  # agreed by all ranks: they stop after the same update
                    mid_epoch = at.position < per_epoch  # the epoch's end saves anyway, below
                    # save, then evaluate: an evaluation that fails must not cost the checkpoint
                    if checkpoints is not None and mid_epoch and (stopping or reached_max() or save_due):
                        saved_at = save()
                    if eval_due and not stopping:  # a stopping run leaves it to the resumed one
                        evaluate_at_end = not mid_epoch
                        if mid_epoch:
                            evaluate_now()
                    if stopping or reached_max():
                        break
                if at.position < per_epoch:  # stopped inside the epoch
                    break
                at.epoch, at.position = at.epoch + 1, 0  # the epoch ran to its end
                if checkpoints is not None:
                    saved_at = save()
                if (evaluate_at_end or not eval_every) and not stop.agreed:
                    evaluate_now()
            if meter.outputs:  # stopped inside a logging window (max_steps, a signal): log what it holds
                log_now()
        except RuntimeError as e:  # a rank stopped answering or died: say what this one waited for
            lost = waiting.lost(e)
            if lost is None:
                raise
            raise lost from e
        finally:
            if proc.owns_group:  # the DDP wrapper would keep the group (and its threads) past its destruction
                state.release_runtime()
            stop.restore()
            bar.close()
            log.close()
        requeue_job(requeue, stop, proc, who)
        result = RunResult(
            history=at.history, evals=at.evals, steps=state.step, epochs=at.epoch, preempted=stop.agreed,
            data_wait=meter.data_wait, bottleneck=meter.bottleneck(loader), checkpoint=saved_at,
        )  # fmt: skip
        if proc.is_main and progress:
            print(f"{who}: {result.steps} updates, {result.epochs} epoch(s); {result.bottleneck}", file=sys.stderr)
        return result


def _tensorboard_dir(tensorboard: Any, log_path: Path | None, who: str) -> Path | None:
    """Where TensorBoard's event files go, checked before anything runs (None: no TensorBoard)."""
    if tensorboard is False:
        return None
    if not isinstance(tensorboard, (bool, str, os.PathLike)):
        raise TypeError(f"{who}: tensorboard must be True, False or a folder, got {show(tensorboard)}")
    if tensorboard is True and log_path is None:
        raise ValueError(
            f"{who}: tensorboard=True writes beside the metrics file, but there is none: give checkpoint_dir "
            "or log_file, or a folder: tensorboard='runs/tb'"
        )
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"{who}: tensorboard={tensorboard!r} needs the tensorboard package: pip install tensorboard"
        ) from e
    if isinstance(tensorboard, bool):
        assert log_path is not None  # for the type checker: refused above
        return log_path.parent / "tensorboard"
    return Path(tensorboard)


def _timed(step_fn: TrainStep, state: TrainState, batch: Any) -> tuple[StepOutput, float]:
    start = time.perf_counter()
    out = step_fn(state, batch)
    return out, time.perf_counter() - start


def _resume(
    checkpoints: Checkpoints | None,
    state: TrainState,
    settings: dict[str, Any],
    given: DataLoader[Any] | None,
    proc: Process,
    seed: int,
    who: str,
) -> _Progress:
    """The latest valid checkpoint restored into ``state`` and the ``given`` DataLoader's generators, or a
    fresh start with each rank's own random stream. Corrupt checkpoints were set aside by ``latest()``; one
    of other data settings, order or model is refused before anything changes."""
    latest = checkpoints.latest() if checkpoints is not None else None
    if latest is None:
        seed_everything(seed * 1000003 + proc.rank)
        return _Progress()
    path, saved, local = latest
    changed = {k: (saved["settings"].get(k), v) for k, v in settings.items() if saved["settings"].get(k) != v}
    if changed:
        listing = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in changed.items())
        raise ValueError(
            f"{who}: checkpoint {path} continues a run with other data settings ({listing}); resume with the "
            "same settings, or point checkpoint_dir elsewhere to start afresh"
        )
    problem = order_problem(given, saved["position"], local["order"], local["generators"])
    if problem:
        raise ValueError(f"{who}: checkpoint {path} {problem}, or point checkpoint_dir elsewhere to start afresh")
    try:
        state.load_state_dict(saved["state"])
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"{who}: the latest checkpoint {path} does not fit this model: {e}; point checkpoint_dir elsewhere "
            "to start afresh"
        ) from e
    restore_rng(local["rng"])  # checked by Checkpoints.latest: cannot fail half-way
    if given is not None:
        set_generator_states(given, local["generators"])
    loop = (saved["epoch"], saved["position"], saved["history"], saved["evals"])
    return _Progress(*loop, local["window"], local["order"])


def _evaluation_missed(at: _Progress, step: int, eval_every: int | None) -> bool:
    """Whether a run resumes where an evaluation was due but is not recorded: checkpoints are saved
    before the evaluation of the same update, so one that failed or was interrupted is run again."""
    if at.evals and at.evals[-1]["step"] == step:
        return False
    if eval_every:
        return step > 0 and step % eval_every == 0
    return at.position == 0 and at.epoch > 0  # at an epoch's end

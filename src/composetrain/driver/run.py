"""ct.run: the small driver. Loaders, devices, rendezvous, logging, evaluation, checkpoints.

``run`` reads top to bottom: set up, resume, train (one update per iteration, then what is due
after it: log, agree on stopping, save, evaluate), finish. ``Progress`` (progress.py) says where the
loop stands and what is due; ``_Driver`` below holds what was set up and does each action, once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sized
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from composetrain.checkpoint.objects import open_checkpoints
from composetrain.checkpoint.shards import ShardFiles
from composetrain.core.protocol import TrainStep
from composetrain.core.rng import derive_seed, restore_rng, seed_everything
from composetrain.core.state import TrainState
from composetrain.core.steps import PlainStep, lift
from composetrain.core.util import RUN, show
from composetrain.driver.compiling import CompileCache
from composetrain.driver.epoch_ends import call_hook, check_metric_kind, check_scheduler_metric, metric_of
from composetrain.driver.evaluation import EvalStep, evaluator
from composetrain.driver.global_batches import GlobalBatches, batchnorm_problem
from composetrain.driver.loader import (
    ResumableSampler,
    build_loader,
    epoch_batches,
    epoch_order,
    generator_states,
    order_problem,
    set_generator_states,
)
from composetrain.driver.monitor import Meter, MetricsLog, progress_bar
from composetrain.driver.options import RunOptions
from composetrain.driver.preemption import StopSignal
from composetrain.driver.preemption import requeue as requeue_job
from composetrain.driver.profiling import Watch
from composetrain.driver.progress import Due, Progress, Schedule
from composetrain.driver.reader import Reader
from composetrain.driver.saving import Saves
from composetrain.driver.schedules import horizon_problem, steps_left_problem
from composetrain.driver.stragglers import DEFAULT_THRESHOLD
from composetrain.driver.stream_passes import agreed_stream, open_pass, restore_stream, stream_record
from composetrain.driver.streams import Stream, build_stream
from composetrain.driver.throughput import resolve_peak
from composetrain.driver.tracking import Tracker
from composetrain.driver.waiting import Waiting
from composetrain.launch.rendezvous import Process, rendezvous

__all__ = ["RunResult", "run"]


@dataclasses.dataclass
class RunResult:
    """What ``ct.run`` returns (the same on every rank).

    Attributes:
        history: one record per log point: step, epoch (the epochs completed at its step, as in ``evals``:
            a record at the first epoch's end says 1, those before it 0), loss, metrics (averaged over
            the updates since the last record and over ranks), lr, updates/s, data wait.
            ``lr`` is the rate the record's last update used (read before its scheduler step;
            the first parameter group's; with several groups ``lr_groups`` holds each group's, in group
            order: timm's layer decay), None for a window that an earlier process made
            entirely (a finished run run again); in a run that
            compiles (``ct.compile``), also ``compiles`` and ``compile_s``: torch.compile's compilations
            since the last record, and their seconds.
        evals: one record per evaluation: step, epoch (the epochs completed) and the eval metrics.
        steps: optimizer updates applied in total (``state.step``).
        epochs: epochs completed.
        preempted: the run stopped early on SIGTERM/SIGUSR1, after saving.
        data_wait: the fraction of the loop's time spent waiting for batches.
        bottleneck: a sentence naming what limits throughput, and the fix; and what
            ``num_workers="auto"`` chose, from which timings, and why; first the time torch.compile
            took, when it is over a fifth of the step's.
        checkpoint: the last checkpoint written, if any (its URL, a str, in object storage).
        exhausted: a stream ran out before ``max_steps``: the run ended with its last pass (``epochs``, default
            one), or at a pass that gave no batch (a stream that does not start over).
    """

    history: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    steps: int
    epochs: int
    preempted: bool
    data_wait: float
    bottleneck: str
    checkpoint: Path | str | None
    exhausted: bool = False


def run(
    train_step: PlainStep | TrainStep,
    state: TrainState,
    data: Any,
    *,
    epochs: int | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    global_batch_size: int | None = None,
    shuffle: bool | None = None,
    drop_last: bool | None = None,
    num_workers: int | str = "auto",
    collate_fn: Callable[[list[Any]], Any] | None = None,
    stream_resume: str | None = None,
    eval_step: EvalStep | None = None,
    eval_data: Any = None,
    eval_every: int | None = None,
    log_every: int = 50,
    log_file: str | os.PathLike[str] | None = None,
    progress: bool = True,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int | str | tuple[int, str] | None = None,
    keep_checkpoints: int = 2,
    checkpoint_async: bool | None = None,
    seed: int = 0,
    requeue: bool = True,
    timeout: float = 300.0,
    tensorboard: bool | str | os.PathLike[str] = False,
    on_record: Tracker | None = None,
    profile: bool | Mapping[str, Any] = False,
    peak_flops: float | str | None = None,
    straggler_threshold: float = DEFAULT_THRESHOLD,
    oom_snapshot: bool = False,
    scheduler_metric: str | None = None,
    on_epoch_start: Callable[[TrainState, int], Any] | None = None,
    on_epoch_end: Callable[[TrainState, int], Any] | None = None,
) -> RunResult:
    """Train ``state`` with ``train_step`` over ``data``: one call per batch, one update per call.

    Under torchrun or SLURM it joins the job (``ct.rendezvous``) and leaves it at the
    end, but for a model it leaves sharded (``ct.sharded``), which needs the group to gather:
    that group stays until the process exits; alone it needs no setup. ``epochs`` and
    ``max_steps`` are totals, so after an interruption the same command resumes from the latest valid checkpoint and
    finishes the same training, bit for bit on the CPU.

    A run given ``global_batch_size`` is defined by its global batch, not by its number of processes: the same job
    on any number of processes that divides it trains the same model (to float64 rounding: sums over ranks add in
    another order) and logs the same records, and its checkpoints resume on any such number. Resumed on the
    number that saved it, it continues as any run (bit for bit on one or two processes; on three or more the
    resumed first update all-reduces in another order: float rounding); on another, model, optimizer, scheduler and
    transform state carry over (``ct.sharded``'s shards resharded), the records continue from the unlogged
    updates' means over ranks, and each rank's random generators start from ``seed``, its rank and the update it
    resumes at: a step that draws no random numbers continues exactly, one that does (dropout) continues equal in
    distribution, not equal.

    Args:
        train_step: a plain step or a composition; it must contain ``ct.distributed``
            when several processes run.
        state: the TrainState; its model moves to this process's device.
        data: a Dataset (``ct.run`` builds the loader) or a DataLoader (used as given); or a stream: an
            IterableDataset, or a DataLoader over one (torchdata's ``StatefulDataLoader``), read in passes, its
            ``state_dict()`` checkpointed per rank (``driver/streams.py`` says what ct.run tells it, and when).
        epochs: passes over the data (default 1, or as many as ``max_steps`` needs; a stream's: ``epochs``, or one,
            each until the stream ends on some rank).
        max_steps: stop after this many optimizer updates in total.
        batch_size: samples per update per process (a Dataset needs it or ``global_batch_size``; a DataLoader
            batches by its own, and a differing batch_size is refused). The run changes with the number of
            processes, and resumes on the same number only.
        global_batch_size: samples per update, all processes together (instead of ``batch_size``; a Dataset
            only: a DataLoader given reads its own batches, and is refused). Epoch e's order is a permutation of
            the samples drawn from ``seed`` and e alone (``DistributedSampler``'s), update k takes its samples
            ``k*G`` to ``(k+1)*G``, the last, short update is kept (``drop_last=False``) or dropped, no sample
            padded or repeated; of each update every process reads a contiguous share, G/W of them. A number of
            processes W that does not divide G is refused before anything is trained or saved, naming those that
            would, and so is a short update of fewer samples than processes (``drop_last=True`` drops it).
            Evaluation reads batches of the training's forward size (``train_step.forward_size``: G/W as the
            composition cuts it), and BatchNorm in training mode on several processes is warned of.
        shuffle: reshuffle every epoch (``DistributedSampler.set_epoch``); default True. A DataLoader's
            own sampler decides: a shuffle that contradicts it is refused.
        drop_last: drop each epoch's last, smaller batch; default False (a DataLoader's own, which a
            differing drop_last is refused against).
        num_workers: loader workers (0: read in this process, a whole batch at once from a TensorDataset or
            a dataset with ``__getitems__``), or "auto": a TensorDataset is always read in this process; for
            other datasets the first updates read in this process are timed,
            and workers start only if reading is a large share of the update and cores are spare
            (``RunResult.bottleneck`` says what it chose and why). A dataset that draws random numbers per
            sample (augmentation) resumes exactly with num_workers=0 only, on the CPU: auto's choice depends on
            timing, and on CUDA the next batch is read ahead. A DataLoader reads with its own: a differing
            int is refused.
        collate_fn: the loader's collate function.
        stream_resume: how a stream resumes (streams only): "state" (the default: its ``state_dict()``, or its
            StatefulDataLoader's, saved per rank and loaded with ``load_state_dict``; a stream without them is refused
            when checkpoint_dir is given), or "replay": its pass is read again from its start and the batches
            already trained on are dropped (exact for a stream that yields the same batches every time).
        eval_step: ``eval_step(model, batch) -> {name: scalar}``, batch means; run under
            ``torch.no_grad()`` in eval mode, averaged over ``eval_data`` and over ranks. Names are ``str``
            other than step, epoch and eval (the record's own fields), as the train step's metrics are
            (other than those and loss, lr, skipped, updates_per_s, data_wait, global_batch).
        eval_data: a Dataset or DataLoader to evaluate on.
        eval_every: evaluate every this many updates (default: at each epoch's end).
        log_every: read metrics from the device every this many updates (no host
            sync on the others).
        log_file: JSON-lines metrics file (default ``checkpoint_dir/metrics.jsonl``). A resumed run
            rewrites it from the checkpoint's history; a file that is not this run's is moved aside
            to ``name.1`` (or the next free ``name.N``), never overwritten.
        progress: show a progress bar on rank 0.
        checkpoint_dir: save and resume here; None disables checkpoints. A composition with ``ct.compile``
            keeps torch's compile caches in ``checkpoint_dir/compile_cache/`` while it trains, for warm
            restarts (``ct.compile(cache=False)``: in torch's own folder).
        checkpoint_every: also save every this many updates (an int), once a wall-clock interval has passed
            since the last save began (``"90s"``, ``"30min"``, ``"2h"``: rank 0's clock, agreed by every rank after
            an update), both (``(500, "30min")``: each applies), or ``"epoch"`` (no more than the rest); always at
            each epoch's end, at the end, and on SIGTERM/SIGUSR1. Default: every 10 minutes (a kill loses minutes,
            not an epoch). Needs checkpoint_dir. A save comes before the evaluation due at the same update, and a
            run resumed there evaluates first.
        keep_checkpoints: how many of the newest checkpoints to keep (at least one: the newest complete
            checkpoint is never pruned).
        checkpoint_async: write saves in the background (default True with a checkpoint_dir; False: each save
            blocks training until it is published): at the update boundary each rank copies what it saves into new
            host memory (doubling the state's host memory while the save is in flight) and a thread writes it while
            training goes on; the save is published (counted as the newest, resumable, allowed to prune older ones)
            only once every rank's files are durable, at a later update boundary. At most one save is in flight: the
            next waits for it (a save by the clock is put off to the first update after it instead). A write error
            (a full disk) stops the run at the next update boundary, the previous checkpoint the newest; the run's
            last save (its end, SIGTERM, SIGUSR1) is written before ct.run returns; a run that fails with a save in
            flight publishes it once every rank's part is written (rank 0 waits ``timeout`` seconds at most for
            them). With ``on_record``, the first checkpoint of a run that has none is written in the foreground
            (until one exists a kill starts the run afresh, sending its records again).
        seed: a non-negative int below 2**32; seeds the data order, the workers and (on a fresh start) Python, NumPy and
            torch generators, with each rank's own stream.
        requeue: on SIGUSR1 (SLURM's pre-emption warning) under SLURM, requeue the job after
            saving; SIGTERM (``scancel``) saves and stops without requeueing.
        timeout: seconds to wait for the other processes (rendezvous and collectives).
        tensorboard: also write TensorBoard event files (``pip install tensorboard``): True puts
            them in ``tensorboard/`` beside the metrics file, or give a folder.
        on_record: ``on_record(record)``, called on rank 0 with (a copy of) each record as the metrics
            file gets it, when it is made: a log record ``{"step", "epoch", "loss", metrics..., "lr", ...}``
            or an evaluation ``{"step", "epoch", "eval": {name: value}}``; for W&B, MLflow or any tracker.
            Each record once, also across a resume: a resumed run sends neither the records its checkpoint
            holds nor those the interrupted run wrote to the metrics file after it (the updates it redoes
            make them again), however many times the run is interrupted. An exception it raises (also
            KeyboardInterrupt, SystemExit) stops the run after the next save (at once after a log
            record; after the next update after an evaluation), then ``ct.run`` raises it on rank 0, naming
            the record (which counts as sent; a KeyboardInterrupt or SystemExit comes out as itself, with a
            note); the other ranks return, ``preempted``. Every rank waits while it runs.
        profile: run ``torch.profiler`` over a window of updates and write each rank's trace into the run's
            folder (``profile/`` beside a local checkpoint_dir's checkpoints, or the metrics file; a folder that
            cannot be made is refused before the first update): True for the default window (after 5
            updates, 1 of warm-up, 3 recorded, once), or a dict of ``wait``, ``warmup``, ``active``, ``repeat``
            (``torch.profiler.schedule``'s), ``record_shapes``, ``profile_memory``, ``with_stack`` and ``folder``.
            Chrome trace JSON in TensorBoard's profiler-plugin layout; updates and their phases (data,
            forward/backward, optimizer, logging, checkpoint, evaluation) marked. Nothing runs outside the window.
        peak_flops: the peak FLOP/s of one device, for the records' ``mfu``: a number, or a precision
            ("bf16", "fp16", "tf32", "fp32") looked up for this GPU in ``composetrain.driver.throughput.PEAK_FLOPS``
            (dense peaks from NVIDIA's datasheets; a GPU it lacks is refused); None: no ``mfu``.
        straggler_threshold: under several processes, a rank whose own time (data wait, and time in the step
            less its waits for the others) is more than this many times the other ranks' median is named in the
            record (``stragglers``) and in ``RunResult.bottleneck``, with its host and whether it waited on data
            or computed; gathered at log points only, in one small collective.
        oom_snapshot: on CUDA, record the allocator's history (a cost per allocation) and, when an update runs out
            of memory, write ``memory/oom-rank<r>-update<n>.pickle`` in the run's folder before raising (open it at
            https://pytorch.org/memory_viz); needs checkpoint_dir (a local one) or log_file: refused without.

        scheduler_metric: the evaluation metric a scheduler that steps on one is fed (``ReduceLROnPlateau``,
            timm's schedulers, which ``lr_scheduler.step(epoch + 1, metric)`` in timm's ``train.py``):
            ``"eval.NAME"``, a metric of ``eval_step``'s, or ``"eval_ema.NAME"``, the same of ``ct.ema``'s weights
            (timm feeds its EMA's when it keeps one). After each epoch's evaluation (at its end: ``eval_every``
            is refused with it) the scheduler steps with it, ``state.end_epoch(metric=...)``; a run resumed
            from the checkpoint of an epoch's end, saved before its evaluation, evaluates and steps then, once.
            A scheduler that needs a metric without it is refused before the run starts, and so is a metric for
            a scheduler that takes none.
        on_epoch_start: ``on_epoch_start(state, epoch)``, called on every rank before the first update of each
            epoch this call trains (``epoch`` counts from 0), also of the epoch a resumed run continues part-way:
            for settings outside the TrainState that follow the epoch (timm's ``--mixup-off-epoch``:
            ``mixup.mixup_enabled = epoch < off``; a dataset's ``set_epoch`` that ct.run does not call). It runs
            again in a resumed run, so make it a function of the epoch: what it changes in the state would be done
            twice.
        on_epoch_end: ``on_epoch_end(state, epoch)``, called on every rank after the last update of epoch
            ``epoch``, before the epoch scheduler step, the epoch's checkpoint and its evaluation (timm's
            ``--dist-bn``: ``timm.utils.distribute_bn(state.model, world_size, reduce=True)``). Once per epoch
            end, also across a resume: its changes to the state are in that checkpoint, and a run stopped before
            the checkpoint was written redoes the epoch's last updates and it. A hook that moves ``state.step``
            or ``state.epoch`` (ct.run calls ``state.end_epoch()`` itself), or swaps the state's model, optimizer
            or scheduler, is refused when it returns.

    A run that stops inside a logging window (``max_steps``, SIGTERM) logs that window as one
    last, shorter record. Each record also says ``samples_per_s`` (all processes together), ``tokens_per_s`` (when
    ``accumulate``'s ``weight`` counts the units: what it counts per second), ``flops_per_update`` (all processes;
    counted by ``FlopCounterMode`` on the call's first update, once, and scaled by each update's samples), ``mfu``
    (with ``peak_flops``) and ``peak_memory_mib`` (the largest process's: CUDA's allocated memory, else the resident
    memory; each record's own peak).

    Returns:
        The RunResult.

    Example:
        >>> train = ct.distributed(ct.mixed_precision(ct.accumulate(4)(step)))
        >>> result = ct.run(train, ct.TrainState(model, opt), dataset, batch_size=256, epochs=3,
        ...                 checkpoint_dir="runs/a")
        >>> result.history[-1]["loss"], result.bottleneck
    """
    # -- set up: every argument checked before anything starts (each option value checks itself when
    # built), then the job joined
    step_fn = lift(train_step, RUN, "train_step")
    check_state(state)
    options = RunOptions.from_run_args(
        data,
        epochs=epochs,
        max_steps=max_steps,
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        global_batch_size=global_batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn,
        stream_resume=stream_resume,
        eval_step=eval_step,
        eval_data=eval_data,
        eval_every=eval_every,
        log_every=log_every,
        log_file=log_file,
        progress=progress,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        checkpoint_async=checkpoint_async,
        seed=seed,
        requeue=requeue,
        timeout=timeout,
        tensorboard=tensorboard,
        on_record=on_record,
        profile=profile,
        peak_flops=peak_flops,
        straggler_threshold=straggler_threshold,
        oom_snapshot=oom_snapshot,
        scheduler_metric=scheduler_metric,
        on_epoch_start=on_epoch_start,
        on_epoch_end=on_epoch_end,
    )
    check_scheduler_metric(state, options.eval.scheduler_metric)
    log = options.log
    with rendezvous(timeout=options.timeout) as proc:
        d = _Driver(step_fn, state, proc, options)
        try:
            check_metric_kind(options.eval.scheduler_metric, step_fn.eval_weights(state))  # after its setup
            # -- resume: the latest valid checkpoint, or a fresh start with each rank's own random stream
            schedule = Schedule(
                d.per_epoch,
                options.total_epochs,
                options.max_steps,
                log.log_every,
                options.eval.eval_every,
                options.checkpoint.every_updates,
            )
            at = d.resume(schedule, options.loader.seed)
            d.refuse_in_the_way(schedule, state.step)  # before training, not after it
            _check_horizon(state, schedule, at.resumed)  # the scheduler that trains: a checkpoint's, resumed
            _check_epochs_left(state, schedule, at)
            d.check_stream_state()  # a stream's state no checkpoint could hold: refused before training
            d.log.start(at.history, at.evals, at.resumed, state.step)
            d.start(log.progress and proc.is_main, schedule.total_updates)  # bar, stop signal, phases
            if at.evaluation_missed(state.step):
                d.evaluate(at)  # saved before its evaluation, which failed or was cut short
            # -- train: one update per iteration, then what is due after it, always in this order
            batches: Iterator[tuple[int, Any, float]] | None = None
            done = at.finished(state.step)
            while not done:
                if batches is None:  # an epoch begins, or resumes part-way
                    d.begin_epoch(at)
                    batches = d.epoch(at)
                got = next(batches, None)  # at most per_epoch: ranks stop at the fewest
                if got is None and d.stream is None:  # the loader held fewer batches than its length said: end here
                    done = True
                    continue
                if got is None:  # a stream's pass ended, on the first rank it ended on: every rank agreed
                    due = d.end_pass(at)
                    if due is None:  # a new pass gave no batch: the stream does not start over
                        done = True
                        continue
                else:
                    at.position, batch, waited = got
                    d.update(at, batch, waited)
                    due = at.after_update(state.step)
                if due.log:
                    d.write_log(at)
                # every rank stops after the same update, and saves when rank 0's clock says; a save in flight
                # is published once written on every rank
                stopping, clock = d.agree_on_stop()
                if due.epoch_end:  # the hook, then a per-epoch scheduler steps, with the epoch the checkpoint records
                    d.end_epoch(at)
                    at.next_epoch()
                    batches = None
                if due.save or stopping or clock:  # save, then evaluate: a failed evaluation must not cost the save
                    d.save(at, last=stopping or at.finished(state.step))
                if due.evaluate and not stopping:  # a stopping run leaves it to the resumed one
                    d.evaluate(at)
                done = stopping or at.finished(state.step)
            if at.window:  # stopped inside a logging window (max_steps, a signal): log what it holds
                d.write_log(at)
            d.saves.finish()  # the last save in flight written and published before ct.run returns
        except RuntimeError as e:  # a rank stopped answering or died: say what this one waited for
            lost = d.waiting.lost(e) if d.stop is not None else None
            if lost is None:
                raise
            hint = d.log.records.slow(options.timeout)  # rank 0's tracker held the others: name it, not a hang
            if hint is None and not proc.is_main and options.log.on_record is not None:
                hint = (
                    "rank 0 also calls on_record with each record while every other rank waits: a tracker that "
                    "blocks longer than timeout (a network call) fails the job so; make it return quickly"
                )
            if hint is not None:
                lost.args = (f"{lost.args[0]}; {hint}",)
            raise lost from e
        finally:
            d.close()
        if d.log.records.failed is not None:  # stopped and saved for it: now say so (rank 0)
            error = d.log.records.error(d.saved_at)
            if error is d.log.records.failed[1]:  # KeyboardInterrupt, SystemExit: as it came, with a note
                raise error
            raise error from d.log.records.failed[1]
        # -- finish: requeue on pre-emption, and say what limited the run
        assert d.stop is not None  # for the type checker: start() ran
        requeue_job(options.requeue, d.stop, proc)
        short = options.max_steps is not None and not at.reached_max(state.step)
        exhausted = d.stream is not None and not d.stop.agreed and (d.spent or short)
        if exhausted and proc.is_main:
            asked = f"max_steps={options.max_steps}" if short else f"epochs={options.total_epochs}"
            spent = (
                f"; its pass {at.epoch + 1} gave no batch: it does not start over on a new iter() (reset it where it "
                "ends, or in set_epoch)"
                if d.spent
                else ""
            )
            warnings.warn(
                f"{RUN}: the stream ended after {state.step} updates in {at.epoch} pass(es), before {asked}{spent}; "
                "the run ends here (RunResult.exhausted)",
                stacklevel=2,
            )
        missed = d.watch.missed(state.step) if not d.stop.agreed else None  # a stop asked for says why itself
        if missed is not None:
            warnings.warn(missed, stacklevel=2)
        result = RunResult(
            history=at.history,
            evals=at.evals,
            steps=state.step,
            epochs=at.epoch,
            preempted=d.stop.agreed,
            data_wait=d.meter.data_wait,
            checkpoint=d.saved_at,
            bottleneck=d.saves.explain(d.meter.bottleneck(d.loader), d.meter.waited + d.meter.computed),
            exhausted=exhausted,
        )
        if proc.is_main and log.progress:
            print(f"{RUN}: {result.steps} updates, {result.epochs} epoch(s); {result.bottleneck}", file=sys.stderr)
        return result


def check_state(state: Any) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(
            f"{RUN}: state must be a ct.TrainState, got {show(state)}; build ct.TrainState(model, optimizer)"
        )


def _check_horizon(state: TrainState, schedule: Schedule, resumed: bool) -> None:
    """Warn when the scheduler's horizon is far shorter than the run (built in epochs, stepped per update; a
    finished run continued for more epochs): checked after the resume, on the scheduler the checkpoint restored."""
    if state.scheduler is None or schedule.per_epoch is None:  # a stream: its length is not known
        return
    updates = schedule.total_updates
    assert updates is not None  # for the type checker: known without a stream
    if schedule.epochs is not None:
        updates = min(updates, schedule.epochs * schedule.per_epoch)
    epoch = state.scheduler_interval == "epoch"
    problem = horizon_problem(
        state.scheduler,
        state.scheduler_interval,
        updates // schedule.per_epoch if epoch else updates,
        schedule.per_epoch,
    )
    if problem is not None and resumed:  # the one given was replaced by the checkpoint's: building anew is no fix
        problem += (
            ", but this is the checkpoint's scheduler, restored over the one given: to continue past the schedule "
            "it was built for, ct.load_checkpoint the last checkpoint into a TrainState with a new scheduler and "
            "train it in a new checkpoint_dir"
        )
    if problem is not None:
        warnings.warn(f"{RUN}: {problem}", stacklevel=3)


def _check_epochs_left(state: TrainState, schedule: Schedule, at: Progress) -> None:
    """Refuse a per-epoch scheduler with too few steps left for the epoch ends this run reaches at least."""
    if state.scheduler is None or state.scheduler_interval != "epoch":
        return
    ends = schedule.epochs - at.epoch if schedule.epochs is not None else None
    if schedule.max_steps is not None and schedule.per_epoch:  # an update takes a batch: this many epoch ends at least
        by_steps = (schedule.max_steps - state.step + at.position) // schedule.per_epoch
        ends = by_steps if ends is None else min(ends, by_steps)
    problem = steps_left_problem(state.scheduler, ends) if ends is not None else None
    if problem is not None:
        raise ValueError(f"{RUN}: {problem}")


def _marked(phase: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A ``_Driver`` action marked ``phase`` in a profiler's trace, while one records (``Watch.mark``)."""

    def mark(action: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(action)
        def marked(self: _Driver, *args: Any, **kwargs: Any) -> None:
            if self.stop is None:  # before start(): nothing watches yet
                return action(self, *args, **kwargs)
            with self.watch.mark(phase):
                return action(self, *args, **kwargs)

        return marked

    return mark


class _Driver:
    """What ``run`` sets up before its loop, and the loop's actions: one update, the log, the agreement on
    stopping, the save and the evaluation, each written once (the loop decides when)."""

    def __init__(self, step_fn: TrainStep, state: TrainState, proc: Process, options: RunOptions) -> None:
        self.step_fn, self.state, self.proc, self.options = step_fn, state, proc, options
        can = step_fn.capabilities  # what the composition does that the driver must know, never its names
        if proc.world_size > 1 and not can.syncs_processes:
            raise ValueError(
                f"{RUN}: {proc.world_size} processes are running but {step_fn!r} does not synchronise them; "
                "wrap it: ct.distributed(...)"
            )
        if proc.world_size > 1 and can.forward_needs_every_rank and options.eval.enabled:
            raise ValueError(
                f"{RUN}: eval_step with {step_fn!r} on {proc.world_size} processes is not supported yet: each of "
                "its forwards gathers from every rank (ct.sharded), and the ranks' shares of eval_data may hold "
                "different numbers of batches; evaluate after the run, or with ct.distributed"
            )
        if not can.places_model:  # data_parallel, pipeline_split place the model themselves
            state.model.to(proc.device)
        chosen = options.loader
        self.started_at = 0  # the update a resumed run continues from (resume sets it): its loader workers' seeds
        # the processes that split the model (a tensor-parallel group, a pipeline's stages) read one shard alike
        try:
            self.shard, self.shards = can.data_shard(proc.rank, proc.world_size)
        except ValueError as e:
            raise ValueError(f"{RUN}: {step_fn!r}: {e}") from None
        self.stream = (  # read in passes, its state per rank
            agreed_stream(
                lambda: build_stream(
                    chosen.data,
                    batch_size=chosen.batch_size,
                    drop_last=chosen.drop_last,
                    collate_fn=chosen.collate_fn,
                    num_workers=chosen.num_workers,
                    resume=chosen.stream_resume,
                    proc=proc,
                    seed=chosen.seed,
                ),
                proc,
            )
            if chosen.stream
            else None
        )
        self.loader: DataLoader[Any] | Reader | Stream = self.stream  # type: ignore[assignment]
        self.sampler: ResumableSampler | GlobalBatches | None = None
        if self.stream is None:
            self.loader, self.sampler = build_loader(
                chosen,
                pin_memory=proc.device.type == "cuda",
                rank=self.shard,
                world_size=self.shards,
                local_world_size=proc.local_world_size,
                equal_shares=can.forward_needs_every_rank,
                started=lambda: self.started_at,
                per_shard=proc.world_size // self.shards,
            )
        loader = self.loader
        self.first_read = True  # a stream's first batch in this call: compared across ranks
        self.spent = False  # a stream's new pass gave no batch: the run ended there
        # a DataLoader given as is (ct.run's own is a Reader): its generators are checkpointed and restored
        self.given = self.loader if isinstance(self.loader, DataLoader) else None
        dataset = self.loader.dataset
        if chosen.global_batch_size is not None and proc.is_main and isinstance(dataset, Sized):
            problem = batchnorm_problem(
                state.model, len(dataset), chosen.global_batch_size, proc.world_size, chosen.drop_last
            )
            if problem is not None:  # as accumulate warns of it: BatchNorm users under DDP expect it
                warnings.warn(f"{RUN}: {problem}", stacklevel=3)
        per_process = chosen.batch_size or self.loader.batch_size
        if per_process is not None:  # a size the composition cannot take: refused before the folder is touched
            step_fn.check_batch_size(state, per_process)
        eval_batch: int | Callable[[], int] | None = per_process
        if chosen.global_batch_size is not None and per_process is not None:
            # G/W per process, twice as many on half the processes: evaluation reads batches of the training's
            # forward size instead (accumulate(micro_batch=m): m), holding no more than training on any number
            eval_batch = functools.partial(step_fn.forward_size, state, per_process)
        self.evaluator = evaluator(
            options.eval,
            batch_size=eval_batch,
            collate_fn=chosen.collate_fn,
            num_workers=lambda: loader.num_workers,
            proc=proc,
        )
        # every rank runs the same number of updates per epoch, or DDP would hang (pitfall 11); a stream's ranks
        # agree before each update instead
        self.per_epoch = None if isinstance(self.loader, Stream) else proc.fewest(len(self.loader))
        if self.per_epoch == 0:
            raise ValueError(f"{RUN}: some process has no batch in an epoch: use a smaller batch_size")
        # what a resumed run must share with the checkpoint's; in a run defined by its global batch, nothing that
        # depends on the number of processes (updates_per_epoch does not: global updates)
        global_batch = chosen.global_batch_size
        self.settings: dict[str, Any] = {
            "batch_size": self.loader.batch_size if global_batch is None else None,
            "global_batch_size": global_batch,
            "samples": len(dataset) if isinstance(dataset, Sized) and self.stream is None else None,
            "updates_per_epoch": self.per_epoch,
            "shuffle": chosen.shuffle,
            "drop_last": chosen.drop_last,
            "seed": chosen.seed,
        }
        if self.stream is not None:  # how it resumes ("global state": on any number of processes)
            self.settings["stream"] = "global state" if self.stream.global_state else self.stream.mode
            # who keeps its state: the dataset (0), or a StatefulDataLoader's workers, one state each
            self.settings["num_workers"] = self.stream.num_workers
        # the peak MFU divides by, looked up for this device (refused, where the table has none, before anything is
        # resumed or written); every rank judges stragglers and MFU alike (rank 0's records and every rank's
        # bottleneck say the same), or none starts. A profiler window or an OOM snapshot may be one rank's own
        watch = options.watch
        try:
            self.peak, problem = resolve_peak(watch.peak_flops, proc.device), None
        except ValueError as e:
            self.peak, problem = None, str(e)
        everyone = proc.differing((watch.straggler_threshold, watch.peak_flops, problem))
        refused = [(r, p) for r, (_, _, p) in enumerate(everyone)] if everyone is not None else [(proc.rank, problem)]
        for rank, theirs in refused:
            if theirs is not None:
                raise ValueError(theirs if theirs == problem else f"{theirs} (on rank {rank})")
        if everyone is not None:
            shown = ", ".join(
                f"rank {r} straggler_threshold={t!r}, peak_flops={f!r}" for r, (t, f, _) in enumerate(everyone)
            )
            raise ValueError(
                f"{RUN}: the ranks' straggler_threshold or peak_flops differ: {shown}; each would name other "
                "stragglers and log another mfu: give every rank the same"
            )
        self.checkpoints = None
        saving = options.checkpoint
        if saving.checkpoint_dir is not None:  # first in the folder: refused here if another run holds it
            self.checkpoints = open_checkpoints(
                saving.checkpoint_dir,
                proc.rank,
                proc.world_size,
                saving.keep_checkpoints,
                shards=ShardFiles(state),
                # a rank's own file continues only where it reads the same shard: another mesh maps ranks otherwise
                data_shards=[can.data_shard(r, proc.world_size)[0] for r in range(proc.world_size)],
                timeout=options.timeout,
            )
        self.saves = Saves(self.checkpoints, saving, proc.is_main, tracked=options.log.on_record is not None)
        # torch's compile caches beside the checkpoints while the loop runs, for a warm restart (ct.compile)
        self.compile_cache = None
        if self.checkpoints is not None and can.compile_cache and self.checkpoints.local:
            self.compile_cache = CompileCache(self.checkpoints.dir)
        try:
            # checked writable before anything is resumed
            self.log = MetricsLog(options.log.log_file, proc, options.log.tensorboard, options.log.on_record)
            self.stop: StopSignal | None = None  # set by start(); close() undoes what was set up
            # every rank composes the same transforms, or a setup's collective (ct.ema's agreement on its
            # settings, ct.sharded's plan) would meet another rank's next one: a timeout, unclear errors
            everyone = proc.differing(sorted(step_fn.roles))
            if everyone is not None:
                shown = ", ".join(f"rank {r} {roles}" for r, roles in enumerate(everyone))
                raise ValueError(
                    f"{RUN}: the ranks' train steps apply different transforms: {shown}; build the same "
                    "composition on every rank"
                )
            # last, so that nothing above can fail with the model set up; before resuming: e.g. a
            # checkpoint's shards load straight into the shards
            step_fn.setup(state)
            if self.checkpoints is not None and not self.checkpoints.local and _holds_dtensors(state):
                raise ValueError(
                    f"{RUN}: checkpoint_dir {saving.checkpoint_dir!r} is object storage, where ct.run does not save "
                    f"sharded tensors ({step_fn!r} holds DTensors, which DCP writes); give a folder on a shared "
                    "filesystem, or train without sharding"
                )
        except BaseException:
            if self.checkpoints is not None:
                self.checkpoints.close()  # the folder's lock goes with the failed start
            raise

    def resume(self, schedule: Schedule, seed: int) -> Progress:
        """The latest valid checkpoint restored into the state and a given DataLoader's generators, or a
        fresh start with each rank's own random stream. Corrupt checkpoints were set aside by ``latest()``;
        one of other data settings, order or model is refused before anything changes."""
        state = self.state
        if self.compile_cache is not None:  # before the first update compiles anything; close() leaves it
            self.compile_cache.enter()
        latest = self.checkpoints.latest() if self.checkpoints is not None else None
        if latest is None:
            seed_everything(derive_seed(seed, "fresh start", rank=self.shard))  # a data shard's processes alike
            return Progress(schedule, start=state.step)
        path, saved, local = latest  # local None: saved by other processes or another layout (a global batch run)
        self.saves.resumed = True  # a kill from here on resumes at least here: saves may go in the background
        changed = {k: (saved["settings"].get(k), v) for k, v in self.settings.items() if saved["settings"].get(k) != v}
        old, new = changed.get("global_batch_size", (None, None))
        if old is not None and new is not None:
            raise ValueError(
                f"{RUN}: checkpoint {path} continues a run of global_batch_size={old}, and this run has "
                f"global_batch_size={new}: it changes the run (which samples form each update, so the model it "
                f"trains); resume with global_batch_size={old}, or point checkpoint_dir elsewhere to start afresh"
            )
        old, new = changed.get("num_workers", (None, None))
        if old is not None and self.stream is not None and self.stream.mode == "state":
            raise ValueError(
                f"{RUN}: checkpoint {path} holds the state of a stream read by {old} loader worker(s) (0: in the "
                f"training process), and this run reads it with {new}: each worker keeps its own share of the "
                "stream, so neither the dataset nor a StatefulDataLoader of another number of workers can continue "
                f"from it; resume with num_workers={old} (or a DataLoader of as many), or point checkpoint_dir "
                "elsewhere to start afresh"
            )
        if changed:
            listing = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in changed.items())
            raise ValueError(
                f"{RUN}: checkpoint {path} continues a run with other data settings ({listing}); resume with the "
                "same settings, or point checkpoint_dir elsewhere to start afresh"
            )
        given = self.given
        order, generators = (local["order"], local["generators"]) if local is not None else (None, [])
        problem = order_problem(given, saved["position"], order, generators)
        if problem:
            raise ValueError(f"{RUN}: checkpoint {path} {problem}, or point checkpoint_dir elsewhere to start afresh")
        if self.stream is not None:  # first: a load_state_dict that raises leaves the TrainState as it was
            record = local["stream"] if local is not None else saved["stream"]
            restore_stream(self.stream, record, saved["epoch"], saved["position"], self.proc, path)
        given_settings = _hyperparameters(state)
        try:
            state.load_state_dict(saved["state"])
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"{RUN}: the latest checkpoint {path} does not fit this model: {e}; point checkpoint_dir elsewhere "
                "to start afresh"
            ) from e
        _warn_replaced(given_settings, _hyperparameters(state), path)
        if local is not None:
            restore_rng(local["rng"])  # checked by Checkpoints.latest: cannot fail half-way
        else:  # the saved streams were another job's ranks': each rank's from the seed, its rank and the position
            seed_everything(derive_seed(seed, "resume", rank=self.shard, step=state.step))
        if given is not None:
            set_generator_states(given, generators)
        self.started_at = state.step
        return Progress.from_checkpoint(saved, local, schedule, start=state.step)

    def check_stream_state(self) -> None:
        """Refuse, before the first update, a stream whose ``state_dict()`` no checkpoint could hold."""
        if self.stream is not None and self.stream.mode == "state" and self.checkpoints is not None:
            stream_record(self.stream, self.proc, self.state.step, inside=None)

    def refuse_in_the_way(self, schedule: Schedule, start: int) -> None:
        """Refuse a non-checkpoint named like one at a step where this run saves (epoch ends, multiples of
        checkpoint_every, its last update), found now rather than at that save."""
        if self.checkpoints is None:
            return
        per_epoch = schedule.per_epoch  # None: a stream, whose epochs end where it does
        ends = [n for n in (schedule.max_steps, schedule.epochs and per_epoch and schedule.epochs * per_epoch) if n]
        last = min(ends) if ends else schedule.total_updates
        every = schedule.checkpoint_every
        self.checkpoints.refuse_in_the_way(
            lambda n: (
                start < n
                and (last is None or n <= last)
                and (n == last or bool(per_epoch and n % per_epoch == 0) or bool(every and n % every == 0))
            )
        )

    def start(self, show_bar: bool, total: int | None) -> None:
        """What the loop needs from here on; ``close`` undoes it, whatever happens."""
        watching = self.options.watch
        # the profiler window, the FLOP count, the OOM snapshot
        self.watch = Watch(watching, self.proc.rank, self.proc.device, self.state, self.step_fn)
        self.meter = Meter(
            self.proc, self.state, self.step_fn, self.watch.flops, self.peak, watching.straggler_threshold
        )
        self.used_lr: list[Any] | None = None  # each group's learning rate in the last update this process made
        self.bar = progress_bar(show_bar, total, self.state.step)
        self.stop = StopSignal(self.proc)
        # names what a rank waited for when another stops
        self.waiting = Waiting(self.proc, self.options.timeout)

    def epoch(self, at: Progress) -> Iterator[tuple[int, Any, float]]:
        """The current epoch's batches from where ``at`` stands: (batches done after this one, batch, wait)."""
        loader = self.loader
        if isinstance(loader, Stream):
            first, self.first_read = self.first_read, False
            return open_pass(loader, at.epoch, at.position, self.proc, first=first, waiting=self.waiting)
        assert self.per_epoch is not None  # for the type checker: known but for a stream
        if at.position == 0:
            at.order = epoch_order(loader, self.sampler)  # to replay a given loader's shuffle on resume
        return self.watch.batches(  # each wait for a batch marked "data" in a profiler's window
            epoch_batches(loader, self.sampler, at.epoch, at.position, at.order, self.proc.device, self.per_epoch)
        )

    def end_pass(self, at: Progress) -> Due | None:
        """What is due at the end of a stream's pass, or None when a new pass gave no batch (the stream does not
        start over: the run ends). A stream that gave no batch at all is refused, before anything was trained."""
        if at.position:
            return at.after_pass()
        if at.epoch == 0:
            stream = self.stream
            assert stream is not None  # for the type checker: called for a stream only
            where = " on some rank" if self.proc.world_size > 1 else ""
            raise ValueError(
                f"{RUN}: the stream {type(stream.dataset).__name__} gave no batch{where}: there is nothing to train "
                f"on (batch_size={stream.batch_size}, drop_last={stream.drop_last}); check that its __iter__ yields "
                "items for every rank and loader worker"
            )
        self.spent = True
        return None

    def begin_epoch(self, at: Progress) -> None:
        """``on_epoch_start`` of the epoch that begins, or resumes part-way, in this call."""
        if self.options.on_epoch_start is not None:
            self.waiting.now(f"on_epoch_start of epoch {at.epoch}")
            call_hook(self.options.on_epoch_start, "on_epoch_start", self.state, at.epoch)

    def end_epoch(self, at: Progress) -> None:
        """After the epoch's last update: ``on_epoch_end``, then the epoch's scheduler step, but for a scheduler
        fed a metric, which steps after the evaluation (``evaluate``)."""
        if self.options.on_epoch_end is not None:
            self.waiting.now(f"on_epoch_end of epoch {at.epoch}")
            call_hook(self.options.on_epoch_end, "on_epoch_end", self.state, at.epoch)
        if self.options.eval.scheduler_metric is None:
            self.state.end_epoch()

    def update(self, at: Progress, batch: Any, waited: float) -> None:
        self.waiting.now(f"update {self.state.step + 1} (its forward, backward and gradient all-reduce)")
        started = time.perf_counter()
        lr = _rates_used(self.state.optimizer)  # before the step: the scheduler steps inside it
        with self.watch.update(self.state.step + 1, batch):  # FLOPs counted on the first; the profiler's window
            out = self.step_fn(self.state, batch)
        self.used_lr = lr
        self.meter.add(at.window, out, waited, time.perf_counter() - started, batch)

    @_marked("logging")
    def write_log(self, at: Progress) -> None:
        state = self.state
        self.waiting.now(f"the logging after update {state.step} (the metrics' mean over ranks)")
        # the rate the window's last update used (None: that update was made by an earlier process)
        # "epoch": the epochs completed at the record's step, as in an evaluation record (1 at the first one's end)
        done = at.epoch + (at.position == self.per_epoch or at.ended)
        groups = len(state.optimizer.param_groups)
        used = [None] * groups if self.used_lr is None else self.used_lr
        record = self.meter.read(at.window, done, [None if lr is None else float(lr) for lr in used])
        # the learning-rate rule's input (ct.scaled_lr): samples per update, all processes together
        batch = self.loader.batch_size
        record["global_batch"] = None if batch is None else batch * self.shards
        at.history.append(record)
        self.log.write(record)
        self.bar.update(state.step - self.bar.n)
        self.bar.set_postfix(loss=f"{record['loss']:.4g}", ups=f"{record['updates_per_s']:.1f}")

    def agree_on_stop(self) -> tuple[bool, bool]:
        """Whether any rank was asked to stop (SIGTERM, SIGUSR1), and whether rank 0's clock makes a save due:
        agreed by all ranks (in one all-reduce, with whether any rank's background save is still writing)."""
        self.waiting.now(f"the agreement on whether to stop after update {self.state.step}")
        assert self.stop is not None  # for the type checker: start() ran
        # a failed tracker stops the run, saved; the saves' flags ride along
        stopping = self.stop.check(also=self.log.records.failed is not None, extra=self.saves.flags())
        return stopping, self.saves.agreed(self.stop.shared, self.state.step)

    @property
    def saved_at(self) -> Path | str | None:
        """The last checkpoint published."""
        return self.saves.newest

    @_marked("checkpoint")
    def save(self, at: Progress, last: bool) -> None:
        if self.checkpoints is None:
            return
        self.waiting.now(f"the save of checkpoint step {self.state.step}")
        generators = generator_states(self.given) if self.given is not None else []
        nonfinite = _nonfinite(self.state.model)  # refused by every rank alike: the finite checkpoints stay
        # a run defined by its global batch: the window's means over ranks too, which any world size continues
        stream = self.stream
        elastic = self.options.loader.global_batch_size or (stream is not None and stream.global_state)
        over_ranks = self.meter.over_ranks(at.window) if elastic else []
        mine, everyone = (
            stream_record(stream, self.proc, self.state.step, inside=at.position > 0)
            if stream is not None and stream.mode == "state"
            else (None, None)
        )
        shared, local = at.to_checkpoint(self.state.state_dict(), self.settings, generators, over_ranks, mine, everyone)
        self.saves.save(self.state.step, shared, local, nonfinite, last)

    @_marked("evaluation")
    def evaluate(self, at: Progress) -> None:
        if self.evaluator is None:
            return
        if self.proc.world_size > 1:  # a failing evaluation must not cost the save before it: published first
            self.saves.finish()
        self.waiting.now(f"the evaluation after update {self.state.step}")
        entry: dict[str, Any] = {"step": self.state.step, "epoch": at.epoch, **self.evaluator(self.state.model)}
        for kind, weights in self.step_fn.eval_weights(self.state).items():  # ct.ema's: under "eval_ema"
            with weights:
                entry[f"eval_{kind}"] = self.evaluator(self.state.model)
        at.evals.append(entry)
        self.log.write_eval(at.evals[-1])
        name = self.options.eval.scheduler_metric
        if name is not None:  # an evaluation at an epoch's end: eval_every is refused with it
            self.state.end_epoch(metric=metric_of(entry, name))

    def close(self) -> None:
        """Undo what was set up, whatever happened, and however far ``start`` got."""
        if self.compile_cache is not None:
            self.compile_cache.leave()  # torch's caches where they were before the run
        if self.proc.owns_group and any(isinstance(p, DTensor) for p in self.state.model.parameters()):
            # a sharded model needs the group whenever it gathers (full_state_dict, evaluation, a save): the
            # trained model must stay usable after the run, so the group lives until the process exits
            self.proc.keep_until_exit(self.state.release_runtime)
        elif self.proc.owns_group:  # the DDP wrapper would keep the group (and its threads) past its destruction
            self.state.release_runtime()
        if self.stop is not None:
            self.stop.restore()
            self.bar.close()
            self.watch.close()
        try:
            self.log.close()
        finally:
            if self.checkpoints is not None:
                self.checkpoints.close()  # the folder is free for the next run, whatever failed above
        if isinstance(self.loader, Reader | Stream):  # ct.run's own loaders: their workers end with the run
            self.loader.close()
        if self.evaluator is not None:
            self.evaluator.close()


# what a scheduler changes as it goes (or its position): a resumed one differs from a new one in these by design
_PROGRESS = frozenset(
    {
        "last_epoch",
        "_step_count",
        "_last_lr",
        "_get_lr_called_within_step",
        "_is_initial",
        "best",
        "num_bad_epochs",
        "cooldown_counter",
        "verbose",
    }
)


def _hyperparameters(state: TrainState) -> dict[str, Any]:
    """The optimizer's and scheduler's settings as plain values, by name (``param group 0 lr``, ``scheduler
    T_max``): those a checkpoint's would replace. A group's ``lr`` is the scheduler's to change under one (its
    ``initial_lr`` stands for it), and ``momentum`` and ``betas`` are under one that cycles them (OneCycleLR,
    CyclicLR: ``cycle_momentum``); under any other they are the user's, compared as given."""
    found: dict[str, Any] = {}
    scheduled = set() if state.scheduler is None else {"lr"}
    inner = [state.scheduler, *getattr(state.scheduler, "_schedulers", [])]  # SequentialLR, ChainedScheduler
    if any(getattr(s, "cycle_momentum", False) is True for s in inner):
        scheduled |= {"momentum", "betas"}
    for i, group in enumerate(state.optimizer.param_groups):
        for k, v in group.items():
            if k != "params" and k not in scheduled and type(v) in (int, float, bool, str, tuple, type(None)):
                found[f"param group {i} {k}"] = v

    def walk(value: Any, name: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k not in _PROGRESS:
                    walk(v, f"{name} {k}")
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{name}[{i}]")
        elif type(value) in (int, float, bool, str, list, tuple):
            found[name] = value

    if state.scheduler is not None:
        walk(state.scheduler.state_dict(), "scheduler")
    return found


def _warn_replaced(given: dict[str, Any], restored: dict[str, Any], path: Path) -> None:
    """Say which settings given to this run the checkpoint's replaced (a new lr, T_max: ignored otherwise)."""
    changed = [f"{k} {restored[k]!r} (given {v!r})" for k, v in given.items() if k in restored and restored[k] != v]
    if changed:
        warnings.warn(
            f"{RUN}: resuming from checkpoint {path}, whose optimizer and scheduler settings replace those given: "
            f"{'; '.join(changed[:6])}{'; ...' if len(changed) > 6 else ''}; the run goes on with the checkpoint's. "
            "To train on with new ones, ct.load_checkpoint the last checkpoint into a TrainState built with them "
            "and run it in a new checkpoint_dir",
            stacklevel=4,
        )


def _holds_dtensors(state: TrainState) -> bool:
    """Whether the model's parameters are DTensors (ct.sharded, ct.tensor_parallel): saved through DCP."""
    return any(isinstance(p, DTensor) for p in state.model.parameters())


def _nonfinite(model: torch.nn.Module) -> str | None:
    """The name of the model's first parameter holding NaN or inf (this rank's shard of a sharded one), or None:
    one pass over the parameters and one host sync, at a save only. Buffers may hold inf by design (a mask)."""
    named = [(n, p.to_local() if isinstance(p, DTensor) else p) for n, p in model.named_parameters()]
    named = [(n, p) for n, p in named if p.is_floating_point() or p.is_complex()]
    if not named:
        return None
    device = named[0][1].device  # a model split over devices (pipeline_split): the flags gathered on one
    finite = torch.stack([_finite(p.detach()).to(device) for _, p in named])
    return next((n for (n, _), ok in zip(named, finite.tolist(), strict=True) if not ok), None)


def _finite(t: torch.Tensor) -> torch.Tensor:
    """Whether ``t`` holds no NaN or inf, as a 0-dim bool tensor on its device: its smallest and largest values
    (NaN propagates to both, an inf is one of them), one pass and no tensor of flags its size (16 times faster
    than ``isfinite(t).all()`` on a CPU: it runs at every save, at the update boundary)."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    low, high = torch.aminmax(torch.view_as_real(t) if t.is_complex() else t)
    return torch.isfinite(low) & torch.isfinite(high)


def _rates_used(optimizer: Any) -> list[Any]:
    """Each parameter group's learning rate, as the next ``optimizer.step()`` uses it: read before the
    update (the scheduler steps inside it), a tensor rate copied on its device (schedulers fill it in place;
    reading it is the log point's host sync), a NumPy one as it is (``float`` at the log point: JSON takes
    neither)."""
    rates = [g.get("lr") for g in optimizer.param_groups]  # None: a group with no rate (a custom one): null
    return [lr.detach().clone() if isinstance(lr, torch.Tensor) else lr for lr in rates]

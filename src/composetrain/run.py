"""ct.run: the small driver. Loaders, devices, rendezvous, logging, evaluation, checkpoints."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from composetrain._util import show
from composetrain.batching import leading_size
from composetrain.checkpoint import Checkpoints, restore_rng
from composetrain.core import PlainStep, StepOutput, TrainStep
from composetrain.core import train_step as lift
from composetrain.data import auto_workers, make_loader, to_device
from composetrain.rendezvous import Process, rendezvous
from composetrain.state import TrainState

__all__ = ["RunResult", "run"]

EvalStep = Callable[[torch.nn.Module, Any], Mapping[str, Any]]


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
        bottleneck: a sentence naming what limits throughput, and the fix.
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


def run(
    train_step: PlainStep | TrainStep,
    state: TrainState,
    data: Any,
    *,
    epochs: int | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    shuffle: bool = True,
    drop_last: bool = False,
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
        batch_size: samples per update per process (required for a Dataset).
        shuffle: reshuffle every epoch (``DistributedSampler.set_epoch``).
        drop_last: drop each epoch's last, smaller batch.
        num_workers: loader workers, or "auto" (this process's share of the cores, less one).
        collate_fn: the loader's collate function.
        eval_step: ``eval_step(model, batch) -> {name: scalar}``, batch means; run under
            ``torch.no_grad()`` in eval mode, averaged over ``eval_data`` and over ranks.
        eval_data: a Dataset or DataLoader to evaluate on.
        eval_every: evaluate every this many updates (default: at each epoch's end).
        log_every: read metrics from the device every this many updates (no host
            sync on the others).
        log_file: JSON-lines metrics file (default ``checkpoint_dir/metrics.jsonl``).
        progress: show a progress bar on rank 0.
        checkpoint_dir: save and resume here; None disables checkpoints.
        checkpoint_every: also save every this many updates (always at each epoch's
            end, at the end, and on SIGTERM/SIGUSR1).
        keep_checkpoints: how many of the newest checkpoints to keep.
        seed: seeds the data order, the workers and (on a fresh start) Python, NumPy and
            torch generators, with each rank's own stream.
        requeue: on SIGTERM/SIGUSR1 under SLURM, requeue the job after saving.
        timeout: seconds to wait for the other processes (rendezvous and collectives).

    Returns:
        The RunResult.

    Example:
        >>> train = ct.distributed(ct.mixed_precision(ct.accumulate(4)(step)))
        >>> result = ct.run(train, ct.TrainState(model, opt), dataset, batch_size=256, epochs=3,
        ...                 checkpoint_dir="runs/a")
        >>> result.history[-1]["loss"], result.bottleneck
    """
    who = "run"
    step_fn = lift(train_step)
    _check_arguments(epochs, max_steps, log_every, checkpoint_every, keep_checkpoints, eval_every, state, who)
    with rendezvous(timeout=timeout) as proc:
        if proc.world_size > 1 and "distributed" not in step_fn.roles:
            raise ValueError(
                f"{who}: {proc.world_size} processes are running but {step_fn!r} does not synchronise them; "
                "wrap it: ct.distributed(...)"
            )
        if not step_fn.roles & {"data_parallel", "pipeline_split"}:  # those place the model themselves
            state.model.to(proc.device)
        loader, sampler = make_loader(
            data, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
            pin_memory=proc.device.type == "cuda", collate_fn=collate_fn, rank=proc.rank,
            world_size=proc.world_size, local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            seed=seed, who=who,
        )  # fmt: skip
        evaluate = _evaluator(eval_step, eval_data, batch_size, collate_fn, proc, who)
        checkpoints = None
        if checkpoint_dir is not None:
            checkpoints = Checkpoints(checkpoint_dir, proc.rank, proc.world_size, keep_checkpoints, who)
        log_path = Path(log_file) if log_file else Path(checkpoint_dir) / "metrics.jsonl" if checkpoint_dir else None
        # every rank runs the same number of updates per epoch, or DDP would hang (pitfall 11)
        per_epoch = proc.fewest(len(loader))
        if per_epoch == 0:
            raise ValueError(f"{who}: some process has no batch in an epoch: use a smaller batch_size")
        if epochs is None:
            epochs = 1 if max_steps is None else math.ceil(max_steps / per_epoch)

        # resume from the latest valid checkpoint, or start afresh with each rank's own random stream
        epoch, position, history, evals = 0, 0, [], []
        latest = checkpoints.latest() if checkpoints is not None else None
        if latest is not None:
            path, saved, local = latest
            try:
                state.load_state_dict(saved["state"])
            except (ValueError, TypeError) as e:
                raise ValueError(
                    f"{who}: the latest checkpoint {path} does not fit this model: {e}; point checkpoint_dir "
                    "elsewhere to start afresh"
                ) from e
            restore_rng(local["rng"])
            epoch, position, history, evals = saved["epoch"], saved["position"], saved["history"], saved["evals"]
        else:
            _seed_everything(seed * 1000003 + proc.rank)
        meter = _Meter(proc, state, local["window"] if latest is not None else [])

        def save(epoch: int, position: int) -> Path:
            assert checkpoints is not None
            loop = {"epoch": epoch, "position": position, "history": history, "evals": evals}
            return checkpoints.save(state.step, {"state": state.state_dict(), **loop}, {"window": meter.outputs})

        stop = _StopSignal(proc)
        bar = _progress(progress and proc.is_main, max_steps or epochs * per_epoch, state.step)
        saved_at: Path | None = None
        try:
            while epoch < epochs and not stop.agreed and not (max_steps and state.step >= max_steps):
                if sampler is not None:
                    sampler.set_epoch(epoch, start=position * loader.batch_size)  # type: ignore[operator]
                elif hasattr(loader.sampler, "set_epoch"):
                    loader.sampler.set_epoch(epoch)
                batches = iter(loader)
                for _ in range(position if sampler is None else 0):  # a loader given as is: skip what was seen
                    next(batches)
                seen = position
                for position in range(seen + 1, per_epoch + 1):  # position: batches of this epoch done
                    tick = time.perf_counter()
                    batch = to_device(next(batches), proc.device)
                    fetched = time.perf_counter()
                    out = step_fn(state, batch)
                    meter.add(out, fetched - tick, time.perf_counter() - fetched)
                    if meter.crossed(log_every) or position == per_epoch:
                        record = meter.read(epoch, state.optimizer.param_groups[0]["lr"])
                        history.append(record)
                        _write_log(log_path, record, proc)
                        bar.update(state.step - bar.n)
                        bar.set_postfix(loss=f"{record['loss']:.4g}", ups=f"{record['updates_per_s']:.1f}")
                    if evaluate is not None and eval_every and meter.crossed(eval_every, "eval"):
                        evals.append({"step": state.step, "epoch": epoch, **evaluate(state.model)})
                    stopping = stop.check()  # agreed by all ranks: they stop after the same update
                    done = stopping or bool(max_steps and state.step >= max_steps)
                    due = checkpoint_every and meter.crossed(checkpoint_every, "save")
                    if checkpoints is not None and (done or due) and position < per_epoch:
                        saved_at = save(epoch, position)
                    if done:
                        break
                if position == per_epoch:  # the epoch ran to its end
                    epoch, position = epoch + 1, 0
                    if evaluate is not None and not eval_every:
                        evals.append({"step": state.step, "epoch": epoch, **evaluate(state.model)})
                    if checkpoints is not None:
                        saved_at = save(epoch, 0)
        finally:
            bar.close()
            stop.restore()
        if stop.agreed:
            _requeue(requeue, proc, who)
        result = RunResult(
            history=history, evals=evals, steps=state.step, epochs=epoch, preempted=stop.agreed,
            data_wait=meter.data_wait, bottleneck=meter.bottleneck(loader), checkpoint=saved_at,
        )  # fmt: skip
        if proc.is_main and progress:
            print(f"{who}: {result.steps} updates, {result.epochs} epoch(s); {result.bottleneck}", file=sys.stderr)
        return result


def _check_arguments(
    epochs: Any,
    max_steps: Any,
    log_every: Any,
    checkpoint_every: Any,
    keep_checkpoints: Any,
    eval_every: Any,
    state: Any,
    who: str,
) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(
            f"{who}: state must be a ct.TrainState, got {show(state)}; build ct.TrainState(model, optimizer)"
        )
    for name, value, optional in (
        ("epochs", epochs, True),
        ("max_steps", max_steps, True),
        ("log_every", log_every, False),
        ("checkpoint_every", checkpoint_every, True),
        ("keep_checkpoints", keep_checkpoints, False),
        ("eval_every", eval_every, True),
    ):
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{who}: {name} must be a positive int{' or None' if optional else ''}, got {show(value)}")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


class _Meter:
    """Outputs kept on the device between log points; read (one host sync), reduced over ranks, at them."""

    def __init__(self, proc: Process, state: TrainState, window: list[StepOutput]) -> None:
        self.proc, self.state = proc, state
        # the outputs since the last log point; a checkpoint carries them, so history resumes exactly
        self.outputs: list[StepOutput] = window
        self.waited = self.computed = 0.0  # whole run
        self.window_start = time.perf_counter()
        self.window_wait = 0.0
        self.start = state.step  # a resumed run keeps its cadence: multiples of the totals
        self.marks: dict[str, int] = {}

    def add(self, out: StepOutput, waited: float, computed: float) -> None:
        self.outputs.append(out)
        self.waited += waited
        self.computed += computed
        self.window_wait += waited

    def crossed(self, every: int, what: str = "log") -> bool:
        """Whether state.step reached a new multiple of ``every`` since the last time it said so."""
        mark = self.state.step // every
        if mark > self.marks.get(what, self.start // every):
            self.marks[what] = mark
            return True
        return False

    def read(self, epoch: int, lr: float) -> dict[str, Any]:
        names = sorted(self.outputs[0].metrics)
        device = self.outputs[0].loss.device
        rows = [torch.stack([o.loss.float(), *(o.metrics[k].float().to(device) for k in names)]) for o in self.outputs]
        means = torch.stack(rows).mean(0)
        if self.proc.world_size > 1:
            dist.all_reduce(means)  # out.loss averaged over ranks is the global mean (ct.distributed)
            means /= self.proc.world_size
        values = means.tolist()  # the one host sync of a log point
        elapsed = time.perf_counter() - self.window_start
        record = {
            "step": self.state.step,
            "epoch": epoch,
            "loss": values[0],
            **dict(zip(names, values[1:], strict=True)),
            "lr": lr,
            "skipped": sum(bool(o.skipped) for o in self.outputs),
            "updates_per_s": len(self.outputs) / elapsed if elapsed > 0 else float("nan"),
            "data_wait": self.window_wait / elapsed if elapsed > 0 else 0.0,
        }
        self.outputs, self.window_start, self.window_wait = [], time.perf_counter(), 0.0
        return record

    @property
    def data_wait(self) -> float:
        total = self.waited + self.computed
        return self.waited / total if total > 0 else 0.0

    def bottleneck(self, loader: DataLoader[Any]) -> str:
        share = self.data_wait
        if share <= 0.2:
            return f"compute-bound: data loading is {share:.0%} of the step"
        spare = auto_workers(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        if loader.num_workers < spare:
            return (
                f"data loading is {share:.0%} of the step: raise num_workers (now {loader.num_workers}; this "
                f"process has cores for {spare}), or make the dataset's __getitem__ cheaper"
            )
        return (
            f"data loading is {share:.0%} of the step, and its {loader.num_workers} workers already use every "
            "spare core: make the dataset's __getitem__ cheaper (decode once and cache, smaller inputs) or "
            "give the job more CPUs"
        )


class _StopSignal:
    """SIGTERM / SIGUSR1 (SLURM pre-emption) ask to stop; ranks agree before anyone stops."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.requested = False
        self.agreed = False
        self.previous: dict[int, Any] = {}
        # a gloo group of its own: the flags stay on the CPU, so checking them never syncs a GPU
        self.group: Any = dist.new_group(backend="gloo") if proc.world_size > 1 else None
        for name in ("SIGTERM", "SIGUSR1"):
            sig = getattr(signal, name, None)
            if sig is not None and _in_main_thread():
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def check(self) -> bool:
        """After each update: has any rank been asked to stop? (one tiny CPU all-reduce when distributed)."""
        if self.group is None:
            self.agreed = self.requested
        else:
            flag = torch.tensor([int(self.requested)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            self.agreed = bool(flag.item())
        return self.agreed

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _requeue(requeue: bool, proc: Process, who: str) -> None:
    job = os.environ.get("SLURM_JOB_ID")
    if not (requeue and job and proc.is_main):
        return
    try:
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, text=True, timeout=60)
        print(f"{who}: saved and requeued SLURM job {job}", file=sys.stderr)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"{who}: saved, but could not requeue SLURM job {job}: {e}", file=sys.stderr)


def _write_log(path: Path | None, record: dict[str, Any], proc: Process) -> None:
    if path is None or not proc.is_main:
        return
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class _NoBar:
    n = 0

    def update(self, k: int) -> None:
        self.n += k

    def set_postfix(self, **_: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(show_bar: bool, total: int, done: int) -> Any:
    if not show_bar:
        bar = _NoBar()
        bar.n = done
        return bar
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="update", dynamic_ncols=True)


def _evaluator(
    eval_step: EvalStep | None, eval_data: Any, batch_size: int | None, collate_fn: Any, proc: Process, who: str
) -> Callable[[torch.nn.Module], dict[str, float]] | None:
    if eval_step is None and eval_data is None:
        return None
    if eval_step is None or eval_data is None:
        raise ValueError(f"{who}: give eval_step and eval_data together")
    if isinstance(eval_data, DataLoader):
        loader = eval_data
    else:
        if batch_size is None:
            raise ValueError(f"{who}: batch_size is required when eval_data is a Dataset")
        # each rank a disjoint share, none padded: the metrics are exact means over eval_data
        shard = Subset(eval_data, range(proc.rank, len(eval_data), proc.world_size))
        loader = DataLoader(
            shard, batch_size=batch_size, collate_fn=collate_fn, generator=torch.Generator().manual_seed(proc.rank)
        )

    @torch.no_grad()
    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for batch in loader:
            batch = to_device(batch, proc.device)
            metrics = eval_step(model, batch)
            if not isinstance(metrics, Mapping):
                raise TypeError(f"{who}: eval_step must return a mapping of names to scalars, got {show(metrics)}")
            n = leading_size(batch) or 1
            for k, v in metrics.items():
                value = torch.as_tensor(v, dtype=torch.float64, device=proc.device).reshape(()) * n
                sums[k] = sums[k] + value if k in sums else value
            count += n
        model.train(was_training)
        names = sorted(sums)
        count_t = torch.tensor(float(count), dtype=torch.float64, device=proc.device)
        totals = torch.stack([*(sums[k] for k in names), count_t])
        if proc.world_size > 1:
            dist.all_reduce(totals)
        values = totals.tolist()
        return {k: v / values[-1] for k, v in zip(names, values[:-1], strict=True)}

    return evaluate

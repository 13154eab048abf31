"""What ct.run watches: metrics kept on the device between log points, timing, the log file, the bar."""

from __future__ import annotations

import dataclasses
import errno
import itertools
import json
import math
import os
import re
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from composetrain.core.batching import samples
from composetrain.core.metric_names import EVAL_FIELDS, MEASURED, TRAIN_FIELDS, metric_names
from composetrain.core.protocol import StepOutput, TrainStep
from composetrain.core.state import TrainState
from composetrain.core.util import RUN
from composetrain.data.kinds import as_hdf5, as_mapped, augmented_inside
from composetrain.driver.compiling import compile_totals
from composetrain.driver.reader import auto_workers
from composetrain.driver.stragglers import DEFAULT_THRESHOLD, RankTimes, Stragglers
from composetrain.driver.throughput import FlopCount, mfu, peak_memory
from composetrain.driver.tracking import Records, Tracker, sent_file
from composetrain.launch.agree import gathered, gathered_numbers
from composetrain.launch.rendezvous import Process

__all__ = ["EVAL_FIELDS", "MEASURED", "TRAIN_FIELDS", "Meter", "MetricsLog", "metric_names", "progress_bar"]


class Meter:
    """Step outputs kept on the device between log points (the window, which ``Progress`` owns and
    checkpoints carry), read in one host sync and averaged over ranks at them; the time spent
    waiting for data against the time in the step; the samples (and tokens), FLOPs and peak memory of each
    window, and each rank's timings, gathered at log points to name a rank the others wait for."""

    def __init__(
        self,
        proc: Process,
        state: TrainState,
        step_fn: TrainStep | None = None,
        flops: FlopCount | None = None,
        peak: float | None = None,
        straggler_threshold: float = DEFAULT_THRESHOLD,
    ) -> None:
        self.proc, self.state, self.step_fn = proc, state, step_fn
        self.waited = self.computed = 0.0  # this call of ct.run
        self.window_start = time.perf_counter()
        self.window_wait = 0.0
        self.first = True  # the first update of this call: a resumed window is compared with it
        self.checked_names: tuple[Any, ...] | None = None  # the metric names metric_names last passed
        # torch.compile's totals in this process when this call (and its window) began
        self.compiled_before = self.window_compiled = compile_totals()
        # the composition counts units of its own (accumulate's weight=: tokens): samples are counted apart
        self.by_weight = step_fn is not None and step_fn.weight is not None
        self.flops = flops if flops is not None else FlopCount()
        self.peak = peak
        # this process's updates in the window, their samples and units, its seconds in the step and waiting in it
        self.window_updates, self.window_samples, self.window_units, self.window_step = 0, 0.0, 0.0, 0.0
        self.window_flops: float | None = 0.0  # None: an update of the window came before the count
        self.waited_before = step_fn.waited(state) if step_fn is not None else 0.0
        host = socket.gethostname()
        self.hosts = gathered(host) if proc.world_size > 1 else [host]  # once: who a straggler is
        self.stragglers = Stragglers(straggler_threshold)
        peak_memory(proc.device)  # the first window's peak starts now

    def add(self, window: list[StepOutput], out: StepOutput, waited: float, computed: float, batch: Any = None) -> None:
        """Append ``out`` to ``window`` (its metric names checked and made plain ``str``: a few keys and
        dtypes, no host sync) and count the time it waited for its batch and computed, and its samples."""
        names = tuple(out.metrics)
        if names == self.checked_names and all(type(k) is str for k in names):  # as the last update's: checked
            metrics = out.metrics
        else:
            metrics = metric_names(out.metrics, TRAIN_FIELDS, "the step")
            self.checked_names = names
        for k, v in metrics.items():
            if v.is_complex():  # Meter.read's float() would keep the real part alone
                raise TypeError(
                    f"{RUN}: the step returns metric {k!r} as a complex tensor; a logged metric is a real number: "
                    f"return {k!r}: z.abs(), or z.real and z.imag as two metrics"
                )
            if v.is_meta:  # Meter.read would fail to copy it at the log point, updates later
                raise TypeError(
                    f"{RUN}: the step returns metric {k!r} on the 'meta' device, which holds no value; compute it "
                    "from the batch's outputs, on their device"
                )
        if self.first and window and sorted(metrics) != sorted(window[0].metrics):  # restored from a checkpoint
            raise ValueError(
                f"{RUN}: the step's metrics changed across the resume: the checkpoint's {len(window)} update(s) "
                f"not yet logged returned {sorted(window[0].metrics)}, and the step returns now {sorted(metrics)} "
                "(a transform that reports metrics was added or removed, such as accumulate('auto'), which "
                "reports 'micro_batch'); resume with the step that saved it, or start afresh in another "
                "checkpoint_dir"
            )
        self.first = False
        if any(type(k) is not str for k in out.metrics):
            out = dataclasses.replace(out, metrics=metrics)
        window.append(out)
        self.waited += waited
        self.computed += computed
        self.window_wait += waited
        self.window_step += computed
        units = out.units if out.units is not None else 0.0
        count = float(samples(batch)) if self.by_weight else units
        if self.flops.total is not None and self.flops.samples is None:  # the update the FLOPs were counted on
            self.flops.samples = count
        flops = self.flops.of(count)
        self.window_flops = None if flops is None or self.window_flops is None else self.window_flops + flops
        self.window_updates += 1
        self.window_samples += count
        self.window_units += units

    def read(self, window: list[StepOutput], epoch: int, rates: list[float | None]) -> dict[str, Any]:
        """The record of the updates in ``window`` (those since the last log point), which it empties; on
        every rank (a collective when several). ``rates``: each parameter group's rate in the window's last
        update: ``lr`` is the first group's, ``lr_groups`` all of them where there are several (layer decay)."""
        device = window[-1].loss.device
        names = self._agreed_names(window)
        rows = [
            torch.stack([o.loss.to(device, torch.float64), *(o.metrics[k].to(device, torch.float64) for k in names)])
            for o in window
        ]
        # torch.compile's compilations and seconds in this window, and compilations since this call began:
        # in the same all-reduce, so that every rank's record says the same (the ranks' mean)
        now = compile_totals()
        compiled = [
            now[0] - self.window_compiled[0],
            now[1] - self.window_compiled[1],
            now[0] - self.compiled_before[0],
        ]
        self.window_compiled = now
        # this process's samples, units and FLOPs in the window (NaN: an update before the count), summed over ranks
        # in the same all-reduce
        flops = self.window_flops if self.window_flops is not None else math.nan
        made = [self.window_samples, self.window_units, flops, self.window_updates]
        means = torch.cat(
            [torch.stack(rows).mean(0), torch.tensor(compiled + made, dtype=torch.float64, device=device)]
        )
        if self.proc.world_size > 1:
            dist.all_reduce(means)  # out.loss averaged over ranks is the global mean (ct.distributed)
            means /= self.proc.world_size
        values = means.tolist()  # the one host sync of a log point
        *values, compiles, compile_s, run_compiles, samples_, units, flops, updates = values
        elapsed = time.perf_counter() - self.window_start
        world = self.proc.world_size
        record = {
            "step": self.state.step,
            "epoch": epoch,
            "loss": values[0],
            **dict(zip(names, values[1:], strict=True)),
            "lr": rates[0] if rates else None,
            **({"lr_groups": rates} if len(rates) > 1 else {}),
            "skipped": sum(bool(o.skipped) for o in window),
            "updates_per_s": len(window) / elapsed if elapsed > 0 else float("nan"),
            "data_wait": self.window_wait / elapsed if elapsed > 0 else 0.0,
        }
        if run_compiles > 0:  # this run compiled: how often and how long, in this window
            record["compiles"] = int(compiles) if compiles.is_integer() else compiles
            record["compile_s"] = compile_s
        record.update(self._throughput(samples_ * world, units * world, flops, updates, elapsed))
        window.clear()
        self.window_start, self.window_wait = time.perf_counter(), 0.0
        self.window_updates, self.window_samples, self.window_units, self.window_step = 0, 0.0, 0.0, 0.0
        self.window_flops = 0.0
        return record

    def _throughput(
        self, samples_: float, units: float, flops: float, updates: float, elapsed: float
    ) -> dict[str, Any]:
        """The window's throughput fields (all processes together), its peak memory (the largest rank's) and the
        ranks the others waited for: each rank's timings gathered in one small collective."""
        world = self.proc.world_size
        rate = updates / elapsed if elapsed > 0 else float("nan")  # this call's updates (a resumed window's are not)
        fields: dict[str, Any] = {"samples_per_s": samples_ / elapsed if elapsed > 0 else float("nan")}
        if self.by_weight:
            fields["tokens_per_s"] = units / elapsed if elapsed > 0 else float("nan")  # the weight's units
        # FLOPs of one update of all processes: each process's own counted once, scaled by its samples
        per_update = flops * world / updates if math.isfinite(flops) and updates else None
        fields["flops_per_update"] = per_update
        if self.peak is not None:
            fields["mfu"] = mfu(per_update, rate, self.peak, world)
        waited_now = self.step_fn.waited(self.state) if self.step_fn is not None else 0.0
        mine = [self.window_step, waited_now - self.waited_before, self.window_wait, peak_memory(self.proc.device)]
        self.waited_before = waited_now
        every = gathered_numbers(mine)
        fields["peak_memory_mib"] = max(theirs[3] for theirs in every)
        if world > 1:
            times = [RankTimes(*theirs[:3]) for theirs in every]
            found = self.stragglers.see(times, self.hosts, elapsed)
            if found:
                fields["stragglers"] = found
        return fields

    def over_ranks(self, window: list[StepOutput]) -> list[StepOutput]:
        """Each update of ``window`` as the mean of its loss and metrics over the ranks (float64, on the CPU): what
        a checkpoint of a run defined by its global batch keeps, so that any number of processes continues the
        record (``read`` averages over updates and ranks alike, and a mean over ranks is the same on every rank).
        A collective when several ranks hold a window; at a save only."""
        if not window:
            return []
        names = self._agreed_names(window)
        device = window[-1].loss.device
        values = [(o.loss, *(o.metrics[k] for k in names)) for o in window]
        rows = torch.stack([torch.stack([v.to(device, torch.float64) for v in row]) for row in values])
        if self.proc.world_size > 1:
            dist.all_reduce(rows)
            rows /= self.proc.world_size
        rows = rows.cpu()
        return [
            StepOutput(row[0], dict(zip(names, row[1:].unbind(), strict=True)), bool(o.skipped))
            for row, o in zip(rows, window, strict=True)
        ]

    def _agreed_names(self, window: list[StepOutput]) -> list[str]:
        """The metric names of the window, the same for every update and on every rank, or the same error
        on every rank: their values are averaged name by name, in one all-reduce of one tensor."""
        names = sorted(window[0].metrics)
        problem = None
        for i, o in enumerate(window):
            if sorted(o.metrics) != names:
                extra, missing = sorted(o.metrics.keys() - set(names)), sorted(set(names) - o.metrics.keys())
                name, where, where_not = (extra[0], i + 1, 1) if extra else (missing[0], 1, i + 1)
                problem = (
                    f"{RUN}: the step returned metric {name!r} for update {where} since the last log point but not "
                    f"for update {where_not} (metrics {sorted(o.metrics)} against {names}); return the same "
                    "metric names from every update"
                )
                break
        everyone = self.proc.differing((names, problem))
        if problem is not None:
            raise ValueError(problem)
        if everyone is None:
            return names
        for rank, (_, theirs) in enumerate(everyone):
            if theirs is not None:
                raise ValueError(f"{theirs} (on rank {rank})")
        listing = "; ".join(f"rank {rank}: {theirs}" for rank, (theirs, _) in enumerate(everyone))
        raise ValueError(
            f"{RUN}: the step returned different metric names on different ranks ({listing}); return the same "
            "names on every rank"
        )

    @property
    def data_wait(self) -> float:
        total = self.waited + self.computed
        return self.waited / total if total > 0 else 0.0

    def bottleneck(self, loader: Any) -> str:
        """What limits throughput, and the fix; with what num_workers="auto" chose, and why; first the time
        torch.compile took, when it is a large share of the step's."""
        count, seconds = (now - before for now, before in zip(compile_totals(), self.compiled_before, strict=True))
        compiling = ""
        if count and seconds > 0.2 * self.computed:
            compiling = (
                f"torch.compile took {seconds:.1f} s of the {self.computed:.1f} s spent in the step ({int(count)} "
                "compilation(s)): a longer run amortises it, a resumed one loads torch's caches kept in "
                "checkpoint_dir, and more compilations than shapes point to graph breaks or changing shapes "
                "(TORCH_LOGS=recompiles); "
            )
        return compiling + self.stragglers.sentence() + self._limit(loader)

    def _limit(self, loader: Any) -> str:
        cause, choice = self._cause(loader), getattr(loader, "choice", None)
        if choice and loader.num_workers == 0 and self.data_wait > 0.2:  # auto weighed workers: no "raise" advice
            return f"data loading is {self.data_wait:.0%} of the step; {choice}; {_cheaper(loader)}"
        return f"{cause}; {choice}" if choice else cause

    def _cause(self, loader: Any) -> str:
        share = self.data_wait
        if share <= 0.2:
            return f"compute-bound: data loading is {share:.0%} of the step"
        spare = auto_workers(self.proc.local_world_size)
        if loader.num_workers < spare:
            return (
                f"data loading is {share:.0%} of the step: raise num_workers (now {loader.num_workers}; this "
                f"process has cores for {spare}), or {_cheaper(loader)}"
            )
        return (
            f"data loading is {share:.0%} of the step, and its workers ({loader.num_workers}) already use every "
            f"spare core: {_cheaper(loader)}"
        )


def _cheaper(loader: Any) -> str:
    """How to make reading cheaper: cache the items once with ct.cache, unless the data is memory-mapped already
    (a ct.cache store, an HDF5 file's contiguous datasets); datasets of an HDF5 file that h5py reads, contiguous."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, IterableDataset):  # a stream: ct.cache stores map-style datasets only
        return (
            "make the stream's reading cheaper (its __iter__), or read it with loader workers (num_workers=N: it "
            "splits itself among them by get_worker_info), or give the job more CPUs"
        )
    h5 = as_hdf5(dataset)
    if h5 is not None and not h5.memory_mapped:
        return (
            f"ct.hdf5 reads {h5.read_by_h5py} through h5py (chunked or compressed), far slower than a memory map: "
            "write them contiguous and uncompressed, ct.cache(dataset, path) them, or give the job more CPUs"
        )
    data = as_mapped(dataset)
    if data is not None:
        what = data.described
        if data.augment is not None:
            return f"the data is {what} already: make its augment cheaper or give the job more CPUs"
        return f"the data is {what} already, read a whole batch at a time: give the job more CPUs"
    if augmented_inside(dataset):  # a Subset of an augmented store: ct.cache of it is refused
        return "the data wraps an augmented memory-mapped store already: make its augment cheaper or give more CPUs"
    return (
        "make the dataset's __getitem__ cheaper: preprocess once with ct.cache(dataset, path) (items decoded "
        "once, then read a whole batch at a time from a memory map), smaller inputs, or give the job more CPUs"
    )


class MetricsLog:
    """The JSON-lines file of records, and optionally TensorBoard event files, written by rank 0.

    Training records are written at each log point, evaluation records as
    ``{"step", "epoch", "eval": {name: value}}`` when they are made. A resumed run rewrites the file
    from the history and evaluations it resumes with, so that a crash between a log point and the
    next checkpoint leaves no duplicate lines (what those lines had sent to ``on_record`` is kept beside it,
    ``Records.resume``, so that a second crash before they are made again does not send them twice);
    TensorBoard is told to purge what it holds from the resumed step on. A file that is not this run's (a
    fresh start finds it non-empty; a resumed run finds its training records not beginning with its
    history) is never overwritten: it is moved aside to ``name.1`` (or the first free ``name.N``) with a warning.
    """

    def __init__(
        self, path: Path | None, proc: Process, tensorboard: Path | None = None, on_record: Tracker | None = None
    ) -> None:
        """Check, on every rank together, that rank 0 can write ``path`` (before anything is resumed)."""
        self.path = path if proc.is_main else None
        self.tensorboard = tensorboard if proc.is_main else None
        self.board: Any = None
        self.records = Records(on_record if proc.is_main else None)  # on_record: rank 0's records are the means
        for arg, target, make in (("log_file", self.path, _touch), ("tensorboard", self.tensorboard, _folder)):
            problem = None
            if target is not None:
                try:
                    make(target)
                except OSError as e:
                    problem = e.strerror or str(e)
            everyone = proc.differing(problem)
            problem = problem or (everyone[0] if everyone else None)
            if problem is not None:
                where = path if arg == "log_file" else tensorboard
                raise PermissionError(
                    f"{RUN}: {arg} {str(where)!r} is not writable ({problem}); choose a "
                    f"{'file' if arg == 'log_file' else 'folder'} you can write to"
                )

    def start(self, history: list[dict[str, Any]], evals: list[dict[str, Any]], resumed: bool, step: int) -> None:
        """Begin with ``history`` and ``evals``: the records of the run resumed at ``step`` (none on a fresh start)."""
        if self.tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter  # checked importable by ct.run

            # a resumed run hides what the crashed one wrote from ``step`` on (it is made again), then
            # writes back the records at ``step`` that the checkpoint holds and no update makes again; a
            # fresh start hides every earlier event file's steps (a rerun after a crash before the first
            # checkpoint would show them twice), as the metrics file is moved aside
            purge = step if resumed else 0 if any(self.tensorboard.glob("*tfevents*")) else None
            if purge == 0:
                warnings.warn(
                    f"{RUN}: tensorboard folder {str(self.tensorboard)!r} held event files of another run (or of "
                    "one that started afresh); TensorBoard hides their steps from now on (its purge), the files "
                    "stay: give each run its own folder to compare runs",
                    stacklevel=3,
                )
            if purge is not None:
                _wait_past_event_files(self.tensorboard)
            self.board = SummaryWriter(str(self.tensorboard), purge_step=purge)
            if resumed:
                for r in history:
                    if r["step"] >= step:
                        self._board_train(r)
                for e in evals:
                    if e["step"] >= step:
                        self._board_eval(_eval_record(e))
                self.board.flush()
        if self.path is None:
            return
        train = [json.dumps(r) for r in history]
        found = self.path.read_text(errors="replace") if self.path.exists() else ""
        if found and not (resumed and [s for s in found.splitlines() if '"eval": {' not in s][: len(train)] == train):
            names = (self.path.with_name(f"{self.path.name}.{n}") for n in itertools.count(1))
            aside = next(p for p in names if not p.exists())
            os.replace(self.path, aside)
            self.records.forget(self.path)  # what the run moved aside had sent is no concern of this one
            warnings.warn(
                f"{RUN}: log_file {str(self.path)!r} held {len(found.splitlines())} lines that are not this run's "
                f"(another run's, or one that started afresh); moved them to {str(aside)!r}",
                stacklevel=3,
            )
        elif resumed:  # this run's: what it holds past the checkpoint, the interrupted runs sent
            self.records.resume(found, self.path, step)
        else:
            self.records.forget(self.path)
        # training records before the evaluation of the same update, as the loop writes them
        rows = [(r["step"], 0, line) for r, line in zip(history, train, strict=True)]
        rows += [(e["step"], 1, json.dumps(_eval_record(e))) for e in evals]
        self.path.write_text("".join(line + "\n" for _, _, line in sorted(rows, key=lambda row: row[:2])))

    def write(self, record: dict[str, Any]) -> None:
        """One training record (a log point): to the tracker, then its line (a line says its call returned)."""
        self.records.send(record)
        self._append(record)
        if self.board is not None:
            self._board_train(record)
            self.board.flush()

    def write_eval(self, entry: dict[str, Any]) -> None:
        """One evaluation, as ``ct.run`` keeps it: ``{"step", "epoch", name: value, ...}``."""
        record = _eval_record(entry)
        self.records.send(record)  # before its line, as ``write``'s
        self._append(record)
        if self.board is not None:
            self._board_eval(record)
            self.board.flush()

    def _board_train(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key not in ("step", "epoch") and isinstance(value, (int, float)):
                self.board.add_scalar(f"train/{key}", value, record["step"])
            elif key == "lr_groups":
                for i, rate in enumerate(value):
                    if rate is not None:
                        self.board.add_scalar(f"train/lr_groups/{i}", rate, record["step"])

    def _board_eval(self, record: dict[str, Any]) -> None:
        for kind in ("eval", "eval_ema"):
            for key, value in record.get(kind, {}).items():
                self.board.add_scalar(f"{kind}/{key}", value, record["step"])

    def close(self) -> None:
        if self.board is not None:
            self.board.close()

    def _append(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = sent_file(path)  # replaced or removed at the start: a folder there would fail it after the resume
    if os.path.isdir(kept) and not os.path.islink(kept):
        raise IsADirectoryError(errno.EISDIR, f"{kept} is a folder, where ct.run keeps the records sent: move it away")
    with open(path, "a"):  # appends nothing: creates it if missing, truncates nothing
        pass


def _folder(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def _eval_record(entry: dict[str, Any]) -> dict[str, Any]:
    metrics = {k: v for k, v in entry.items() if k not in ("step", "epoch", "eval_ema")}
    ema = {"eval_ema": entry["eval_ema"]} if "eval_ema" in entry else {}  # ct.ema's weights, evaluated too
    return {"step": entry["step"], "epoch": entry["epoch"], "eval": metrics, **ema}


class _NoBar:
    def __init__(self, done: int) -> None:
        self.n = done

    def update(self, k: int) -> None:
        self.n += k

    def set_postfix(self, **_: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(show: bool, total: int | None, done: int) -> Any:
    """A tqdm bar of optimizer updates (on rank 0), or a stand-in that counts silently."""
    if not show:
        return _NoBar(done)
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="update", dynamic_ncols=True, file=sys.stderr)


def _wait_past_event_files(folder: Path) -> None:
    """Wait (at most a second or two) until an event file made now sorts after every one in ``folder``.

    TensorBoard reads a folder's event files in name order, and names them by the second, host, pid and
    a per-process counter: a writer made in the second of an earlier one (a run resumed in the process
    and second of its crash) could sort first, and its purge would not hide the earlier file's steps.
    """
    seconds = [int(m.group(1)) for p in folder.glob("*tfevents*") if (m := re.search(r"tfevents\.(\d+)\.", p.name))]
    newest = max(seconds, default=0)
    if 0 <= newest + 1 - time.time() <= 2:  # a file dated further ahead: a skewed clock, not worth waiting for
        time.sleep(newest + 1 - time.time())

"""What ct.run watches: metrics kept on the device between log points, timing, the log file, the bar."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from composetrain.core import StepOutput
from composetrain.data import auto_workers, local_world_size
from composetrain.rendezvous import Process
from composetrain.state import TrainState

__all__ = ["Meter", "MetricsLog", "progress_bar"]


class Meter:
    """Step outputs kept on the device between log points, read in one host sync and averaged over
    ranks at them; the time spent waiting for data against the time in the step; the cadence of
    logging, evaluating and saving in optimizer updates."""

    def __init__(self, proc: Process, state: TrainState, window: list[dict[str, Any]]) -> None:
        self.proc, self.state = proc, state
        # the outputs since the last log point; checkpoints carry them (window_on_cpu), so history resumes exactly
        self.outputs: list[StepOutput] = [StepOutput(o["loss"], o["metrics"], o["skipped"]) for o in window]
        self.waited = self.computed = 0.0  # this call of ct.run
        self.window_start = time.perf_counter()
        self.window_wait = 0.0
        self.marks: dict[str, int] = {}
        self.start = state.step  # a resumed run keeps its cadence: multiples of the totals

    def add(self, out: StepOutput, waited: float, computed: float) -> None:
        self.outputs.append(out)
        self.waited += waited
        self.computed += computed
        self.window_wait += waited

    def due(self, what: str, every: int | None) -> bool:
        """Whether state.step reached a new multiple of ``every`` since ``what`` was last due."""
        if not every:
            return False
        mark = self.state.step // every
        if mark > self.marks.get(what, self.start // every):
            self.marks[what] = mark
            return True
        return False

    def read(self, epoch: int, lr: float) -> dict[str, Any]:
        device = self.outputs[-1].loss.device
        names = sorted(self.outputs[0].metrics)
        rows = [
            torch.stack([o.loss.float().to(device), *(o.metrics[k].float().to(device) for k in names)])
            for o in self.outputs
        ]
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

    def window_on_cpu(self) -> list[dict[str, Any]]:
        """The outputs not yet logged, for a checkpoint: on the CPU (any device can resume) and as
        plain dicts of tensors (a checkpoint holds nothing that loading would have to run)."""
        return [
            {"loss": o.loss.cpu(), "metrics": {k: v.cpu() for k, v in o.metrics.items()}, "skipped": bool(o.skipped)}
            for o in self.outputs
        ]

    @property
    def data_wait(self) -> float:
        total = self.waited + self.computed
        return self.waited / total if total > 0 else 0.0

    def bottleneck(self, loader: DataLoader[Any]) -> str:
        share = self.data_wait
        if share <= 0.2:
            return f"compute-bound: data loading is {share:.0%} of the step"
        spare = auto_workers(local_world_size())
        if loader.num_workers < spare:
            return (
                f"data loading is {share:.0%} of the step: raise num_workers (now {loader.num_workers}; this "
                f"process has cores for {spare}), or make the dataset's __getitem__ cheaper"
            )
        return (
            f"data loading is {share:.0%} of the step, and its workers ({loader.num_workers}) already use every "
            "spare core: make the dataset's __getitem__ cheaper (decode once and cache, smaller inputs) or "
            "give the job more CPUs"
        )


class MetricsLog:
    """The JSON-lines file of records, written by rank 0. Started from the history a run resumes
    with, so that a crash between a log point and the next checkpoint leaves no duplicate lines."""

    def __init__(self, path: Path | None, proc: Process, history: list[dict[str, Any]]) -> None:
        self.path = path if proc.is_main else None
        if self.path is not None:
            self.path.write_text("".join(json.dumps(r) + "\n" for r in history))

    def write(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


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

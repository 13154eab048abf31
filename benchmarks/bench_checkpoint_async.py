"""What ct.run's checkpoints cost the training: saved in the background (checkpoint_async=True, the default) against
synchronously, and against a run that never saves, on a state of about 200 MB (an MLP of 16.8M float32 parameters
and AdamW's two moments).

Each round runs the three contenders interleaved (rotating order), each ``--updates`` updates of ct.run with a
save every ``--every`` updates into a fresh folder (``keep_checkpoints=1``); the step stamps the time it is entered,
so the interval between two entries is one update and what ct.run did after it (a save's stall included). Figures,
as medians over rounds of per-round values:

- training time lost per save: (the run's time from the first update to the last - the never-saving run's) / the
  saves made in between (the run's last save, after its last update, is left out), async / sync (goal <= 0.2); and
  the same within each run: what a save's boundary and the updates up to the next save took beyond the run's own
  normal updates (a drift of the machine between runs cancels);
- the first update after a save: its interval against the median interval of updates far from a save, in the same
  run (goal <= 1.1);
- throughput saving every ``--every`` updates against never (goal >= 0.95);
- peak host memory while the run trains above the memory before it (resident size sampled every 2 ms).

    python benchmarks/bench_checkpoint_async.py                      # 5 rounds, 60 updates, a save every 20
    python benchmarks/bench_checkpoint_async.py --threads 2 --rounds 7 --dir /scratch/ckpt
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct
from composetrain.checkpoint import background


def rss() -> int:
    """This process's resident size in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Peak:
    """The largest resident size seen while it runs (a thread sampling every 2 ms), above the size at its start."""

    def __enter__(self) -> Peak:
        self.start, self.peak, self.done = rss(), 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.002):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.above = max(self.peak, rss()) - self.start


def build(width: int) -> ct.TrainState:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = ct.TrainState(model, optimizer)
    x = torch.randn(8, width)
    F.mse_loss(model(x), torch.zeros(8, 1)).backward()
    optimizer.step()  # AdamW's moments exist: the state is its full size from the first save on
    optimizer.zero_grad(set_to_none=True)
    return state


def state_bytes(state: ct.TrainState) -> int:
    tensors = list(state.model.state_dict().values())
    tensors += [t for s in state.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def contender(args: argparse.Namespace, state: ct.TrainState, data: TensorDataset, saving: str) -> dict:
    """One run of ``args.updates`` updates: its time between first and last update entry, each interval, the saves
    between, and the peak memory above the start."""
    entered: list[float] = []

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        entered.append(time.perf_counter())
        x, y = batch
        return F.mse_loss(model(x), y)

    folder = Path(tempfile.mkdtemp(prefix=f"ckpt-{saving}-", dir=args.dir))
    options = {"batch_size": args.batch, "num_workers": 0, "progress": False, "log_every": args.updates}
    if saving != "never":
        options |= {"checkpoint_dir": folder, "checkpoint_every": args.every, "keep_checkpoints": 1}
        options["checkpoint_async"] = saving == "async"
    state.step = 0  # the same number of updates each time, never resumed (a fresh folder)
    with Peak() as peak:
        ct.run(step, state, data, max_steps=args.updates, **options)
    shutil.rmtree(folder, ignore_errors=True)
    intervals = [b - a for a, b in itertools.pairwise(entered)]  # update k and what followed it
    saves = [k for k in range(1, args.updates) if k % args.every == 0] if saving != "never" else []
    return {"time": entered[-1] - entered[0], "intervals": intervals, "saves": saves, "peak": peak.above}


def normal(run: dict) -> float:
    """The median interval of the updates two or more away from any save (interval k - 1: update k, then the
    boundary after it; the save of update s stalls interval s - 1)."""
    near = {k for s in run["saves"] for k in (s - 2, s - 1, s)}
    return statistics.median(d for k, d in enumerate(run["intervals"]) if k not in near)


def after_save(run: dict) -> float:
    """The first update after each save against a normal one of the same run."""
    return statistics.median(run["intervals"][s] for s in run["saves"]) / normal(run)


def lost_in_run(run: dict) -> float:
    """Per save, what its boundary and the updates up to the next save took beyond normal ones of the same run (a
    drift of the machine between runs cancels)."""
    base, ends = normal(run), [*run["saves"][1:], len(run["intervals"]) + 1]
    windows = [run["intervals"][s - 1 : e - 1] for s, e in zip(run["saves"], ends, strict=True)]
    return statistics.mean(sum(d - base for d in window) for window in windows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=4096)  # 16.8M parameters: 201 MB with AdamW's moments
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--every", type=int, default=20)  # longer than a save takes here: none waits for the previous
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch's threads (1: a core left for the writer)")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: the temporary folder)")
    p.add_argument("--nicer", type=int, default=None, help="the writer thread's niceness above the training's")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.nicer is not None:
        background.NICER = args.nicer
    state = build(args.width)
    g = torch.Generator().manual_seed(1)
    samples = args.batch * args.updates
    data = TensorDataset(torch.randn(samples, args.width, generator=g), torch.randn(samples, 1, generator=g))
    names = ["never", "sync", "async"]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    contender(args, state, data, "async")  # warm-up, untimed
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            runs[name].append(contender(args, state, data, name))
    saves = len(runs["sync"][0]["saves"])
    lost = {
        n: [(a["time"] - b["time"]) / saves for a, b in zip(runs[n], runs["never"], strict=True)]
        for n in ("sync", "async")
    }
    ratio = [a / s for a, s in zip(lost["async"], lost["sync"], strict=True)]
    throughput = {n: [b["time"] / a["time"] for a, b in zip(runs[n], runs["never"], strict=True)] for n in names}
    median = statistics.median
    print(f"## Checkpoint saves off the training path ({state_bytes(state) / 2**20:.0f} MB of state)\n")
    print(
        f"{args.rounds} rounds of {args.updates} updates, a save every {args.every} ({saves} timed per run), "
        f"torch threads {args.threads}, batch {args.batch}\n"
    )
    in_run = {n: [lost_in_run(run) for run in runs[n]] for n in ("sync", "async")}
    print(
        "| contender | s per run (median) | lost per save vs never, s | lost per save in the run, s | throughput vs "
        "never | first update after a save vs a normal one | peak memory above start, MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in names:
        per_save = f"{median(lost[n]):.3f}" if n in lost else "-"
        own = f"{median(in_run[n]):.3f}" if n in in_run else "-"
        first = f"{median(after_save(run) for run in runs[n]):.2f}x" if n != "never" else "-"
        peak = median(run["peak"] for run in runs[n]) / 2**20
        print(
            f"| {n} | {median(run['time'] for run in runs[n]):.2f} | {per_save} | {own} | "
            f"{median(throughput[n]):.3f} | {first} | {peak:.0f} |"
        )
    spread = sorted(ratio)
    own_ratio = median(a / s for a, s in zip(in_run["async"], in_run["sync"], strict=True))
    print(
        f"\nlost per save, async / sync: **{median(ratio):.3f}** against the never-saving run (rounds "
        f"{spread[0]:.3f} to {spread[-1]:.3f}), **{own_ratio:.3f}** within each run; goal <= 0.2"
    )
    usual = median(median(run["intervals"]) for run in runs["never"])
    print(f"a normal update (never saving): {usual * 1000:.0f} ms")


if __name__ == "__main__":
    main()

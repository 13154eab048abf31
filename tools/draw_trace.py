"""Draw a trace that ``ct.run(profile=...)`` wrote as a timeline, laid out the way Perfetto and chrome://tracing lay
one out: a row per track, time across, each slice a coloured bar labelled where it fits.

    PYTHONPATH=src python tools/draw_trace.py          # a tiny ct.run traced, drawn to docs/img/profile-trace.png
    PYTHONPATH=src python tools/draw_trace.py runs/a/profile/rank0-updates23-25.*.pt.trace.json --out trace.png

Without a trace file it runs a tiny ct.run (an MLP, ``accumulate(2)``, 8 updates an epoch, logging, a checkpoint
and an evaluation every 4 updates) with ``profile={"wait": 2, "warmup": 1, "active": 2}`` in a temporary folder, so
that updates 4-5 are recorded with every phase ct.run marks, and draws the trace it wrote. The file is read as
Chrome's trace format (``traceEvents``; complete events, ``"ph": "X"``, in microseconds). ct.run's marks
(``update N`` and the phases data, forward/backward, optimizer, logging, checkpoint, evaluation) are recorded on
the thread that runs the loop, nested with the operators; a viewer stacks them all in that thread's track by
depth. Here they are lifted onto rows of their own (updates, phases, torch's own marks) above each thread's
operators (``cpu_op``, a row per nesting depth, the deepest left out, coloured by name), so that a page can show
where an update's time went; below the whole window, the first update and what ran before the next are drawn again,
zoomed in, as one would zoom in a viewer. Perfetto (ui.perfetto.dev), chrome://tracing and
``tensorboard --logdir <folder>`` open the same file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "profile-trace.png"
WINDOW = {"wait": 2, "warmup": 1, "active": 2}  # updates 4-5 recorded (after 2 updates and 1 of warm-up)
PHASES = {  # the phases ct.run and TrainStep mark, in Perfetto-like colours
    "data": "#f28e2b",
    "forward/backward": "#4e79a7",
    "optimizer": "#59a14f",
    "logging": "#b07aa1",
    "checkpoint": "#e15759",
    "evaluation": "#9c755f",
}
UPDATE = re.compile(r"update \d+")
UPDATE_COLORS = ("#8cb0d9", "#5b86b8")  # alternate, so that neighbouring updates stay apart
OP_COLORS = ("#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#f1ce63", "#86bcb6", "#ff9d9a", "#d4a6c8", "#d7b5a6")
DEPTHS = 3  # operator rows per thread: deeper calls (an op's own sub-ops) add rows, not insight


@dataclass(frozen=True)
class Slice:
    """A complete event of the trace: its name, category, thread, start and duration in ms from the window's
    first event."""

    name: str
    cat: str
    tid: int
    start: float
    dur: float


def read_trace(path: Path) -> list[Slice]:
    """The trace's complete events on the process's threads (the profiler's own span left out), in time order."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    kept = [e for e in events if e.get("ph") == "X" and isinstance(e.get("tid"), int) and isinstance(e.get("pid"), int)]
    if not kept:
        raise ValueError(f"draw_trace: {path} holds no complete events on a thread; give a trace ct.run wrote")
    origin = min(float(e["ts"]) for e in kept)
    slices = [
        Slice(e["name"], e.get("cat", ""), e["tid"], (float(e["ts"]) - origin) / 1e3, float(e.get("dur", 0)) / 1e3)
        for e in kept
    ]
    return sorted(slices, key=lambda s: (s.start, -s.dur))


def depths(slices: list[Slice]) -> list[int]:
    """Each slice's nesting depth among ``slices`` (sorted by start, longest first), as a viewer stacks them."""
    found: list[int] = []
    open_ends: list[float] = []  # the ends of the slices that enclose the current one
    for s in slices:
        while open_ends and open_ends[-1] <= s.start:
            open_ends.pop()
        found.append(len(open_ends))
        open_ends.append(s.start + s.dur)
    return found


def rows(slices: list[Slice]) -> list[tuple[str, list[tuple[Slice, str]]]]:
    """The timeline's rows, top to bottom: (label, [(slice, colour)])."""
    marks = [s for s in slices if s.cat == "user_annotation"]
    updates = [s for s in marks if UPDATE.fullmatch(s.name)]
    laid = [
        ("ct.run: updates", [(s, UPDATE_COLORS[i % 2]) for i, s in enumerate(updates)]),
        ("ct.run: phases", [(s, PHASES[s.name]) for s in marks if s.name in PHASES]),
        ("torch's own marks", [(s, "#bab0ac") for s in marks if s not in updates and s.name not in PHASES]),
    ]
    by_thread: dict[int, list[Slice]] = defaultdict(list)
    for s in slices:
        if s.cat == "cpu_op":
            by_thread[s.tid].append(s)
    for tid, ops in sorted(by_thread.items()):
        level = depths(ops)
        for depth in range(min(DEPTHS, max(level) + 1)):
            row = [
                (s, OP_COLORS[sum(map(ord, s.name)) % len(OP_COLORS)])
                for s, d in zip(ops, level, strict=True)
                if d == depth
            ]
            laid.append((f"thread {tid}: ops, depth {depth}", row))
    return [(label, row) for label, row in laid if row]


def zooms(slices: list[Slice]) -> list[tuple[str, float, float]]:
    """The parts worth a closer look, (what, from, to) in ms: the first update with the batch it waited for, and what
    ran between it and the next update (logging, checkpoint, evaluation, the next batch); none without two."""
    updates = [s for s in slices if s.cat == "user_annotation" and UPDATE.fullmatch(s.name)]
    if len(updates) < 2:
        return []
    first, second = updates[0], updates[1]
    waits = [s.start for s in slices if s.name == "data" and s.start <= first.start]
    lo = max(waits, default=first.start)  # the update's batch, read just before it
    after = [s.start for s in slices if s.name == "forward/backward" and s.start >= second.start]
    hi = min(after, default=second.start)
    end = first.start + first.dur
    return [
        (f"{first.name} with its batch, zoomed in", lo - (end - lo) * 0.02, end + (end - lo) * 0.02),
        (f"between {first.name} and {second.name}, zoomed in", end - (hi - end) * 0.02, hi + (hi - end) * 0.02),
    ]


def _panel(ax: Any, laid: list[tuple[str, list[tuple[Slice, str]]]], lo: float, hi: float, width_in: float) -> None:
    """The rows ``laid`` drawn on ``ax`` over ``lo``-``hi`` ms: a bar per slice, its name inside where it fits."""
    points_per_ms = width_in * 72 * 0.85 / (hi - lo)
    for y, (_, row) in enumerate(laid):
        for s, color in row:
            if s.start > hi or s.start + s.dur < lo:
                continue
            (bar,) = ax.barh(y, s.dur, left=s.start, height=0.8, color=color, edgecolor="white", linewidth=0.3)
            bar.set_gid(s.name)
            label = s.name.removeprefix("aten::")
            left, right = max(s.start, lo), min(s.start + s.dur, hi)  # the part in view
            if (right - left) * points_per_ms > 5.2 * len(label) + 4:  # labelled where it fits, as a viewer does
                ax.text((left + right) / 2, y, label, ha="center", va="center", fontsize=7, clip_on=True)
    ax.set_yticks(range(len(laid)), [label for label, _ in laid], fontsize=8)
    ax.set_ylim(len(laid) - 0.5, -0.5)  # the first row on top, as in a viewer
    ax.set_xlim(lo, hi)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def draw(path: Path, title: str | None = None) -> Any:
    """The timeline of the trace at ``path`` as a matplotlib Figure (1400x800 at dpi 100): the whole window on top,
    below it (where it holds two updates) the first update and what ran before the next, zoomed in, each shaded in
    the colour of its part above. Each bar's ``gid`` is its slice's name, its x and width the slice's start and
    duration in ms from the window's first event."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    slices = read_trace(path)
    laid = rows(slices)
    end = max(s.start + s.dur for s in slices)
    parts = zooms(slices)
    fig = plt.figure(figsize=(14, 8 if parts else 4.6), dpi=100)
    grid = fig.add_gridspec(2 if parts else 1, max(len(parts), 1))
    whole = fig.add_subplot(grid[0, :])
    _panel(whole, laid, 0, end, 14)
    whole.set_xlabel("time since the window's first event (ms)", fontsize=9)
    whole.set_title(title or f"Drawn from the trace file ct.run wrote: {Path(path).name}", fontsize=10)
    for i, (what, lo, hi) in enumerate(parts):
        whole.axvspan(lo, hi, color=("#fdf0b8", "#d8ecf8")[i % 2], zorder=0)  # drawn again below
        ax = fig.add_subplot(grid[1, i])
        _panel(ax, laid, lo, hi, 14 / len(parts))
        ax.set_xlabel(f"{what} (ms)", fontsize=9)
        if i:
            ax.set_yticklabels([])  # the same rows as on its left
        ax.patch.set_facecolor(("#fdf0b8", "#d8ecf8")[i % 2])
        ax.patch.set_alpha(0.35)
    found = {s.name for s in slices if s.cat == "user_annotation"}
    fig.legend(
        handles=[Patch(color=c, label=name) for name, c in PHASES.items() if name in found],
        loc="lower center",
        ncol=len(PHASES),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    return fig


def tiny_run(folder: Path) -> Path:
    """Run a tiny ct.run with the profiler's window over updates 4-5 into ``folder``; the trace file it wrote."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import TensorDataset

    import composetrain as ct

    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 64, generator=g)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(model: nn.Module, batch: Any) -> Any:
        inputs, labels = batch
        return F.cross_entropy(model(inputs), labels)

    def accuracy(model: nn.Module, batch: Any) -> dict[str, Any]:
        inputs, labels = batch
        return {"acc": (model(inputs).argmax(-1) == labels).float().mean()}

    ct.run(
        ct.accumulate(2)(step),
        ct.TrainState(model, opt),
        data,
        batch_size=24,
        max_steps=6,
        num_workers=0,
        progress=False,
        log_every=4,
        checkpoint_dir=folder,
        checkpoint_every=4,
        eval_step=accuracy,
        eval_data=TensorDataset(x[:48], (x[:48, 0] > 0).long()),
        eval_every=4,
        profile=WINDOW,
    )
    (trace,) = (folder / "profile").glob("*.pt.trace.json")
    return trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, help="a .pt.trace.json file (default: a tiny run's)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG written (default: {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or tiny_run(Path(tmp) / "run")
        title = None
        if args.trace is None:
            title = (
                f"Drawn from the trace file ct.run wrote ({trace.name.split('.')[0]}.*.pt.trace.json): "
                f"ct.run(accumulate(2)(step), ..., profile={WINDOW}) on a small MLP"
            )
        fig = draw(trace, title)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=100)
        import matplotlib.pyplot as plt

        plt.close(fig)
    print(f"{args.out}: {args.out.stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

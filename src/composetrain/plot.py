"""Draw a run's curves into a PNG: ``python -m composetrain.plot RUN_DIR``.

Reads the JSON-lines metrics file that ``ct.run`` writes (``RUN_DIR/metrics.jsonl``)
and draws, against optimizer updates: the training loss, every metric (with the
evaluation's value of the same name, when the log holds evaluations), the learning
rate, the throughput and the share of time spent waiting for data. Needs matplotlib
(``pip install matplotlib``), an optional dependency.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["COLORS", "curves", "plot_run", "read_log"]

COLORS = {"train": "#1f77b4", "eval": "#ff7f0e"}  # matplotlib's tab:blue and tab:orange

_LOOP_KEYS = {"step", "epoch", "skipped", "lr", "updates_per_s", "data_wait", "loss", "global_batch"}


def read_log(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training records and the evaluation records of a metrics file (or of the run folder holding it).

    Evaluation records are those with an ``"eval"`` mapping; lines that are not JSON
    (a line cut short by a crash) are skipped.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"plot: no metrics file at {path}; pass the checkpoint_dir of a ct.run, or its log_file"
        )
    train: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "step" in record:
            (evals if isinstance(record.get("eval"), dict) else train).append(record)
    return train, evals


def curves(run: str | Path) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """What ``plot_run`` draws: panel title -> series label ("train", "eval") -> (updates, values)."""
    train, evals = read_log(run)
    if not train:
        raise ValueError(f"plot: {run} holds no training records yet; plot after the first log point")
    metrics = sorted({k for r in train for k in r if k not in _LOOP_KEYS} | {k for e in evals for k in e["eval"]})
    panels = [("loss", "training loss"), *((m, m) for m in metrics), ("lr", "learning rate")]
    panels += [("updates_per_s", "updates / s"), ("data_wait", "share of time waiting for data")]
    drawn: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for key, title in panels:
        series = {
            "train": ([r["step"] for r in train if key in r], [r[key] for r in train if key in r]),
            "eval": (
                [e["step"] for e in evals if key in e["eval"]],
                [e["eval"][key] for e in evals if key in e["eval"]],
            ),
        }
        drawn[title] = {label: xy for label, xy in series.items() if xy[0]}
    return drawn


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw the curves of a run into a PNG and return its path.

    Args:
        run: the run folder (``checkpoint_dir``) or its metrics file.
        out: where to write the PNG (default: ``curves.png`` beside the metrics file).

    Returns:
        The PNG's path.

    Example:
        >>> result = ct.run(train_step, state, data, batch_size=64, checkpoint_dir="runs/a")
        >>> plot_run("runs/a")          # or, in a shell: python -m composetrain.plot runs/a
        PosixPath('runs/a/curves.png')
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plot: drawing curves needs matplotlib: pip install matplotlib") from e
    panels = curves(run)
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, panels.items(), strict=False):
        for label, (steps, values) in series.items():
            ax.plot(steps, values, "o-" if label == "eval" else "-", label=label, color=COLORS[label])
        if len(series) > 1:
            ax.legend()
        ax.set_title(title)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    target = Path(out) if out is not None else (Path(run) if Path(run).is_dir() else Path(run).parent) / "curves.png"
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m composetrain.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="the run folder (ct.run's checkpoint_dir) or its metrics.jsonl")
    parser.add_argument("-o", "--out", default=None, help="the PNG to write (default RUN/curves.png)")
    args = parser.parse_args(argv)
    print(plot_run(args.run, args.out))


if __name__ == "__main__":
    main()

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
import sys
import warnings
from pathlib import Path
from typing import Any

__all__ = ["COLORS", "MAX_PANELS", "curves", "plot_run", "read_log"]

COLORS = {"train": "#1f77b4", "eval": "#ff7f0e"}  # matplotlib's tab:blue and tab:orange

MAX_PANELS = 24  # the loss, 20 metrics, the learning rate, the throughput, the data wait: 8 rows of 3

_LOOP_KEYS = {"step", "epoch", "skipped", "lr", "lr_groups", "updates_per_s", "data_wait", "loss", "global_batch"}
# the machine's measures (core.metric_names.MEASURED: not imported, this module needs no torch): not curves of the
# training (updates / s and the data wait are drawn as the fixed panels above)
_LOOP_KEYS |= {"samples_per_s", "tokens_per_s", "flops_per_update", "mfu", "peak_memory_mib", "stragglers"}


def read_log(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training records and the evaluation records of a metrics file (or of the run folder holding it).

    Evaluation records are those with an ``"eval"`` mapping. Lines that are not JSON records (a line cut
    short by a crash, bytes that are not UTF-8, a record whose ``step`` is not an int) are skipped,
    and counted in one warning.
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
    skipped: list[str] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            record = json.loads(raw.decode("utf-8"))
        # ValueError: an int longer than Python converts (4300 digits); RecursionError: arrays nested too deep
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            skipped.append(f"line {number}: {type(e).__name__}")
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if not (_is_int(step) and _is_number(step)):  # an int step that a float (the plot's axis) can hold
            skipped.append(f"line {number}: step {_short(step)}")
            continue
        (evals if isinstance(record.get("eval"), dict) else train).append(record)
    if skipped:
        warnings.warn(
            f"plot: skipped {len(skipped)} line(s) of {path} that are not JSON records with an int step "
            f"({'; '.join(skipped[:5])}{'; ...' if len(skipped) > 5 else ''})",
            stacklevel=2,
        )
    return train, evals


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A JSON number that a float holds (an int past 1e308 is no point on a plot)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def curves(run: str | Path) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """What ``plot_run`` draws: panel title -> series label ("train", "eval") -> (updates, values).

    A value that is not a number (a string, a mapping) is left out of its panel, with a warning.
    """
    train, evals = read_log(run)
    if not train:
        raise ValueError(f"plot: {run} holds no training records yet; plot after the first log point")
    metrics = sorted({k for r in train for k in r if k not in _LOOP_KEYS} | {k for e in evals for k in e["eval"]})
    fixed = [("loss", "training loss"), ("lr", "learning rate"), ("updates_per_s", "updates / s")]
    fixed += [("data_wait", "share of time waiting for data")]
    titles = {title for _, title in fixed}  # a metric named like one of them must not take its panel
    panels = [fixed[0], *((m, f"{m!r} (metric)" if m in titles else m) for m in metrics), *fixed[1:]]
    drawn: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    odd: list[str] = []
    for key, title in panels:
        sources = {"train": [(r["step"], r) for r in train], "eval": [(e["step"], e["eval"]) for e in evals]}
        series: dict[str, tuple[list[int], list[float]]] = {}
        for label, records in sources.items():
            points = [(step, values[key]) for step, values in records if key in values]
            # ct.run's own "lr": null (no rate known for that record) is no point, not bad data
            odd += [
                f"{key!r} at update {step}: {type(v).__name__}"
                for step, v in points
                if not _is_number(v) and not (key == "lr" and v is None)
            ]
            good = [(step, float(v)) for step, v in points if _is_number(v)]
            if good:
                series[label] = ([s for s, _ in good], [v for _, v in good])
        drawn[title] = series
    if odd:
        warnings.warn(
            f"plot: left out {len(odd)} value(s) that are not numbers ({'; '.join(odd[:5])}"
            f"{'; ...' if len(odd) > 5 else ''})",
            stacklevel=2,
        )
    return drawn


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw the curves of a run into a PNG and return its path.

    Args:
        run: the run folder (``checkpoint_dir``) or its metrics file.
        out: where to write the PNG (default: ``curves.png`` beside the metrics file; in a folder, its
            ``curves.png``; a name without a suffix gets ``.png``).

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
    if len(panels) > MAX_PANELS:  # a figure of hundreds of panels is too large to open
        titles = list(panels)
        kept, left = titles[: MAX_PANELS - 3] + titles[-3:], titles[MAX_PANELS - 3 : -3]
        warnings.warn(
            f"plot: {len(titles) - 4} metrics, too many to draw; drew {MAX_PANELS - 4} and left out: {', '.join(left)}",
            stacklevel=2,
        )
        panels = {title: panels[title] for title in kept}
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, panels.items(), strict=False):
        for label, (steps, values) in series.items():
            # a marker where a line alone would draw nothing: evaluations, and a series of one point
            marker = "o-" if label == "eval" or len(steps) == 1 else "-"
            ax.plot(steps, values, marker, label=label, color=COLORS[label])
        if len(series) > 1:
            ax.legend()
        ax.set_title(title)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    target = Path(out) if out is not None else (Path(run) if Path(run).is_dir() else Path(run).parent) / "curves.png"
    if target.is_dir():  # a folder to draw into
        target = target / "curves.png"
    elif not target.suffix:  # matplotlib would add one, and the path returned would name no file
        target = target.with_name(target.name + ".png")
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m composetrain.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="the run folder (ct.run's checkpoint_dir) or its metrics.jsonl")
    parser.add_argument("-o", "--out", default=None, help="the PNG to write (default RUN/curves.png)")
    args = parser.parse_args(argv)
    try:
        print(plot_run(args.run, args.out))
    except (FileNotFoundError, ValueError, ImportError) as e:  # what the user can fix: one line, no traceback
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

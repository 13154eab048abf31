"""tools/draw_trace.py: the timeline it draws from a trace ct.run(profile=...) wrote holds a bar for every update
and phase the trace marks, where and as long as the trace says."""

import json
import re
import runpy
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

TOOL = runpy.run_path(str(Path(__file__).resolve().parents[1] / "tools" / "draw_trace.py"))
PHASES = {"data", "forward/backward", "optimizer", "logging", "checkpoint", "evaluation"}


def marked(trace):
    """The trace's updates and phases as ct.run marked them: (name, start, duration) in ms, start as written."""
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted(
        (e["name"], e["ts"] / 1e3, e["dur"] / 1e3)
        for e in events
        if e.get("cat") == "user_annotation" and (re.fullmatch(r"update \d+", e["name"]) or e["name"] in PHASES)
    )


def bars(ax):
    """The named bars on ``ax``: (name, x, width, row)."""
    return sorted((p.get_gid(), p.get_x(), p.get_width(), p.get_y()) for p in ax.patches if p.get_gid())


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return TOOL["tiny_run"](tmp_path_factory.mktemp("run"))


def test_every_marked_update_and_phase_is_a_bar_of_its_own_where_the_trace_puts_it(trace):
    marks = marked(trace)
    names = {name for name, _, _ in marks}
    assert names == {"update 4", "update 5", *PHASES}  # the tiny run's window holds every phase ct.run marks
    fig = TOOL["draw"](trace)
    drawn = [b for b in bars(fig.axes[0]) if b[0] in names]
    assert [(n, round(w, 6)) for n, _, w, _ in drawn] == [(n, round(d, 6)) for n, _, d in marks]
    shifts = [start - x for (_, start, _), (_, x, _, _) in zip(marks, drawn, strict=True)]
    assert max(shifts) - min(shifts) < 1e-3  # one origin for all (to 1 us): each bar starts where its mark does
    rows = {n: y for n, _, _, y in drawn}
    assert rows["update 4"] == rows["update 5"] != rows["data"]  # updates on a row, phases on another
    assert len({rows[p] for p in PHASES}) == 1
    # below: the first update with its batch, and what ran before the next, each zoomed in
    (_, start4, dur4) = next(m for m in marks if m[0] == "update 4")
    start4 -= shifts[0]  # where it is drawn
    first, between = fig.axes[1:]
    assert {"update 4", "data", "forward/backward", "optimizer"} <= {b[0] for b in bars(first)}
    assert first.get_xlim()[0] < start4 < start4 + dur4 < first.get_xlim()[1]
    assert {"logging", "checkpoint", "evaluation"} <= {b[0] for b in bars(between)}
    assert between.get_xlim()[0] < start4 + dur4 < between.get_xlim()[1]


def test_the_tool_writes_the_picture_of_a_trace_given(trace, tmp_path):
    out = tmp_path / "trace.png"
    assert TOOL["main"]([str(trace), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_without_a_thread_s_events_is_refused(tmp_path):
    empty = tmp_path / "empty.pt.trace.json"
    empty.write_text(json.dumps({"traceEvents": [{"ph": "i", "pid": "Traces", "tid": "x", "ts": 1}]}))
    with pytest.raises(ValueError, match=r"draw_trace: .*empty.pt.trace.json holds no complete events on a thread"):
        TOOL["draw"](empty)

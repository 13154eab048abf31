"""composetrain.plot on crafted metrics files: lines nested too deep for the JSON reader, integers longer than
Python converts, numbers too large for a float, an output path without a suffix or that is a folder."""

import json
import subprocess
import sys

import pytest

from composetrain.plot import curves, plot_run, read_log

pytest.importorskip("matplotlib")


def good(n=3):
    return "".join(json.dumps({"step": i, "loss": 1.0 / i, "lr": 0.1}) + "\n" for i in range(1, n + 1))


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("[" * 100000 + "]" * 100000, "RecursionError"),
        ('{"step": 5, "loss": ' + "[" * 100000 + "]" * 100000 + "}", "RecursionError"),
        ('{"step": 1' + "0" * 5000 + ', "loss": 1}', "ValueError"),
        ('{"step": 1' + "0" * 400 + ', "loss": 1}', "step 1000"),  # an int, but no float holds it
    ],
)
def test_a_line_the_reader_cannot_take_is_skipped_and_counted(tmp_path, line, said):
    (tmp_path / "metrics.jsonl").write_text(good() + line + "\n")
    with pytest.warns(UserWarning, match=rf"plot: skipped 1 line\(s\) of .* \(line 4: {said}"):
        train, _ = read_log(tmp_path)
    assert [r["step"] for r in train] == [1, 2, 3]
    with pytest.warns(UserWarning, match="plot: skipped 1 line"):
        target = plot_run(tmp_path)
    assert target.read_bytes()[:4] == b"\x89PNG"


def test_a_value_too_large_for_a_float_is_left_out_with_a_warning(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(good() + '{"step": 4, "loss": 1' + "0" * 400 + ', "acc": 0.5}\n')
    with pytest.warns(UserWarning, match=r"plot: left out 1 value\(s\) that are not numbers \('loss' at update 4: int"):
        drawn = curves(tmp_path)
    assert drawn["training loss"]["train"][0] == [1, 2, 3]
    assert drawn["acc"]["train"] == ([4], [0.5])


def test_the_command_survives_every_crafted_line_at_once(tmp_path):
    lines = ["[" * 100000 + "]" * 100000, '{"step": 1' + "0" * 5000 + "}", '{"step": 9, "loss": 1' + "0" * 400 + "}"]
    (tmp_path / "metrics.jsonl").write_text(good() + "\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "composetrain.plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip() == str(tmp_path / "curves.png")


@pytest.mark.parametrize(("out", "written"), [("pic", "pic.png"), ("folder", "folder/curves.png")])
def test_the_path_printed_is_the_file_written(tmp_path, out, written):
    (tmp_path / "metrics.jsonl").write_text(good())
    (tmp_path / "folder").mkdir()
    target = plot_run(tmp_path, tmp_path / out)
    assert target == tmp_path / written
    assert target.read_bytes()[:4] == b"\x89PNG"


def test_a_metric_named_like_a_fixed_panel_keeps_its_own_panel(tmp_path):
    records = [
        {"step": s, "loss": 3.0 - s, "lr": 0.1, "training loss": 7.0 + s, "learning rate": 5.0 + s} for s in (1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = curves(tmp_path)
    assert drawn["training loss"]["train"] == ([1, 2], [2.0, 1.0])  # the loop's loss, not the metric
    assert drawn["learning rate"]["train"] == ([1, 2], [0.1, 0.1])
    assert drawn["'training loss' (metric)"]["train"] == ([1, 2], [8.0, 9.0])
    assert drawn["'learning rate' (metric)"]["train"] == ([1, 2], [6.0, 7.0])

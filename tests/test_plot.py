"""composetrain.plot: the curves of a run, drawn into a real PNG."""

import json
import subprocess
import sys

import pytest

from composetrain.plot import COLORS, curves, plot_run

plt = pytest.importorskip("matplotlib.pyplot")


def write_log(path, n=20):
    lines = []
    for i in range(1, n + 1):
        lines.append(
            {
                "step": 5 * i,
                "epoch": i // 4,
                "loss": 2.0 / i,
                "acc": 1 - 1 / (i + 1),
                "lr": 0.1 / i,
                "skipped": 0,
                "updates_per_s": 40.0 + i,
                "data_wait": 0.1,
            }
        )
        if i % 4 == 0:
            lines.append({"step": 5 * i, "epoch": i // 4, "eval": {"acc": 0.5 + i / 50}})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 105, "lo')  # a line cut by a crash
    return lines


def colour_pixels(image, hex_colour):
    rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return int(((abs(image[..., :3] - rgb) < 0.02).all(-1)).sum())


def test_the_png_is_real_and_holds_each_curve(tmp_path):
    records = write_log(tmp_path / "metrics.jsonl")
    with pytest.warns(UserWarning, match=r"skipped 1 line\(s\) .* \(line 26: JSONDecodeError\)"):  # the cut line
        drawn = curves(tmp_path)
    assert list(drawn) == ["training loss", "acc", "learning rate", "updates / s", "share of time waiting for data"]
    steps, losses = drawn["training loss"]["train"]
    assert steps == [r["step"] for r in records if "loss" in r] and losses == [
        r["loss"] for r in records if "loss" in r
    ]
    assert drawn["acc"]["eval"] == ([20, 40, 60, 80, 100], [0.5 + i / 50 for i in (4, 8, 12, 16, 20)])
    assert "eval" not in drawn["training loss"]

    with pytest.warns(UserWarning, match=r"skipped 1 line"):
        png = plot_run(tmp_path)
    assert png == tmp_path / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = plt.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 800
    assert colour_pixels(image, COLORS["train"]) > 500  # five training curves
    assert colour_pixels(image, COLORS["eval"]) > 50  # the evaluation's accuracy


def test_the_command_line_draws_where_told(tmp_path):
    write_log(tmp_path / "metrics.jsonl")
    out = tmp_path / "elsewhere.png"
    done = subprocess.run(
        [sys.executable, "-m", "composetrain.plot", str(tmp_path), "-o", str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert done.stdout.strip() == str(out) and out.read_bytes()[:4] == b"\x89PNG"


def test_a_missing_or_empty_log_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"plot: no metrics file at .*metrics.jsonl; pass the checkpoint_dir"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"holds no training records yet"):
        plot_run(tmp_path)

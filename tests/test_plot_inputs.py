"""composetrain.plot on what real metrics files hold: undecodable lines, odd values, one record, hundreds of
metrics, a missing folder, ct.run's own log; and ``python -m composetrain.plot`` without torch."""

import json
import subprocess
import sys
import warnings

import pytest

from composetrain.plot import COLORS, MAX_PANELS, curves, plot_run, read_log

plt = pytest.importorskip("matplotlib.pyplot")


def record(step, **values):
    base = {"step": step, "epoch": 0, "loss": 1.0 / int(step), "lr": 0.1, "skipped": 0, "updates_per_s": 10.0}
    return {**base, "data_wait": 0.1, **values}


def write(path, records, extra=b""):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + extra)


def colour_pixels(image, hex_colour):
    rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return int(((abs(image[..., :3] - rgb) < 0.02).all(-1)).sum())


def test_a_line_that_is_not_utf8_is_skipped_and_counted(tmp_path):
    log = tmp_path / "metrics.jsonl"
    write(log, [record(1)], b'{"step": 2, "loss": \xff\xfe}\n' + json.dumps(record(3)).encode() + b'\n{"st')
    with pytest.warns(UserWarning, match=r"plot: skipped 2 line\(s\) of .*metrics.jsonl that are not JSON records"):
        drawn = curves(tmp_path)
    assert drawn["training loss"]["train"] == ([1, 3], [1.0, 1 / 3])


def test_a_record_whose_step_is_not_an_int_is_skipped_and_a_value_that_is_not_a_number_left_out(tmp_path):
    log = tmp_path / "metrics.jsonl"
    write(log, [record(1, acc=0.5), record("2", acc=0.6), record(3, acc={"top1": 0.7}), record(4, acc=0.8)])
    with pytest.warns(UserWarning) as caught:
        drawn = curves(tmp_path)
    said = " ".join(str(w.message) for w in caught)
    assert "skipped 1 line(s)" in said and "'2'" in said
    assert "left out 1 value(s) that are not numbers" in said and "'acc' at update 3" in said
    assert drawn["acc"]["train"] == ([1, 4], [0.5, 0.8])
    assert drawn["training loss"]["train"] == ([1, 3, 4], [1.0, 1 / 3, 1 / 4])
    assert plot_run(tmp_path).read_bytes()[:4] == b"\x89PNG"  # and it draws


def test_a_single_record_draws_a_visible_point_in_each_panel(tmp_path):
    write(tmp_path / "metrics.jsonl", [record(5, acc=0.5), {"step": 5, "epoch": 1, "eval": {"acc": 0.4}}])
    image = plt.imread(plot_run(tmp_path))
    assert colour_pixels(image, COLORS["train"]) > 5 * 20  # a marker in each of the five panels
    assert colour_pixels(image, COLORS["eval"]) > 20


def test_hundreds_of_metrics_are_capped_and_the_ones_left_out_named(tmp_path):
    names = [f"m{i:03d}" for i in range(300)]
    write(tmp_path / "metrics.jsonl", [record(s, **dict.fromkeys(names, 0.5)) for s in (1, 2)])
    with pytest.warns(UserWarning, match=r"plot: 300 metrics, .* left out: m\d{3}") as caught:
        png = plot_run(tmp_path)
    kept = MAX_PANELS - 4  # the loss, the learning rate, the throughput and the data wait are always drawn
    message = str(caught[0].message)
    assert all(name in message for name in names[kept:]) and not any(f" {name}," in message for name in names[:kept])
    height, width = plt.imread(png).shape[:2]
    assert height * width < 4000 * 2000  # opens anywhere


@pytest.fixture
def drawn_titles(monkeypatch):
    """The titles of the panels each saved figure holds, in order."""
    from matplotlib.figure import Figure

    saved, original = [], Figure.savefig

    def spy(self, *args, **kwargs):
        saved.append([ax.get_title() for ax in self.axes if ax.get_title()])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return saved


@pytest.mark.parametrize("count", [MAX_PANELS - 4, MAX_PANELS - 3, 60])
def test_the_panels_drawn_and_those_named_left_out_are_all_the_metrics(tmp_path, drawn_titles, count):
    names = [f"m{i:03d}" for i in range(count)]
    write(tmp_path / "metrics.jsonl", [record(s, **dict.fromkeys(names, 0.5)) for s in (1, 2)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_run(tmp_path)
    loop = ["training loss", "learning rate", "updates / s", "share of time waiting for data"]
    titles = drawn_titles[-1]
    assert len(titles) == min(count + 4, MAX_PANELS) and set(loop) <= set(titles)
    left = str(caught[0].message).split("left out: ")[1].split(", ") if caught else []
    assert sorted([t for t in titles if t not in loop] + left) == names


def test_a_missing_folder_is_one_line_and_exit_code_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "composetrain.plot", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "no metrics file at" in done.stderr
    write(tmp_path / "metrics.jsonl", [])
    done = subprocess.run(
        [sys.executable, "-m", "composetrain.plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "holds no training records yet" in done.stderr and "Traceback" not in done.stderr


def test_the_command_does_not_import_torch(tmp_path):
    write(tmp_path / "metrics.jsonl", [record(1), record(2)])
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['plot', {str(tmp_path)!r}]\n"
        "runpy.run_module('composetrain.plot', run_name='__main__')\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
        "print('no torch')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "no torch", done.stderr
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_the_log_of_a_real_run_draws_its_metrics_and_no_bookkeeping(tmp_path):
    import torch
    from torch.utils.data import TensorDataset

    import composetrain as ct

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)

    def step(model, batch):
        x, y = batch
        out = model(x)
        return torch.nn.functional.cross_entropy(out, y), {"acc": (out.argmax(-1) == y).float().mean()}

    data = TensorDataset(torch.randn(16, 3), torch.randint(0, 2, (16,)))
    ct.run(
        step,
        ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)),
        data,
        batch_size=8,
        epochs=1,
        log_every=1,
        checkpoint_dir=tmp_path,
        progress=False,
        eval_data=data,
        eval_step=lambda m, b: {"acc": (m(b[0]).argmax(-1) == b[1]).float().mean()},
    )
    written = {k for line in (tmp_path / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert "global_batch" in written  # what the plot must leave out is really there
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean log draws without a word
        drawn = curves(tmp_path)
    assert list(drawn) == ["training loss", "acc", "learning rate", "updates / s", "share of time waiting for data"]
    assert drawn["acc"]["eval"][0] == [2]


# -- crafted metrics files and output paths ---------------------------------------------------------------------------


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


def test_the_plot_leaves_out_every_measured_field():
    """The fields that measure the machine (samples/s, FLOPs, memory, stragglers) are bookkeeping, not metrics."""
    from composetrain import plot
    from composetrain.core.metric_names import MEASURED

    assert MEASURED <= plot._LOOP_KEYS

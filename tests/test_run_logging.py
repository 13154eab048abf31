"""ct.run's records: metrics read only at log points, every update logged once (a stop inside a window too), the
metrics and log files (once each after a crash, another run's moved aside, evaluations in them), TensorBoard.
"""

import json

import hypothesis.strategies as st
import pytest
import run_script
import torch
from hypothesis import given, settings
from run_script import train, untimed

import composetrain as ct


def test_metrics_are_read_only_at_log_points(monkeypatch):
    state = run_script.state()
    reads = []
    for name in ("item", "tolist"):
        original = getattr(torch.Tensor, name)

        def spy(self, original=original, name=name):
            if self.is_floating_point():  # metrics; not the loader's integer seed draws
                reads.append(state.step)
            return original(self)

        monkeypatch.setattr(torch.Tensor, name, spy)
    result = ct.run(
        ct.accumulate(2)(run_script.step),
        state,
        run_script.dataset(),
        batch_size=12,
        epochs=2,
        log_every=5,
        num_workers=0,
        progress=False,
    )
    monkeypatch.undo()
    assert reads and set(reads) == {5, 8, 10, 15, 16}  # multiples of 5, and each epoch's end
    assert all(isinstance(v, (int, float)) for r in result.history for v in r.values())  # no tensors kept


def test_history_and_metrics_file(tmp_path):
    _, result = train(tmp_path, epochs=2)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == result.history
    assert {"step", "epoch", "loss", "acc", "lr", "skipped", "updates_per_s", "data_wait"} <= lines[0].keys()
    assert lines[-1]["loss"] < lines[0]["loss"]


def test_the_metrics_file_after_a_crash_holds_each_record_once(tmp_path):
    train(tmp_path, max_steps=6, checkpoint_every=3)  # logs at 4, checkpoint at 3 and 6
    checkpoint_6 = tmp_path / "step-000000006"
    import shutil

    shutil.rmtree(checkpoint_6)  # as if killed after logging step 4 and before saving step 6
    _, result = train(tmp_path, epochs=2, checkpoint_every=3)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [r["step"] for r in result.history] == [4, 8, 12, 16]


def test_a_run_stopped_inside_a_logging_window_logs_it(tmp_path):
    _, short = train(max_steps=3, log_every=50)
    assert [r["step"] for r in short.history] == [3]
    _, stopped = train(tmp_path / "b", max_steps=5)  # logs at 4, then the one-update window of step 5
    assert [r["step"] for r in stopped.history] == [4, 5]
    _, resumed = train(tmp_path / "b", epochs=2)  # the checkpoint at 5 still holds its window: exact history
    _, straight = train(epochs=2)
    assert untimed(resumed.history) == untimed(straight.history)
    lines = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert untimed(lines) == untimed(straight.history)


@settings(max_examples=12)
@given(max_steps=st.integers(1, 20), log_every=st.integers(1, 12))
def test_every_update_is_logged_exactly_once(max_steps, log_every):
    """The records' windows cover every update once: log points, epoch ends (8 updates each), the stop."""
    losses = []

    def spy(model, batch):
        loss, metrics = run_script.step(model, batch)
        losses.append(loss.item())
        return loss, metrics

    result = ct.run(
        spy,
        run_script.state(),
        run_script.dataset(),
        batch_size=12,
        num_workers=0,
        progress=False,
        max_steps=max_steps,
        log_every=log_every,
    )
    steps = [r["step"] for r in result.history]
    assert steps == sorted({s for s in range(1, max_steps + 1) if s % log_every == 0 or s % 8 == 0} | {max_steps})
    windows = [b - a for a, b in zip([0, *steps], steps, strict=False)]
    weighted = sum(r["loss"] * n for r, n in zip(result.history, windows, strict=True))
    assert weighted == pytest.approx(sum(losses), rel=1e-6)  # float32 losses, averaged in float64


def test_a_log_file_of_another_run_is_moved_aside_and_a_resumed_run_keeps_its_own(tmp_path):
    import warnings

    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "run": "another"}\n')
    with pytest.warns(
        UserWarning, match=r"log.jsonl' held 1 lines that are not this run's .* moved them to .*log.jsonl.1'"
    ):
        train(tmp_path / "b", max_steps=5, log_file=log)
    assert (tmp_path / "log.jsonl.1").read_text() == '{"step": 1, "run": "another"}\n'
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the run's own log is continued, not moved aside
        _, resumed = train(tmp_path / "b", epochs=2, log_file=log)
    assert [json.loads(line) for line in log.read_text().splitlines()] == resumed.history
    with pytest.warns(UserWarning, match=r"moved them to .*log.jsonl.2'"):  # a fresh run never overwrites it
        _, fresh = train(epochs=1, log_file=log)
    assert [json.loads(line) for line in log.read_text().splitlines()] == fresh.history
    assert [json.loads(line) for line in (tmp_path / "log.jsonl.2").read_text().splitlines()] == resumed.history


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_evaluations_are_logged_and_a_resumed_run_writes_the_same_file(tmp_path):
    options = {"epochs": 3, "eval_step": run_script.accuracy, "eval_data": run_script.dataset(30), "eval_every": 5}
    _, straight = train(tmp_path / "a", **options)
    train(tmp_path / "b", max_steps=11, **options)  # stopped inside the second epoch
    train(tmp_path / "b", **options)
    a, b = read_lines(tmp_path / "a" / "metrics.jsonl"), read_lines(tmp_path / "b" / "metrics.jsonl")
    kinds = [(r["step"], "eval" in r) for r in a]
    assert kinds == [(r["step"], "eval" in r) for r in b]
    evals = [r for r in a if "eval" in r]
    assert [e["step"] for e in evals] == [e["step"] for e in straight.evals] == [5, 10, 15, 20]
    assert [e["eval"] for e in evals] == [
        {k: v for k, v in e.items() if k not in ("step", "epoch")} for e in straight.evals
    ]
    assert [e["eval"] for e in evals] == [e["eval"] for e in b if "eval" in e]
    assert [r["loss"] for r in a if "loss" in r] == [r["loss"] for r in b if "loss" in r]


def test_tensorboard_gets_training_and_evaluation_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    options = {"epochs": 2, "eval_step": run_script.accuracy, "eval_data": run_script.dataset(30), "tensorboard": True}
    _, result = train(tmp_path, **options)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/acc", "train/lr", "eval/acc"} <= set(tags)
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in result.history]
    assert [e.value for e in events.Scalars("eval/acc")] == pytest.approx([e["acc"] for e in result.evals])


def test_tensorboard_needs_somewhere_to_write():
    state = run_script.state()
    with pytest.raises(ValueError, match=r"tensorboard=True writes beside the metrics file, but there is none"):
        ct.run(run_script.step, state, run_script.dataset(), batch_size=12, tensorboard=True, progress=False)
    with pytest.raises(TypeError, match=r"tensorboard must be True, False or a folder, got 1 \(int\)"):
        ct.run(run_script.step, state, run_script.dataset(), batch_size=12, tensorboard=1, progress=False)
    assert state.step == 0

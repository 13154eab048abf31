"""TensorBoard: a folder that is usable, checked before anything is set up; a resumed run's curves hold each
step once, as a straight run's do."""

import pytest
import run_script
from helpers import snapshot
from run_script import accuracy

import composetrain as ct

pytest.importorskip("tensorboard")


def train(tmp, step=run_script.step, **options):
    state = run_script.state()
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 1, **options}
    result = ct.run(step, state, run_script.dataset(), checkpoint_dir=tmp, tensorboard=True, **options)
    return state, result


def scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


@pytest.mark.parametrize("crash_after", [5, 6])
def test_a_run_resumed_after_a_crash_past_its_checkpoint_has_each_step_once(tmp_path, crash_after):
    """Saved at 4, logged 5 (and 6), crashed; the resumed run starts at 4: TensorBoard shows 1..8 once each,
    the values of a straight run, and the evaluations at 4 and 8 once each."""
    options = {
        "max_steps": 8,
        "checkpoint_every": 4,
        "eval_step": accuracy,
        "eval_data": run_script.dataset(24),
        "eval_every": 4,
    }
    _, straight = train(tmp_path / "a", **options)
    calls = []

    def crashes(model, batch):
        calls.append(1)
        if len(calls) == crash_after + 1:
            raise RuntimeError("crash")
        return run_script.step(model, batch)

    with pytest.raises(RuntimeError, match="crash"):
        train(tmp_path / "b", crashes, **options)
    train(tmp_path / "b", **options)
    for tag in ("train/loss", "train/acc", "eval/acc"):
        want = scalars(tmp_path / "a" / "tensorboard", tag)
        got = scalars(tmp_path / "b" / "tensorboard", tag)
        assert [s for s, _ in got] == [s for s, _ in want], tag  # no step twice, none missing
        assert [v for _, v in got] == pytest.approx([v for _, v in want]), tag
    assert [s for s, _ in scalars(tmp_path / "b" / "tensorboard", "train/loss")] == list(range(1, 9))
    assert [s for s, _ in scalars(tmp_path / "b" / "tensorboard", "eval/acc")] == [4, 8]
    del straight


@pytest.mark.parametrize(
    ("board", "match"),
    [
        ("", r"run: tensorboard='' names no folder \(it would write into the working directory\)"),
        ("FILE", r"run: tensorboard='.*plain' is a file, not a folder"),
    ],
)
def test_a_tensorboard_folder_that_cannot_be_used_is_refused_before_anything_is_set_up(
    tmp_path, monkeypatch, board, match
):
    monkeypatch.chdir(tmp_path)  # tensorboard='' would write here
    plain = tmp_path / "plain"
    plain.write_text("not a folder")
    board = str(plain) if board == "FILE" else board
    state = run_script.state()
    before = snapshot(state)
    with pytest.raises(ValueError, match=match):
        run_script.run_plain(state, checkpoint_dir=tmp_path / "ck", tensorboard=board)
    assert not (tmp_path / "ck").exists()  # refused before the checkpoint folder was made
    assert state.step == 0 and snapshot(state).keys() == before.keys()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]  # no event file anywhere


def test_the_records_at_the_resumed_step_are_written_back_once(tmp_path):
    """The checkpoint at step 4 holds its log record and (saved again after a skipped update) its evaluation:
    the purge from step 4 on hides the crashed run's events there, so the resumed log writes them back."""
    from types import SimpleNamespace

    from composetrain.driver.monitor import MetricsLog

    proc = SimpleNamespace(is_main=True, differing=lambda value: None)
    board = tmp_path / "tb"
    record = {"step": 4, "epoch": 0, "loss": 0.5}
    evaluation = {"step": 4, "epoch": 0, "acc": 0.75}
    crashed = MetricsLog(tmp_path / "m.jsonl", proc, board)
    crashed.start([], [], resumed=False, step=0)
    crashed.write(record)
    crashed.write_eval(evaluation)
    crashed.write({**record, "step": 5, "loss": 0.4})  # past the checkpoint: made again by the resumed run
    crashed.close()
    resumed = MetricsLog(tmp_path / "m.jsonl", proc, board)
    resumed.start([record], [evaluation], resumed=True, step=4)
    resumed.close()
    assert scalars(board, "train/loss") == [(4, 0.5)]
    assert scalars(board, "eval/acc") == [(4, 0.75)]


def test_a_resumed_event_file_sorts_after_the_crashed_ones_made_in_the_same_second(tmp_path):
    """TensorBoard reads a folder's event files in name order, and the name is the second, host, pid and a
    per-process counter: a run resumed in the same process and second as its crash (counter 10 after 9) would
    sort first, and the purge it carries would not hide the crashed file's steps."""
    import os
    import socket
    import time
    from types import SimpleNamespace

    from composetrain.driver.monitor import MetricsLog

    board = tmp_path / "tb"
    board.mkdir()
    crashed = board / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.99999"
    crashed.write_bytes(b"")
    proc = SimpleNamespace(is_main=True, differing=lambda value: None)
    resumed = MetricsLog(tmp_path / "m.jsonl", proc, board)
    resumed.start([], [], resumed=True, step=4)
    resumed.close()
    names = sorted(p.name for p in board.iterdir())
    assert names[0] == crashed.name and len(names) == 2

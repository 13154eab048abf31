"""A run that starts afresh where TensorBoard event files already are (the same command rerun after a crash
before the first checkpoint, or after the checkpoints were removed) shows each step once, as the metrics
file does: the earlier files are hidden from step 0 on (TensorBoard's purge), with a warning, not deleted."""

import pytest
import run_script

import composetrain as ct

pytest.importorskip("tensorboard")

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 1}


def train(tmp, step=run_script.step, **options):
    state = run_script.state()
    return ct.run(step, state, run_script.dataset(), checkpoint_dir=tmp, tensorboard=True, **{**OPTIONS, **options})


def scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def crashes_after(n):
    calls = []

    def step(model, batch):
        calls.append(1)
        if len(calls) == n + 1:
            raise RuntimeError("crash")
        return run_script.step(model, batch)

    return step


def test_a_rerun_after_a_crash_before_the_first_checkpoint_has_each_step_once(tmp_path):
    """Logged 1..3, crashed before the epoch's checkpoint at 4: the rerun starts afresh and logs 1..6."""
    train(tmp_path / "a", max_steps=6)
    with pytest.raises(RuntimeError, match="crash"):
        train(tmp_path / "b", crashes_after(3), max_steps=6)
    assert [s for s, _ in scalars(tmp_path / "b" / "tensorboard", "train/loss")] == [1, 2, 3]
    with pytest.warns(UserWarning, match=r"run: tensorboard folder .* held event files of another run") as caught:
        train(tmp_path / "b", max_steps=6)
    assert any("metrics.jsonl" in str(w.message) for w in caught)  # the log file's own warning, as before
    for tag in ("train/loss", "train/acc", "train/lr"):
        want, got = scalars(tmp_path / "a" / "tensorboard", tag), scalars(tmp_path / "b" / "tensorboard", tag)
        assert [s for s, _ in got] == [s for s, _ in want] == list(range(1, 7)), tag
        assert [v for _, v in got] == [v for _, v in want], tag


def test_a_fresh_run_into_an_empty_or_new_folder_warns_of_nothing(tmp_path, recwarn):
    (tmp_path / "tb").mkdir()
    ct.run(
        run_script.step, run_script.state(), run_script.dataset(), tensorboard=tmp_path / "tb", max_steps=2, **OPTIONS
    )
    assert not [w for w in recwarn if "tensorboard" in str(w.message)]
    assert [s for s, _ in scalars(tmp_path / "tb", "train/loss")] == [1, 2]


def test_a_tensorboard_folder_inside_a_file_is_refused_before_anything_is_made(tmp_path):
    """tensorboard='plain/tb' where plain is a file: refused as the file itself is, before the checkpoint folder
    and the metrics file are made (it was a PermissionError after both, saying 'not writable (Not a directory)')."""
    (tmp_path / "plain").write_text("not a folder")
    with pytest.raises(ValueError, match=r"run: tensorboard='.*plain/tb' is inside '.*plain', a file, not a folder"):
        ct.run(
            run_script.step,
            run_script.state(),
            run_script.dataset(),
            checkpoint_dir=tmp_path / "ck",
            tensorboard=tmp_path / "plain" / "tb",
            **OPTIONS,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]

"""ct.run(profile=...): torch.profiler over the chosen updates only, each window's trace written per rank into the
run's folder as Chrome trace JSON in TensorBoard's profiler-plugin layout, the updates and their phases marked;
no profiler and no record_function outside the windows."""

import json

import pytest
import run_script
import torch
from torch.autograd import profiler as torch_profiler

import composetrain as ct
from composetrain.core import protocol

WINDOW = {"wait": 2, "warmup": 1, "active": 2, "repeat": 2}  # records updates 4-5 and 9-10


def annotations(path):
    """The names the trace marks, in time order (torch's own optimizer and profiler-step marks left out)."""
    trace = json.loads(path.read_text())
    marks = sorted((e["ts"], e["name"]) for e in trace["traceEvents"] if e.get("cat") == "user_annotation")
    return [name for _, name in marks if not name.startswith(("Optimizer.", "ProfilerStep#"))]


def test_the_windows_traces_parse_and_hold_their_updates_and_phases(tmp_path):
    # 8 updates an epoch: the epoch's end (log, save, evaluation: none given) falls in the second window's warm-up
    _, result = run_script.train(tmp_path, max_steps=12, log_every=4, checkpoint_every=9, profile=WINDOW)
    traces = sorted((tmp_path / "profile").glob("*.pt.trace.json"))
    assert [p.name.split(".")[0] for p in traces] == ["rank0-updates4-5", "rank0-updates9-10"]
    update = ["forward/backward", "optimizer"]  # TrainStep names its phases while a profiler records
    assert annotations(traces[0]) == ["data", "update 4", *update, "logging", "data", "update 5", *update]
    assert annotations(traces[1]) == [
        *("logging", "checkpoint", "evaluation"),  # after update 8, the second window's warm-up update
        *("data", "update 9", *update, "checkpoint", "data", "update 10", *update),
    ]
    assert result.steps == 12


def test_no_profiler_exists_and_nothing_is_marked_outside_the_windows(tmp_path, monkeypatch):
    made = []
    real = torch.profiler.profile

    def counted(*args, **kwargs):
        made.append(kwargs["schedule"])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.profiler, "profile", counted)
    recording = []

    def spy(model, batch):
        recording.append(torch_profiler._is_profiler_enabled)
        return run_script.step(model, batch)

    ct.run(
        ct.accumulate(2)(spy),
        run_script.state(),
        run_script.dataset(),
        batch_size=12,
        max_steps=14,
        log_every=4,
        num_workers=0,
        progress=False,
        profile={**WINDOW, "folder": str(tmp_path / "traces")},
    )
    assert len(made) == 2  # one profiler per window, none between
    per_update = recording[::2]  # two forwards per update (accumulate(2))
    assert [i + 1 for i, on in enumerate(per_update) if on] == [4, 5, 9, 10]
    assert len(list((tmp_path / "traces").glob("*.pt.trace.json"))) == 2


def test_a_train_step_marks_its_phases_for_any_profiler_and_calls_no_record_function_without_one(monkeypatch):
    state = run_script.state()
    train = ct.accumulate(2)(run_script.step)
    batch = run_script.dataset()[:12]
    with torch.profiler.profile() as prof:
        train(state, batch)
    names = [e.name for e in prof.events()]
    assert "forward/backward" in names and "optimizer" in names

    def refused(name):
        raise AssertionError(f"record_function({name!r}) without a profiler")

    monkeypatch.setattr(protocol, "record_function", refused)
    train(state, batch)  # no profiler: no record_function
    assert state.step == 2


@pytest.mark.parametrize(
    ("profile", "error", "message"),
    [
        ("yes", TypeError, r"run: profile must be True, False or a dict of the window, got 'yes' \(str\)"),
        ({"wait": -1}, ValueError, r"run: profile's wait must be a non-negative int, got -1"),
        ({"active": 0}, ValueError, r"run: profile's active must be a positive int, got 0"),
        ({"every": 3}, ValueError, r"run: profile has no setting 'every'; its settings are \['wait', 'warmup'"),
        ({"record_shapes": 1}, TypeError, r"run: profile's record_shapes must be True or False, got 1"),
        ({"folder": 3}, TypeError, r"run: profile's folder must name a folder, got 3 \(int\)"),
        (True, ValueError, r"run: profile writes its traces into the run's folder, but there is none: give"),
    ],
)
def test_the_window_is_checked_before_anything_runs(profile, error, message):
    state = run_script.state()
    with pytest.raises(error, match=message):
        ct.run(run_script.step, state, run_script.dataset(), batch_size=8, profile=profile)
    assert state.step == 0


def test_profile_true_writes_beside_the_metrics_file(tmp_path):
    run_script.train(max_steps=10, log_file=tmp_path / "run" / "metrics.jsonl", profile=True)
    traces = list((tmp_path / "run" / "profile").glob("*.pt.trace.json"))
    assert [p.name.split(".")[0] for p in traces] == ["rank0-updates7-9"]  # after 5 updates, 1 of warm-up, 3


@pytest.mark.parametrize("where", ["a file", "inside a file", "the metrics file", "default, a file"])
def test_a_trace_folder_that_cannot_be_made_is_refused_before_the_first_update(tmp_path, where):
    """The profiler makes its folder only when a window's trace is written, updates into the run: a folder that a
    file stands in the way of is refused before anything runs, not at the window's end."""
    (tmp_path / "taken").write_text("a file of the user's")
    log_file = tmp_path / "run" / "metrics.jsonl"
    folder = {
        "a file": tmp_path / "taken",
        "inside a file": tmp_path / "taken" / "profile",
        "the metrics file": log_file,
        "default, a file": None,
    }[where]
    if folder is None:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "profile").write_text("a file named profile")
    window = {"wait": 0, "warmup": 0, "active": 1, **({"folder": folder} if folder is not None else {})}
    state = run_script.state()
    with pytest.raises(PermissionError, match=r"run: profile's folder '.*' cannot be made \(.*\); choose a folder"):
        ct.run(
            run_script.step,
            state,
            run_script.dataset(),
            batch_size=8,
            max_steps=2,
            log_file=log_file,
            profile=window,
            num_workers=0,
            progress=False,
        )
    assert state.step == 0 and not log_file.exists()


def test_a_file_url_checkpoint_dir_gets_its_traces_in_the_folder_it_names(tmp_path, monkeypatch):
    """checkpoint_dir='file:///...' is the local folder it names: the traces go there, not into a folder named
    'file:' under the working directory."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    ct.run(
        run_script.step,
        run_script.state(),
        run_script.dataset(),
        batch_size=8,
        max_steps=10,
        checkpoint_dir=run.as_uri(),
        profile=True,
        num_workers=0,
        progress=False,
    )
    assert not (tmp_path / "file:").exists()
    assert [p.name.split(".")[0] for p in (run / "profile").glob("*.pt.trace.json")] == ["rank0-updates7-9"]


def test_a_remote_checkpoint_dir_is_no_folder_for_traces():
    state = run_script.state()
    with pytest.raises(ValueError, match=r"run: profile writes its traces into the run's folder, but there is none"):
        ct.run(
            run_script.step,
            state,
            run_script.dataset(),
            batch_size=8,
            max_steps=2,
            checkpoint_dir="s3://bucket/run",
            profile=True,
            num_workers=0,
            progress=False,
        )
    assert state.step == 0


def test_oom_snapshot_without_a_run_folder_is_refused():
    """The snapshot goes into the run's folder: without one it would be lost without a word."""
    state = run_script.state()
    with pytest.raises(ValueError, match=r"run: oom_snapshot writes its snapshot into the run's folder, but there is"):
        ct.run(
            run_script.step,
            state,
            run_script.dataset(),
            batch_size=8,
            max_steps=2,
            oom_snapshot=True,
            num_workers=0,
            progress=False,
        )
    assert state.step == 0


def test_a_window_inside_a_profiler_of_the_users_is_refused_before_the_first_update(tmp_path):
    """torch runs one profiler at a time: starting the window's would cancel the user's own trace."""
    state = run_script.state()
    with torch.profiler.profile(), pytest.raises(RuntimeError, match=r"run: profile=.*a profiler is recording"):
        ct.run(
            run_script.step,
            state,
            run_script.dataset(),
            batch_size=8,
            max_steps=2,
            profile={"folder": tmp_path},
            num_workers=0,
            progress=False,
        )
    assert state.step == 0


def test_the_run_folder_itself_may_hold_the_traces_beside_the_metrics_file(tmp_path):
    log_file = tmp_path / "metrics.jsonl"
    run_script.train(max_steps=2, log_file=log_file, profile={"wait": 0, "warmup": 0, "active": 1, "folder": tmp_path})
    assert log_file.is_file() and [p.name.split(".")[0] for p in tmp_path.glob("*.pt.trace.json")] == [
        "rank0-updates1-1"
    ]


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (
            {"wait": 3, "warmup": 1, "active": 3},
            r"run: the run ended after update 6, inside the profiler's window over updates 5-7: its trace \(named for "
            r"updates 5-7\) holds updates 5-6 only; start it earlier \(profile's wait=3, warmup=1\) or run longer",
        ),
        (
            {"wait": 8},
            r"run: the run ended after 6 update\(s\) of this call, before the profiler's window \(after 8 "
            r"update\(s\), 1 of warm-up and 3 recorded\) was complete: no trace was written; start it earlier",
        ),
    ],
)
def test_a_run_that_ends_before_its_window_is_complete_says_so(tmp_path, window, message):
    with pytest.warns(UserWarning, match=message):
        run_script.train(max_steps=6, log_file=tmp_path / "metrics.jsonl", profile=window)
    traces = list(tmp_path.glob("profile/*.json"))
    if window["wait"] == 3:  # what it recorded of the window: update 5 and 6, of 5-7
        assert [p.name.split(".")[0] for p in traces] == ["rank0-updates5-7"]
        assert [m for m in annotations(traces[0]) if m.startswith("update ")] == ["update 5", "update 6"]
    else:
        assert not traces


def test_a_complete_window_warns_of_nothing(tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r".*profiler's window")
        run_script.train(max_steps=6, log_file=tmp_path / "metrics.jsonl", profile={"wait": 2, "repeat": 3})
    assert len(list(tmp_path.glob("profile/*.json"))) == 1

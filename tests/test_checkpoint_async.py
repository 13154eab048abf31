"""Saves written in the background (``ct.run(..., checkpoint_async=True)``, the default): published only once
written (files fsynced, checksums listed), at most one in flight, the copy taken at the update boundary, the same
bytes as a synchronous save, resumable as one; a write that fails (a full disk) stops the run with its error, the
previous checkpoint the newest; retention never leaves no checkpoint; the stalls named in ``result.bottleneck``.

Observed from the outside: the files in the folder, seen from the step (which runs between two boundaries) and from
the writes (``files._write``, the one function that writes a checkpoint file, wrapped)."""

import errno
import json
import os
import signal
import threading
import time
import warnings
from pathlib import Path

import pytest
import run_script
import torch
from helpers import assert_states_equal
from run_script import untimed

import composetrain as ct
import composetrain.checkpoint.files as files

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 4, "checkpoint_async": True}


def train(directory, step=run_script.step, **options):
    state = run_script.state()
    result = ct.run(step, state, run_script.dataset(), checkpoint_dir=directory, **{**OPTIONS, **options})
    return state, result


def published(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("step-*") if (p / "checksums.json").is_file())


def temporary(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".step-*.tmp"))


def latest(folder: Path) -> str | None:
    """The checkpoint a resumed run would load, chosen without any warning (nothing to skip)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoints = files.Checkpoints(folder, rank=0, world_size=1, keep=2)
        found = checkpoints.latest()
        checkpoints.close()
    return None if found is None else found[0].name


def spying(calls: list, before=None):
    """run_script's step, which first appends the folder's state to ``calls`` (and runs ``before(n)``)."""

    def step(model, batch):
        if before is not None:
            before(len(calls) + 1)
        calls.append(None)
        return run_script.step(model, batch)

    return step


def test_a_background_save_is_published_only_once_written_while_training_goes_on(tmp_path, monkeypatch):
    """The save of update 2 is held inside its first write until update 4 begins: updates 3 and 4 train
    meanwhile, and see its temporary folder only; it is published before the save of update 4 begins."""
    gate, real = threading.Event(), files._write
    writers = []

    def held(obj, path):
        writers.append(threading.current_thread().name)
        if path.parent.name == ".step-000000002.tmp":
            assert gate.wait(60)
        return real(obj, path)

    monkeypatch.setattr(files, "_write", held)
    seen = {}

    def look(n):
        seen[n] = (published(tmp_path), temporary(tmp_path))
        if n == 4:
            gate.set()

    _, result = train(tmp_path, spying([], look), max_steps=6, checkpoint_every=2)
    assert seen[3] == seen[4] == ([], [".step-000000002.tmp"])  # trained on; nothing published yet
    assert seen[5][0] == ["step-000000002"]  # the save of 4 waited for it (one in flight), published it first
    assert seen[5][1] == [".step-000000004.tmp"]
    assert published(tmp_path) == ["step-000000004", "step-000000006"] and not temporary(tmp_path)
    assert result.checkpoint == tmp_path / "step-000000006"
    # 2 and 4 by a writer thread, the run's last save (6) by the training thread, which returns once it is written
    assert writers == [*["checkpoint step 2"] * 2, *["checkpoint step 4"] * 2, *["MainThread"] * 2]


def test_with_a_tracker_the_first_checkpoint_is_written_in_the_foreground_and_the_rest_in_the_background(
    tmp_path, monkeypatch
):
    """With on_record, a run that has no checkpoint writes its first one on the training thread (a kill before it
    is published would start the run afresh and send again the records made meanwhile), later ones in the
    background; a run resumed from a checkpoint writes even its first in the background. Without on_record, the
    first too."""
    writers, real = [], files._write

    def spy(obj, path):
        writers.append((path.parent.name.removeprefix(".step-00000000")[0], threading.current_thread().name))
        return real(obj, path)

    monkeypatch.setattr(files, "_write", spy)
    got = []
    train(tmp_path / "a", max_steps=4, checkpoint_every=2, on_record=got.append)
    assert writers == [("2", "MainThread")] * 2 + [("4", "MainThread")] * 2  # 4: the run's last
    writers.clear()
    train(tmp_path / "a", max_steps=8, checkpoint_every=3, on_record=got.append)  # resumed at 4: saves 6, 8
    assert writers == [("6", "checkpoint step 6")] * 2 + [("8", "MainThread")] * 2
    assert [r["step"] for r in got] == [4, 8]  # each record once
    writers.clear()
    train(tmp_path / "b", max_steps=4, checkpoint_every=2)
    assert writers == [("2", "checkpoint step 2")] * 2 + [("4", "MainThread")] * 2


def test_at_most_one_save_is_in_flight_and_a_save_that_finds_one_waits(tmp_path, monkeypatch):
    real, active, most, steps = files._write, [], [0], []

    def slow(obj, path):
        active.append(path)
        most[0] = max(most[0], len(active), sum(t.name.startswith("checkpoint step") for t in threading.enumerate()))
        steps.append(path.parent.name)
        time.sleep(0.05)
        written = real(obj, path)
        active.remove(path)
        return written

    monkeypatch.setattr(files, "_write", slow)
    _, result = train(tmp_path, max_steps=6, checkpoint_every=1, keep_checkpoints=6)
    assert most[0] == 1
    assert sorted(set(steps)) == [f".step-00000000{n}.tmp" for n in range(1, 7)]  # none dropped
    assert published(tmp_path) == [f"step-00000000{n}" for n in range(1, 7)]
    assert "waited" in result.bottleneck and "for the previous one to be written" in result.bottleneck


def payload(state, n):
    return {"state": state.state_dict(), "n": n, "history": [{"step": n}]}, {"window": [], "n": n}


def test_the_copy_is_taken_when_save_async_returns_and_written_as_a_synchronous_save_would_be(tmp_path, monkeypatch):
    """One state saved synchronously into a, and in the background into b while every live tensor it holds is
    changed in place and the optimizer takes a step: the files of b are those of a, byte for byte."""
    state = run_script.state()
    for _ in range(2):  # momentum buffers in the optimizer's state
        run_script.step(state.model, run_script.dataset(24)[:])[0].backward()
        state.optimizer.step()
    gate, real = threading.Event(), files._write

    def held(obj, path):
        assert gate.wait(60)
        return real(obj, path)

    a = files.Checkpoints(tmp_path / "a", rank=0, world_size=1, keep=2)
    a.save(2, *payload(state, 2))
    a.close()
    b = files.Checkpoints(tmp_path / "b", rank=0, world_size=1, keep=2)
    monkeypatch.setattr(files, "_write", held)
    b.save_async(2, *payload(state, 2))
    with torch.no_grad():
        for t in state.state_dict()["model"].values():
            t.mul_(-3).add_(1)
    state.optimizer.step()  # the momentum buffers change in place
    assert published(tmp_path / "b") == []
    gate.set()
    assert b.finish() == tmp_path / "b" / "step-000000002"
    b.close()
    names = sorted(p.name for p in (tmp_path / "a" / "step-000000002").iterdir())
    assert names == ["checksums.json", "rank-0.pt", "state.pt"]
    names.reverse()  # the checksums last: a file that differs is named
    for name in names:
        assert (tmp_path / "a" / "step-000000002" / name).read_bytes() == (
            tmp_path / "b" / "step-000000002" / name
        ).read_bytes(), name


def test_finish_and_the_next_save_wait_for_the_writes_in_flight(tmp_path, monkeypatch):
    """Checkpoints' own guarantees, whoever calls them: finish() returns once the writes are over and published;
    a second save_async while one is being written finishes that one first (at most one in flight)."""
    state, gate, real = run_script.state(), threading.Event(), files._write
    monkeypatch.setattr(files, "_write", lambda obj, path: gate.wait(60) and real(obj, path))
    checkpoints = files.Checkpoints(tmp_path, rank=0, world_size=1, keep=5)
    try:
        for finishing in (checkpoints.finish, lambda: checkpoints.save_async(4, *payload(state, 4))):
            gate.clear()
            checkpoints.save_async(2, *payload(state, 2))
            threading.Timer(0.3, gate.set).start()  # the writes held a while after finish is called
            started = time.monotonic()
            finishing()
            assert time.monotonic() - started >= 0.25
            files_of_2 = sorted(p.name for p in (tmp_path / "step-000000002").iterdir())
            assert published(tmp_path) == ["step-000000002"] and files_of_2 == [
                "checksums.json",
                "rank-0.pt",
                "state.pt",
            ]
            sums = json.loads((tmp_path / "step-000000002" / "checksums.json").read_text())["sha256"]
            assert sorted(sums) == ["rank-0.pt", "state.pt"]  # both written before the list
        assert checkpoints.finish() == tmp_path / "step-000000004"
        checkpoints.close()
    finally:  # a writer never left running into the interpreter's exit
        gate.set()
        for t in threading.enumerate():
            if t.name.startswith("checkpoint step"):
                t.join(30)


def test_a_run_saving_in_the_background_saves_what_a_synchronous_run_saves(tmp_path):
    """Every checkpoint of the two runs: each rank file byte for byte, state.pt equal but for the timings."""
    sync, _ = train(tmp_path / "sync", max_steps=9, checkpoint_every=2, keep_checkpoints=9, checkpoint_async=False)
    background, _ = train(tmp_path / "async", max_steps=9, checkpoint_every=2, keep_checkpoints=9)
    assert_states_equal(sync, background)
    names = published(tmp_path / "sync")
    assert names == published(tmp_path / "async") and len(names) == 5  # 2, 4, 6, 8 (also the epoch's end), 9
    for name in names:
        a, b = tmp_path / "sync" / name, tmp_path / "async" / name
        assert (a / "rank-0.pt").read_bytes() == (b / "rank-0.pt").read_bytes(), name
        x, y = (torch.load(f / "state.pt", weights_only=True) for f in (a, b))
        x["history"], y["history"] = untimed(x["history"]), untimed(y["history"])
        assert x.keys() == y.keys()
        for key in x:
            if key == "state":
                assert_tensors_equal(x[key], y[key])
            else:
                assert x[key] == y[key], key


def assert_tensors_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.dtype == b.dtype
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_tensors_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_tensors_equal(x, y)
    else:
        assert a == b


def test_a_run_that_fails_resumes_from_its_background_checkpoint_as_the_uninterrupted_run(tmp_path, monkeypatch):
    straight, straight_result = train(tmp_path / "straight", max_steps=11, checkpoint_every=3)
    writers, real = set(), files._write

    def spy(obj, path):
        writers.add((path.parent.name, threading.current_thread().name))
        return real(obj, path)

    monkeypatch.setattr(files, "_write", spy)

    def crash(n):
        if n == 8:
            raise RuntimeError("the node failed")

    with pytest.raises(RuntimeError, match="the node failed"):
        train(tmp_path / "run", spying([], crash), max_steps=11, checkpoint_every=3)
    assert (".step-000000006.tmp", "checkpoint step 6") in writers  # written by the background thread
    assert latest(tmp_path / "run") == "step-000000006"
    resumed, result = train(tmp_path / "run", max_steps=11, checkpoint_every=3)
    assert_states_equal(resumed, straight)
    assert untimed(result.history) == untimed(straight_result.history)


@pytest.mark.parametrize("where", ["rank-0.pt", "state.pt", "fsync"])
def test_a_full_disk_in_the_background_stops_the_run_and_leaves_the_previous_checkpoint(tmp_path, monkeypatch, where):
    """The save of update 4 runs out of space in its writer thread (half a file written, or its fsync refused): the
    run raises the error at the next update boundary, nothing of step 4 is left, step 2 is the newest, and a rerun
    resumes."""
    real_write, real_fsync = files._write, files.os.fsync

    def full(path):
        with open(path, "ab") as f:
            f.write(b"PK\x03\x04 half a file")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    def write(obj, path):
        if path.parent.name == ".step-000000004.tmp" and path.name == where:
            full(path)
        return real_write(obj, path)

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if ".step-000000004.tmp/" in path and where == "fsync":
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_fsync(fd)

    monkeypatch.setattr(files, "_write", write)
    monkeypatch.setattr(files.os, "fsync", fsync)
    calls = []
    with pytest.raises(OSError, match=r"no space left in .* for checkpoint step 4") as raised:
        train(tmp_path, spying(calls), max_steps=12, checkpoint_every=2)
    assert raised.value.errno == errno.ENOSPC
    assert "the previous checkpoint step-000000002 is intact and nothing of step 4 was left behind" in str(raised.value)
    assert len(calls) < 12  # stopped at the boundary after the failed write, not at the end
    assert published(tmp_path) == ["step-000000002"] and not temporary(tmp_path)
    assert not (tmp_path / "step-000000004").exists()
    monkeypatch.undo()
    assert latest(tmp_path) == "step-000000002"
    resumed, _ = train(tmp_path, max_steps=12, checkpoint_every=2)
    straight, _ = train(tmp_path / "straight", max_steps=12, checkpoint_every=2)
    assert_states_equal(resumed, straight)


def test_retention_never_leaves_the_folder_without_a_complete_checkpoint(tmp_path, monkeypatch):
    """keep_checkpoints=1 and a save every update, in the background: from the first publication on, every
    moment the training or a writer looks, a complete checkpoint is there (the previous is removed only after
    the next is published)."""
    real, looks = files._write, []

    def look(*_):
        looks.append(published(tmp_path))

    def write(obj, path):
        look()
        written = real(obj, path)
        look()
        return written

    monkeypatch.setattr(files, "_write", write)
    train(tmp_path, spying([], look), max_steps=8, checkpoint_every=1, keep_checkpoints=1)
    first = next(i for i, names in enumerate(looks) if names)
    assert all(len(names) >= 1 for names in looks[first:]), looks
    assert published(tmp_path) == ["step-000000008"]


def test_saves_that_stall_training_are_named_in_the_bottleneck(tmp_path, monkeypatch):
    real = files._write

    def slow(obj, path):
        time.sleep(0.1)
        return real(obj, path)

    monkeypatch.setattr(files, "_write", slow)
    _, result = train(tmp_path / "sync", max_steps=8, checkpoint_every=1, checkpoint_async=False)
    assert result.bottleneck.startswith("checkpoint saves blocked training for "), result.bottleneck
    assert "checkpoint_async=True writes them in the background" in result.bottleneck
    _, result = train(tmp_path / "async", max_steps=8, checkpoint_every=1)
    assert "save(s) waited" in result.bottleneck and "lengthen checkpoint_every" in result.bottleneck
    monkeypatch.undo()
    _, result = train(tmp_path / "rare", max_steps=8)  # one save, at the end
    assert "checkpoint" not in result.bottleneck, result.bottleneck


@pytest.mark.parametrize("background", [True, False])
def test_the_runs_last_save_however_slow_is_no_stall_named_in_the_bottleneck(tmp_path, monkeypatch, background):
    """A run that saves only at its end (0.3 s a file there): that save ends the run whatever the interval, so
    ``result.bottleneck`` tells no one to save less often (it did, on a loop as short as the save, now and then)."""
    real = files._write
    monkeypatch.setattr(files, "_write", lambda obj, path: time.sleep(0.3) or real(obj, path))
    _, result = train(tmp_path, max_steps=8, checkpoint_async=background)
    assert published(tmp_path) == ["step-000000008"]
    assert "checkpoint" not in result.bottleneck and "save" not in result.bottleneck, result.bottleneck


def test_sigterm_during_a_background_save_finishes_it_then_saves_the_final_state(tmp_path, monkeypatch):
    """SIGTERM arrives in update 5 while the save of 3 is held in its writes (released half a second later): the
    run waits for that save, publishes it, saves 5 and stops, pre-empted; resumed, it ends as the straight run."""
    gate, real, order = threading.Event(), files._write, []

    def held(obj, path):
        if path.parent.name == ".step-000000003.tmp":
            assert gate.wait(60)
        order.append(path.parent.name)
        return real(obj, path)

    monkeypatch.setattr(files, "_write", held)

    def preempt(n):
        if n == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # ct.run's handler: stop after this update
            threading.Timer(0.5, gate.set).start()

    _, result = train(tmp_path, spying([], preempt), max_steps=12, checkpoint_every=3, keep_checkpoints=3)
    assert result.preempted and result.steps == 5 and result.checkpoint == tmp_path / "step-000000005"
    assert published(tmp_path) == ["step-000000003", "step-000000005"] and not temporary(tmp_path)
    assert order == [".step-000000003.tmp"] * 2 + [".step-000000005.tmp"] * 2  # the flush first, then the last
    assert latest(tmp_path) == "step-000000005"
    resumed, _ = train(tmp_path, max_steps=12, checkpoint_every=3, keep_checkpoints=3)
    straight, _ = train(tmp_path / "straight", max_steps=12, checkpoint_every=3)
    assert_states_equal(resumed, straight)


def test_two_ranks_publish_a_save_only_once_both_wrote_it_and_both_stop_on_one_full_disk(pool, tmp_path):
    """Rank 1's writes of the save of 2 are held until its update 4: rank 0, its own writes over, still sees
    nothing published in updates 3 and 4. Then rank 1's disk fills in the save of 4: both ranks raise the
    error (naming rank 1), step 2 stays the newest, nothing of 4 is left."""
    a, b = pool.run(__name__, "rank_1_slow", str(tmp_path / "slow"))
    assert a["seen"][3] == a["seen"][4] == ([], [".step-000000002.tmp"])
    assert a["seen"][5][0] == ["step-000000002"] and a["saved"] == b["saved"] == ["step-000000004", "step-000000006"]
    errors = pool.run(__name__, "rank_1_full", str(tmp_path / "full"))
    assert all(e.startswith("OSError: [Errno 28] run: no space left in ") for e in errors), errors
    assert all("for checkpoint step 4" in e and "on rank 1" in e for e in errors), errors
    assert all("the previous checkpoint step-000000002 is intact" in e for e in errors), errors
    assert published(tmp_path / "full") == ["step-000000002"] and not temporary(tmp_path / "full")


@pytest.mark.parametrize("rank_1", ["written", "died mid-write", "out of space", "died, a long timeout"])
def test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it(
    pool, tmp_path, rank_1
):
    """Both ranks begin the save of 4 (2 published), then fail with no collective between them (as when one rank
    raises alone and the other finds it gone): each waits for its own writes, and rank 0 publishes the save of 4
    once rank 1's part is written (rank 1's writes held 0.5 s past the failure), as a synchronous save would have
    been, its files those of the state of 4. When rank 1 never finishes its part (its writer stuck, as in a rank
    that died), rank 0 gives up after ``timeout`` (2 s); when rank 1's writes fail (a full disk), rank 0 learns it
    from rank 1's mark and gives up at once (``timeout`` 20 s: not waited). Then step 2 stays the newest
    (keep_checkpoints=1: pruned only once 4 is published). With a long ``timeout`` (60 s) rank 0 waits no longer
    than ``MARKS_GRACE`` (1 s here) plus four times what the save took on it: rank 1's part, held 8 s, is not waited
    for (a dead rank's wait would hold the job's restart for the whole timeout: 300 s by default)."""
    out = pool.run(__name__, "fail_with_a_save_in_flight", str(tmp_path), rank_1)
    assert out[0]["abandoned"] == (rank_1 != "written")
    if rank_1 == "died mid-write":  # waited its timeout, no longer
        assert 1.9 <= out[0]["seconds"] < 5, out
    elif rank_1 == "died, a long timeout":  # the grace and four times the save's own time, not the 60 s
        assert out[0]["seconds"] < 6, out
    else:  # out of space: told by rank 1's mark, not its 20 s timeout
        assert out[0]["seconds"] < 10, out
    if rank_1 == "written":
        assert published(tmp_path) == ["step-000000004"] and not temporary(tmp_path)  # keep=1: 2 pruned
        path = tmp_path / "step-000000004"
        for name in ("state.pt", "rank-0.pt", "rank-1.pt"):  # each the part of 4 its rank wrote, as listed
            assert torch.load(path / name, weights_only=True)["n"] == 4
            assert files.mismatch(path, name, files.read_sums(path)[0]) is None
        sums = json.loads((path / "checksums.json").read_text())["sha256"]
        assert sorted(sums) == ["rank-0.pt", "rank-1.pt", "state.pt"]  # the marks removed, no file of it
        assert sorted(p.name for p in path.iterdir()) == ["checksums.json", "rank-0.pt", "rank-1.pt", "state.pt"]
    else:
        assert published(tmp_path) == ["step-000000002"]


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------


def two_ranks(directory, step, before_write):
    """ct.run of distributed(step) on this rank, files._write wrapped by ``before_write(path)``."""
    real = files._write

    def write(obj, path):
        before_write(path)
        return real(obj, path)

    files._write = write
    try:
        return ct.run(
            ct.distributed(step),
            run_script.state(),
            run_script.dataset(),
            checkpoint_dir=directory,
            max_steps=6,
            checkpoint_every=2,
            **OPTIONS,
        )
    finally:
        files._write = real


def rank_1_slow(rank, world, directory):
    folder, gate, seen = Path(directory), threading.Event(), {}

    def look(n):
        if rank == 0 and n == 3:
            while any(t.name.startswith("checkpoint step") for t in threading.enumerate()):
                time.sleep(0.01)  # rank 0's own writes of the save of 2 are over
        seen[n] = (published(folder), temporary(folder))
        if rank == 1 and n == 4:
            gate.set()

    def hold(path):
        if rank == 1 and path.parent.name == ".step-000000002.tmp":
            assert gate.wait(60)

    result = two_ranks(directory, spying([], look), hold)
    return {"seen": seen, "saved": published(folder), "checkpoint": result.checkpoint.name}


def rank_1_full(rank, world, directory):
    def full(path):
        if rank == 1 and path.parent.name == ".step-000000004.tmp":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    try:
        two_ranks(directory, run_script.step, full)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def fail_with_a_save_in_flight(rank, world, directory, rank_1):
    state, gate, real = run_script.state(), threading.Event(), files._write

    def held(obj, path):
        if rank == 1 and path.parent.name == ".step-000000004.tmp":
            if rank_1 == "out of space":
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            gate.wait(None if rank_1 == "written" else 8 if rank_1 == "died, a long timeout" else 6)  # never set
            # when it dies: stuck past rank 0's timeout (or its grace)
        return real(obj, path)

    files._write = held
    timeout = {"died mid-write": 2, "died, a long timeout": 60}.get(rank_1, 20)
    grace, files.MARKS_GRACE = files.MARKS_GRACE, 1.0 if rank_1 == "died, a long timeout" else files.MARKS_GRACE
    checkpoints = files.Checkpoints(directory, rank=rank, world_size=world, keep=1, timeout=timeout)
    try:
        shared, local = payload(state, 2)
        checkpoints.save(2, shared if rank == 0 else {}, local)
        shared, local = payload(state, 4)
        checkpoints.save_async(4, shared if rank == 0 else {}, local)
        if rank_1 == "written":
            threading.Timer(0.5, gate.set).start()
        started = time.monotonic()
        checkpoints.close()  # the run failed: no collective from here on
        return {
            "abandoned": checkpoints.newest is None or checkpoints.newest.name != "step-000000004",
            "seconds": time.monotonic() - started,
        }
    finally:
        if rank_1 == "written":
            gate.set()
        for t in threading.enumerate():
            if t.name.startswith("checkpoint step"):
                t.join(30)
        files._write, files.MARKS_GRACE = real, grace

"""The checkpoint folder: one run at a time (a lock that dies with its holder), only canonical
``step-<9 digits>`` folders are checkpoints (ordered by number), foreign files are left alone, files
that are not regular files are never opened, a full disk says so, ``~`` is expanded, and a
checkpoint of another number of processes is refused and kept."""

import errno
import os
import re
import shutil
import signal
import threading
import time
import warnings
from pathlib import Path

import pytest
import run_script
import torch
from helpers import assert_states_equal, reseal
from processes import wait_for
from run_script import finish, launch, train

import composetrain as ct
from composetrain.checkpoint import files as checkpoint


def checkpoints(directory, **options):
    return checkpoint.Checkpoints(directory, rank=0, world_size=1, keep=2, **options)


def latest(directory):
    found = checkpoints(directory)
    try:
        return found.latest()
    finally:
        found.close()


# -- one run at a time --------------------------------------------------------------------------
def test_a_second_holder_of_the_folder_is_refused_until_the_first_closes(tmp_path):
    first = checkpoints(tmp_path)
    with pytest.raises(RuntimeError, match=rf"run: checkpoint_dir '{tmp_path}' is in use by another run \(pid "):
        checkpoints(tmp_path)
    first.close()
    checkpoints(tmp_path).close()  # released: the next run may start


def test_a_second_run_is_refused_quickly_and_the_first_finishes_untouched(tmp_path):
    straight, _ = train(tmp_path / "straight", epochs=3)
    job = ["--dir", str(tmp_path / "job"), "--out", str(tmp_path / "job.pt"), "--epochs", "3"]
    metrics, hold, lock = tmp_path / "job" / "metrics.jsonl", tmp_path / "hold", tmp_path / "job" / ".lock-rank-0"
    hold.touch()  # the first run waits in its first step until the second was refused (it could end first)
    with launch(*job, "--hold", str(hold)) as first:
        wait_for(lambda: lock.exists() and lock.read_text().startswith("pid "))  # it holds the folder
        started = time.monotonic()
        code, out = finish(launch(*job, "--checkpoint-every", "1"))
        assert code != 0 and "is in use by another run (pid " in out, out
        assert time.monotonic() - started < 60
        assert first.poll() is None, "the first run had ended before the second was refused: nothing was tested"
        hold.unlink()
        code, out = finish(first)
    assert code == 0 and "DONE" in out, out
    saved = torch.load(tmp_path / "job-rank0.pt", weights_only=False)
    for k, v in saved["state"]["model"].items():
        assert torch.equal(v, straight.state_dict()["model"][k]), k
    assert len(metrics.read_text().splitlines()) == 3 * 8 // 4  # logged every 4 updates, by one run only
    assert sorted(p.name for p in (tmp_path / "job").glob("*step-*")) == ["step-000000016", "step-000000024"]


def test_a_killed_holder_releases_the_folder(tmp_path):
    job = ["--dir", str(tmp_path / "job"), "--out", str(tmp_path / "job.pt"), "--epochs", "3"]
    metrics = tmp_path / "job" / "metrics.jsonl"
    with launch(*job, "--step-delay", "0.1") as first:
        wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0)
        first.send_signal(signal.SIGKILL)
        first.wait()
    code, out = finish(launch(*job))
    assert code == 0 and "DONE" in out, out


def test_a_refused_run_deletes_no_temporary_folder_of_the_live_one(tmp_path):
    """A live run's temporary save folder is never deleted by a run that is refused."""
    holder = checkpoints(tmp_path)
    live = tmp_path / ".step-000000007.tmp"
    live.mkdir()
    with pytest.raises(RuntimeError, match="in use by another run"):
        checkpoints(tmp_path)
    assert live.is_dir()
    holder.close()
    checkpoints(tmp_path).close()  # the folder's own run: a crashed save's leftover goes
    assert not live.exists()


# -- canonical names ------------------------------------------------------------------------------
def test_a_folder_named_by_hand_is_ignored_with_a_message_and_never_loaded(tmp_path):
    straight, _ = train(tmp_path / "straight", epochs=3)
    run = tmp_path / "run"
    train(run, max_steps=5)
    shutil.copytree(run / "step-000000005", run / "step-5")  # a copy the user made and named
    shutil.copytree(run / "step-000000005", run / "step-00000005")  # 8 digits
    shutil.copytree(run / "step-000000005", run / "step-\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0665")
    train(run, epochs=2)
    with pytest.warns(UserWarning, match=r"run: ignoring .*step-5.*not a checkpoint name"):
        resumed, result = train(run, epochs=3)
    assert_states_equal(resumed, straight)
    assert result.steps == 24
    for name in ("step-5", "step-00000005"):
        assert (run / name / "state.pt").is_file()  # left as it was, never renamed


def test_a_step_name_with_a_spare_leading_zero_is_the_users_and_never_pruned(tmp_path):
    """step-0000000005 (10 digits: save() names step 5 with 9) is no checkpoint: named in a warning, and
    neither loaded nor pruned when newer checkpoints replace the one of step 5."""
    train(tmp_path, max_steps=5)
    shutil.copytree(tmp_path / "step-000000005", tmp_path / "step-0000000005")
    with pytest.warns(UserWarning, match=r"run: ignoring .*step-0000000005.*not a checkpoint name"):
        train(tmp_path, max_steps=8, checkpoint_every=1, keep_checkpoints=1)
    assert {p.name for p in tmp_path.glob("step-*")} == {"step-000000008", "step-0000000005"}
    assert (tmp_path / "step-0000000005" / "state.pt").is_file()


def test_checkpoints_are_ordered_by_number(tmp_path):
    train(tmp_path, max_steps=3)
    found = latest(tmp_path)
    assert found is not None and found[0].name == "step-000000003"
    # a step past 999,999,999 has 10 digits: canonical, and newer than any 9-digit one
    for step in (999999999, 1000000000):
        folder = tmp_path / f"step-{step:09d}"
        shutil.copytree(tmp_path / "step-000000003", folder)
        saved = torch.load(folder / "state.pt", weights_only=False)
        saved["state"]["step"] = step
        torch.save(saved, folder / "state.pt")
        reseal(folder)
    found = latest(tmp_path)
    assert found is not None and found[0].name == "step-1000000000"


def test_foreign_files_named_like_checkpoints_are_left_alone(tmp_path):
    mine = tmp_path / "step-000000009"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    (tmp_path / "step-000000007").write_text("a file")
    (tmp_path / ".step-notes").write_text("hidden")
    with pytest.warns(UserWarning, match=r"run: leaving .*step-000000009 alone: it holds no state.pt"):
        train(tmp_path, max_steps=6, checkpoint_every=1, keep_checkpoints=1)
    assert (mine / "notes.txt").read_text() == "my notes"  # neither renamed, nor pruned
    assert (tmp_path / "step-000000007").read_text() == "a file"
    assert (tmp_path / ".step-notes").read_text() == "hidden"
    assert not list(tmp_path.glob("corrupt-*"))
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000006", "step-000000007", "step-000000009"]


def test_a_save_onto_a_foreign_folder_is_refused_and_the_folder_kept(tmp_path):
    mine = tmp_path / "step-000000002"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    # refused at the start, not at the save of step 2 (test_a_folder_without_state_pt_where_the_run_saves...)
    expected = r"run: .*step-000000002 is named as the checkpoint of step 2, which this run saves, but it is no"
    with pytest.warns(UserWarning, match="leaving"), pytest.raises(FileExistsError, match=expected):
        train(tmp_path, max_steps=6, checkpoint_every=1)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "my notes"
    assert not list(tmp_path.glob(".step-*")) and not list(tmp_path.glob("corrupt-*"))


# -- files that cannot be read ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["state.pt", "rank-0.pt"])
def test_a_fifo_in_place_of_a_file_is_never_opened(tmp_path, name):
    train(tmp_path, max_steps=3)
    train(tmp_path, max_steps=6)
    fifo = tmp_path / "step-000000006" / name
    fifo.unlink()
    os.mkfifo(fifo)
    found = []

    def look():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found.append((latest(tmp_path), [str(w.message) for w in caught]))

    looking = threading.Thread(target=look, daemon=True)
    looking.start()
    looking.join(30)
    if looking.is_alive():  # opened the FIFO and waits for a writer: give it one, and fail
        with open(os.open(fifo, os.O_WRONLY), "wb"):
            pass
        looking.join(30)
        pytest.fail(f"latest() opened the FIFO {name} and waited for a writer")
    (path, _, _), messages = found[0]
    assert path.name == "step-000000003"
    assert any(f"{name} is a FIFO, not a regular file" in m for m in messages), messages


# -- a full disk ---------------------------------------------------------------------------------
def test_a_full_disk_during_a_save_says_so_and_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    train(tmp_path, max_steps=3)
    real = torch.save

    def full(obj, f, *args, **kwargs):
        if hasattr(f, "write") and str(tmp_path) in str(getattr(f, "name", "")):
            f.write(b"PK\x03\x04 part of it")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match=r"run: no space left .* checkpoint step 6 .*") as caught:
        train(tmp_path, max_steps=6)
    monkeypatch.undo()
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    size = re.search(r"writing about (\d+(?:\.\d)?) (bytes|KB|MB|GB)", message)
    assert str(tmp_path) in message and size, message
    weights = sum(v.nelement() * v.element_size() for v in run_script.state().model.state_dict().values())
    scale = {"bytes": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[size[2]]
    assert 2 * weights <= float(size[1]) * scale < 100 * weights, message  # weights and momentum, at least
    assert "step-000000003 is intact" in message, message
    assert sorted(p.name for p in tmp_path.iterdir() if "step" in p.name) == ["step-000000003"]
    found = latest(tmp_path)
    assert found is not None and found[0].name == "step-000000003"


# -- the folder's name -------------------------------------------------------------------------------
def test_a_home_relative_folder_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    train("~/run", max_steps=2)
    assert (tmp_path / "home" / "run" / "step-000000002" / "state.pt").is_file()
    assert (tmp_path / "home" / "run" / "metrics.jsonl").is_file()
    assert not (tmp_path / "cwd" / "~").exists()


# -- another number of processes --------------------------------------------------------------------
def test_a_checkpoint_of_two_processes_is_refused_in_one_and_kept(tmp_path):
    train(tmp_path, epochs=1)
    step = tmp_path / "step-000000008"
    saved = torch.load(step / "state.pt", weights_only=False)
    torch.save({**saved, "world_size": 2, "data_shards": [0, 1]}, step / "state.pt")  # as 2 processes write it
    shutil.copy(step / "rank-0.pt", step / "rank-1.pt")
    reseal(step)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(
        ValueError, match=r"run: checkpoint .*step-000000008 was saved by 2 process\(es\), this run has 1"
    ):
        train(tmp_path, epochs=2)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_two_ranks_share_the_folder_and_are_refused_together(pool, tmp_path):
    """Ranks of one run hold their own lock files; when another run holds rank 0's, every rank is
    refused (none waits in a collective for the refused one)."""
    assert pool.run(__name__, "run_in", str(tmp_path / "a"), timeout=120) == ["no error"] * 2
    holder = checkpoints(tmp_path / "a")
    try:
        messages = pool.run(__name__, "run_in", str(tmp_path / "a"), timeout=120)
    finally:
        holder.close()
    assert "in use by another run (pid " in messages[0], messages
    assert "in use by another run (seen by another rank)" in messages[1], messages


def test_a_checkpoint_of_one_process_is_refused_on_two_and_kept(pool, tmp_path):
    train(tmp_path, max_steps=3)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if ".lock" not in p.name)
    messages = pool.run(__name__, "run_in", str(tmp_path), timeout=120)
    expected = "checkpoint .*step-000000003 was saved by 1 process\\(es\\), this run has 2"
    assert all(re.search(expected, m) for m in messages), messages
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if ".lock" not in p.name) == before


def test_state_is_untouched_by_a_refused_run(tmp_path):
    holder = checkpoints(tmp_path)
    state = run_script.state()
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    try:
        with pytest.raises(RuntimeError, match="in use by another run"):
            run_script.run_plain(state, checkpoint_dir=tmp_path)
    finally:
        holder.close()
    assert all(torch.equal(v, before[k]) for k, v in state.model.state_dict().items())
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_really_full_disk_says_so_and_leaves_the_previous_checkpoint(tiny_disk):
    found = checkpoints(tiny_disk)
    try:
        small = {"state": {"w": torch.zeros(1000, dtype=torch.float64)}}
        found.save(1, small, {"window": []})
        big = {"state": {"w": torch.zeros(200_000, dtype=torch.float64)}}  # 1.5 MiB: more than the disk
        with pytest.raises(OSError, match=r"run: no space left in .* for checkpoint step 2 \(writing about 1.5 MB"):
            found.save(2, big, {"window": []})
    finally:
        found.close()
    assert sorted(p.name for p in tiny_disk.iterdir() if "step" in p.name) == ["step-000000001"]
    assert torch.equal(torch.load(tiny_disk / "step-000000001" / "state.pt")["state"]["w"], small["state"]["w"])
    assert os.statvfs(tiny_disk).f_bfree * os.statvfs(tiny_disk).f_frsize > 900_000  # the space is back


def test_a_really_full_disk_in_a_background_save_stops_the_run_and_a_rerun_ends_as_a_plain_loop(tiny_disk, tmp_path):
    """ct.run, saving in the background (the default) into a 1 MiB disk a state of 577 KB every 2 updates with
    keep_checkpoints=1: the save of 2 fits, the save of 4 (written while 2 is still there) runs out of space in
    its writer thread. The run stops with the error, 2 the newest, nothing of 4 left and its space back; moved to a
    roomier folder, the run resumes and ends equal to a plain PyTorch loop over the same batches."""
    d = run_script.dataset()

    def wide():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 4000), torch.nn.ReLU(), torch.nn.Linear(4000, 2)).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return ct.TrainState(model, optimizer)

    def step(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    options = {"batch_size": 12, "shuffle": False, "num_workers": 0, "progress": False, "checkpoint_every": 2}
    with pytest.raises(OSError, match=r"run: no space left in .* for checkpoint step 4 \(writing about 57") as e:
        ct.run(step, wide(), d, checkpoint_dir=tiny_disk / "run", max_steps=12, keep_checkpoints=1, **options)
    assert e.value.errno == errno.ENOSPC and "the previous checkpoint step-000000002 is intact" in str(e.value)
    assert sorted(p.name for p in (tiny_disk / "run").iterdir() if "step" in p.name) == ["step-000000002"]
    assert os.statvfs(tiny_disk).f_bfree * os.statvfs(tiny_disk).f_frsize > 350_000  # the space is back
    shutil.copytree(tiny_disk / "run", tmp_path / "roomy", ignore=shutil.ignore_patterns(".lock-*"))
    resumed = wide()
    ct.run(step, resumed, d, checkpoint_dir=tmp_path / "roomy", max_steps=12, **options)
    plain = wide()
    for i in range(12):
        x, y = d[i * 12 % 96 : i * 12 % 96 + 12]
        step(plain.model, (x, y)).backward()
        plain.optimizer.step()
        plain.optimizer.zero_grad(set_to_none=True)
    for a, b in zip(resumed.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("lost", ["state.pt", None])
def test_a_folder_without_state_pt_where_the_run_saves_is_refused_before_training(tmp_path, lost):
    """The newest checkpoint lost its state.pt (or a folder of the user's has the name of a step the run saves at):
    refused at the start, before the epoch of training that the save there would have cost; nothing changes."""
    train(tmp_path, epochs=1)  # saved at 8
    if lost:
        train(tmp_path, epochs=2)  # saved at 16
        (tmp_path / "step-000000016" / lost).unlink()
    else:
        (tmp_path / "step-000000016").mkdir()
    calls = []

    def counted(model, batch):
        calls.append(1)
        return run_script.step(model, batch)

    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "metrics" not in p.name)
    refused = (
        r"run: .*step-000000016 is named as the checkpoint of step 16, which this run saves, but it is no checkpoint "
        r"\(a folder without state\.pt\)"
    )
    warned = r"step-000000016 alone: it holds no state\.pt, so it is no checkpoint"
    with pytest.raises(FileExistsError, match=refused), pytest.warns(UserWarning, match=warned):
        ct.run(
            ct.accumulate(2)(counted),
            run_script.state(),
            run_script.dataset(),
            checkpoint_dir=tmp_path,
            batch_size=12,
            num_workers=0,
            progress=False,
            seed=5,
            epochs=3,
        )
    assert calls == []
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "metrics" not in p.name) == before


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.run on one checkpoint folder from every rank.


def run_in(rank, world, folder):
    """ct.run on ``folder`` on every rank: the error each rank raised, as text, or "no error"."""
    try:
        run_script.run_distributed(checkpoint_dir=Path(folder), max_steps=2)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


# -- hostile or odd contents: lock files that are links or unusable, crashes between renames, unreadable files --------


def test_a_lock_file_linked_to_a_file_elsewhere_is_never_written_through(tmp_path):
    folder, victim = tmp_path / "run", tmp_path / "notes.txt"
    folder.mkdir()
    victim.write_text("precious")
    os.symlink(victim, folder / ".lock-rank-0")
    with pytest.raises(RuntimeError, match=r"run: cannot lock checkpoint_dir .*\.lock-rank-0 is a symbolic link"):
        checkpoints(folder)
    assert victim.read_text() == "precious"


def test_a_dangling_lock_link_creates_nothing_where_it_points(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    os.symlink(tmp_path / "elsewhere", folder / ".lock-rank-0")
    with pytest.raises(RuntimeError, match=r"run: cannot lock checkpoint_dir .*is a symbolic link; remove it"):
        checkpoints(folder)
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_an_unusable_lock_file_is_not_called_another_run(tmp_path, kind):
    lock = tmp_path / ".lock-rank-0"
    {"folder": lock.mkdir, "fifo": lambda: os.mkfifo(lock), "device": lambda: os.symlink("/dev/zero", lock)}[kind]()
    with pytest.raises(RuntimeError, match=r"run: cannot lock checkpoint_dir .*\.lock-rank-0 .*remove it") as caught:
        checkpoints(tmp_path)
    assert "another run" not in str(caught.value)


def test_a_crash_between_the_two_renames_of_a_resave_keeps_the_checkpoint(tmp_path, monkeypatch):
    """A save at a step already saved (a skipped update) moves the old folder to ``.step-N.old`` before
    renaming the new one into place; a crash between the two left only ``.old``, which the next run
    deleted as a leftover: with keep_checkpoints=1 the run started over from scratch."""
    found = checkpoints(tmp_path)
    found.keep = 1
    weights = {"state": {"w": torch.arange(4.0)}}
    found.save(3, weights, {"window": []})
    real = os.replace

    def crash_after_first(src, dst):
        real(src, dst)
        if str(dst).endswith(".old"):
            raise KeyboardInterrupt  # the process dies here (SIGKILL, a power cut)

    monkeypatch.setattr(checkpoint.os, "replace", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        found.save(3, {"state": {"w": torch.zeros(4)}}, {"window": []})
    monkeypatch.undo()
    found.close()
    again = checkpoints(tmp_path)
    try:
        assert (tmp_path / "step-000000003" / "state.pt").is_file(), sorted(os.listdir(tmp_path))
        assert torch.equal(torch.load(tmp_path / "step-000000003" / "state.pt")["state"]["w"], torch.arange(4.0))
    finally:
        again.close()
    assert not list(tmp_path.glob(".step-*"))


def _without_root_powers():
    """Whether this process obeys file permissions (root does not, unless it dropped CAP_DAC_OVERRIDE)."""
    import subprocess

    return os.geteuid() != 0 or subprocess.run(["setpriv", "--version"], capture_output=True).returncode == 0


SCRIPT = """
import sys, warnings
sys.path.insert(0, {tests!r})
from run_script import train
try:
    train({folder!r}, epochs=1)
    print("RESUMED OR RESTARTED")
except PermissionError as e:
    print("REFUSED", e)
"""


@pytest.mark.parametrize("what", ["state.pt", "rank-0.pt", "folder"])
def test_a_checkpoint_this_user_cannot_read_is_refused_not_set_aside(tmp_path, what):
    """A sound checkpoint that the run lacks the permission to read (a shared folder, files of another
    user) was called corrupt and moved aside, or ignored as a folder with no state.pt: the run started
    over. It is refused, and left as it was, until the permissions are fixed."""
    import subprocess
    import sys

    if not _without_root_powers():
        pytest.skip("needs setpriv to drop root's permission override")

    train(tmp_path, max_steps=3)
    target = tmp_path / "step-000000003" / (what if what != "folder" else "")
    before = sorted(p.name for p in tmp_path.iterdir())
    target.chmod(0)
    try:
        code = SCRIPT.format(tests=os.path.dirname(__file__), folder=str(tmp_path))
        command = [sys.executable, "-c", code]
        if os.geteuid() == 0:
            command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--", *command]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env).stdout
    finally:
        target.chmod(0o755 if what == "folder" else 0o644)
    assert "REFUSED" in out and "step-000000003" in out and "Permission denied" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_save_that_fails_on_one_rank_is_named_alike_on_every_rank(pool, tmp_path, code):
    """Rank 1's full disk was, on rank 0 (whose output one reads), 'another rank could not write its
    part' with no errno: a handler for ENOSPC missed it, and nobody learned why or where."""
    replies = pool.run(__name__, "save_fails_on", str(tmp_path), 1, code, timeout=120)
    for rank, (message, number) in enumerate(replies):
        assert number == code, (rank, replies)
        assert "rank 1" in message and "refused" in message and str(tmp_path) in message, (rank, replies)
        if code == errno.ENOSPC:
            assert "no space left" in message, (rank, replies)
    assert not list(tmp_path.glob("*step-*"))


@pytest.mark.parametrize(("folder", "error"), [(b"/tmp/run", TypeError), ("", ValueError), (7, TypeError)])
def test_a_checkpoint_dir_that_names_no_folder_is_refused_by_name(folder, error, tmp_path, monkeypatch):
    """bytes reached pathlib's bare TypeError; "" saved checkpoints in the working folder yet wrote no
    metrics file (``if checkpoint_dir`` is False for it): refused before anything is made."""
    monkeypatch.chdir(tmp_path)  # "" is the working folder: a regression writes there, not in the repository
    state = run_script.state()
    with pytest.raises(error, match=r"run: checkpoint_dir must be a non-empty str or os.PathLike, got "):
        ct.run(
            run_script.step,
            state,
            run_script.dataset(),
            batch_size=12,
            num_workers=0,
            progress=False,
            checkpoint_dir=folder,
        )
    assert state.step == 0 and not list(tmp_path.iterdir())


def test_a_crash_after_the_second_rename_of_a_resave_keeps_the_new_checkpoint(tmp_path, monkeypatch):
    """Both ``step-N`` (the new save) and ``.step-N.old`` are there: the old one goes, the new one stays."""
    found = checkpoints(tmp_path)
    found.save(3, {"state": {"w": torch.arange(4.0)}}, {"window": []})
    real = shutil.rmtree

    def crash_at_old(path, *args, **kwargs):
        if str(path).endswith(".old"):
            raise KeyboardInterrupt  # the process dies here
        real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", crash_at_old)
    with pytest.raises(KeyboardInterrupt):
        found.save(3, {"state": {"w": torch.zeros(4)}}, {"window": []})
    monkeypatch.undo()
    found.close()
    assert (tmp_path / ".step-000000003.old").is_dir()
    checkpoints(tmp_path).close()
    assert not list(tmp_path.glob(".step-*"))
    assert torch.equal(torch.load(tmp_path / "step-000000003" / "state.pt")["state"]["w"], torch.zeros(4))


def test_a_checkpoint_one_rank_may_not_read_is_refused_on_every_rank(pool, tmp_path):
    replies = pool.run(__name__, "read_denied_on", str(tmp_path), 1, timeout=120)
    assert "cannot read checkpoint" in replies[0] and "on another rank" in replies[0], replies
    assert "cannot read checkpoint" in replies[1] and "rank-1.pt" in replies[1], replies
    assert sorted(p.name for p in tmp_path.iterdir() if "step" in p.name) == ["step-000000002"]


def test_a_save_that_fails_otherwise_on_one_rank_names_that_rank_on_the_others(pool, tmp_path):
    replies = pool.run(__name__, "save_fails_on", str(tmp_path), 1, None, timeout=120)
    assert "checkpoint step 2 was not saved: rank 1 could not write its part" in replies[0][0], replies
    assert replies[1][0] == "RuntimeError: odd", replies


def test_a_save_onto_a_link_named_like_a_checkpoint_says_it_is_a_link(tmp_path):
    """The refusal said 'it holds no state.pt' of a link to a folder that holds one."""
    elsewhere = tmp_path / "elsewhere"
    found = checkpoints(elsewhere)
    found.save(4, {"state": {"w": torch.zeros(2)}}, {"window": []})
    found.close()
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(elsewhere / "step-000000004", run / "step-000000004")
    found = checkpoints(run)
    try:
        with pytest.raises(FileExistsError, match=r"step-000000004 exists and is not a checkpoint \(it is a link"):
            found.save(4, {"state": {"w": torch.ones(2)}}, {"window": []})
    finally:
        found.close()
    assert torch.equal(torch.load(elsewhere / "step-000000004" / "state.pt")["state"]["w"], torch.zeros(2))


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.run's saves and loads failing on one rank.


def save_fails_on(rank, world, folder, bad_rank, code):
    """ct.run on ``folder``, where ``bad_rank``'s writes fail with OSError ``code``: (error text, errno)."""
    real = checkpoint._write

    def failing(obj, path):
        if rank == bad_rank and code is None:
            raise RuntimeError("odd")
        if rank == bad_rank:
            raise OSError(code, "refused", str(path))
        return real(obj, path)

    checkpoint._write = failing
    try:
        run_script.run_distributed(checkpoint_dir=Path(folder), max_steps=2)
    except OSError as e:
        return str(e), e.errno
    except RuntimeError as e:
        return f"RuntimeError: {e}", None
    finally:
        checkpoint._write = real
    return "no error", None


def read_denied_on(rank, world, folder, bad_rank):
    """ct.run twice on ``folder``; the second's ``bad_rank`` may not read its rank file: the error text."""
    import torch

    def run():
        run_script.run_distributed(checkpoint_dir=Path(folder), max_steps=2)

    run()
    real = torch.load

    def denied(path, *args, **kwargs):
        if rank == bad_rank and str(path).endswith(f"rank-{rank}.pt"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    torch.load = denied
    try:
        run()
    except PermissionError as e:
        return str(e)
    finally:
        torch.load = real
    return "no error"

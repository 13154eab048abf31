"""The checkpoint folder against hostile or odd contents: a lock file that is a link (never followed,
never written through), a lock file that cannot be used (not called "in use by another run")."""

import errno
import os
import shutil

import pytest
import torch

from composetrain.checkpoint import files as checkpoint


def checkpoints(directory):
    return checkpoint.Checkpoints(directory, rank=0, world_size=1, keep=2)


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
    from run_script import train

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
    replies = pool.run("checkpoint_hostile_workers", "save_fails_on", str(tmp_path), 1, code, timeout=120)
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
    import run_script

    import composetrain as ct

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
    replies = pool.run("checkpoint_hostile_workers", "read_denied_on", str(tmp_path), 1, timeout=120)
    assert "cannot read checkpoint" in replies[0] and "on another rank" in replies[0], replies
    assert "cannot read checkpoint" in replies[1] and "rank-1.pt" in replies[1], replies
    assert sorted(p.name for p in tmp_path.iterdir() if "step" in p.name) == ["step-000000002"]


def test_a_save_that_fails_otherwise_on_one_rank_names_that_rank_on_the_others(pool, tmp_path):
    replies = pool.run("checkpoint_hostile_workers", "save_fails_on", str(tmp_path), 1, None, timeout=120)
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

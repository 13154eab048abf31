"""SIGKILL at every I/O step of a run's saves, two written in the background and the last by the training thread,
with keep_checkpoints=1, in a folder and in S3 (a real S3-compatible server, moto's): whatever step it dies at (a
file opened, written, synced, digested, the checksums, the rename; an upload, the marker; the removal of the
previous checkpoint), the newest checkpoint left is the last one published before it, complete and loadable without
a warning, and the run resumed from it ends as the uninterrupted run.

The kill points are enumerated, not sampled: the job runs once straight through, logging each I/O step
(``CT_CHECKPOINT_IO_LOG``), then once per step k, killed there (``CT_CHECKPOINT_KILL_AT=k``). One launched process
(this file, as a script) imports torch once and forks a child per run.
"""

import json
import os
import re
import signal
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import run_script
import torch

import composetrain as ct
from composetrain.checkpoint.background import KILL_AT, LOG
from composetrain.checkpoint.objects import open_checkpoints

HERE = Path(__file__).resolve().parent
OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 4, "checkpoint_async": True}
JOB = {"max_steps": 7, "checkpoint_every": 3, "keep_checkpoints": 1}  # saves 3, 6 (background), 7 (the last)


def job(directory):
    state = run_script.state()
    ct.run(run_script.step, state, run_script.dataset(), checkpoint_dir=directory, **JOB, **OPTIONS)
    return state


def latest(folder) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a corrupt checkpoint would be skipped with a warning
        checkpoints = open_checkpoints(folder, rank=0, world_size=1, keep=1)
        found = checkpoints.latest()
        checkpoints.close()
    return None if found is None else found[0].name


# the step that publishes a checkpoint: a folder's rename, an object store's marker
PUBLISHES = re.compile(r"(rename \S+|upload) (step-[0-9]+)(/checksums\.json)? \[")


@pytest.mark.parametrize("store", ["folder", "s3"])
def test_sigkill_at_every_io_step_of_the_saves_leaves_the_last_published_checkpoint(tmp_path, request, store):
    from processes import Job

    base, env = str(tmp_path), {}
    if store == "s3":
        server = request.getfixturevalue("s3")
        base, env = f"{server.bucket('kills')}/run", server.env
    command = [sys.executable, __file__, str(tmp_path), base]
    with Job(command, {**os.environ, "OMP_NUM_THREADS": "1", **env}) as launched:
        code, out = launched.finish(600)
    assert code == 0, out[-4000:]
    outcomes = json.loads((tmp_path / "outcomes.json").read_text())
    steps = [line.split(" ", 1)[1] for line in (tmp_path / "steps.log").read_text().splitlines()]
    assert len(outcomes) == len(steps) + 1, steps
    assert outcomes["0"] == "finished" and all(outcomes[str(k)] == "killed" for k in range(1, len(steps) + 1))
    background = [s for s in steps if s.endswith("[checkpoint step 3]") or s.endswith("[checkpoint step 6]")]
    # each of 2 files written (hashed as it goes) and synced by the writer thread; or uploaded
    assert len(background) == (8 if store == "folder" else 4), steps
    published = {k: m[2] for k, s in enumerate(steps, 1) if (m := PUBLISHES.match(s)) and (m[1] != "upload" or m[3])}
    assert list(published.values()) == ["step-000000003", "step-000000006", "step-000000007"], steps
    straight = job(tmp_path / "straight")
    for k in range(1, len(steps) + 1):
        folder = f"{base}/kill-{k}" if store == "s3" else tmp_path / f"kill-{k}"
        expected = max((name for at, name in published.items() if at < k), default=None)  # before it died
        assert latest(folder) == expected, f"killed at {k}: {steps[k - 1]}"
        resumed = job(folder)
        assert all(
            torch.equal(a, b)
            for a, b in zip(
                resumed.state_dict()["model"].values(), straight.state_dict()["model"].values(), strict=True
            )
        ), f"killed at {k}: {steps[k - 1]}"
        assert resumed.step == 7


def main():
    """One uninterrupted run logging its I/O steps, then one run killed at each; outcomes.json says how each
    child ended."""
    root, base = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    outcomes = {}

    def child(k):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.environ.update({KILL_AT: str(k)} if k else {LOG: str(root / "steps.log")})
                job(f"{base}/kill-{k}")
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        outcomes[str(k)] = "killed" if killed else "finished" if status == 0 else f"failed ({status})"

    child(0)
    for k in range(1, len((root / "steps.log").read_text().splitlines()) + 1):
        child(k)
    (root / "outcomes.json").write_text(json.dumps(outcomes))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()

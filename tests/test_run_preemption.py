"""ct.run as a launched process: killed (SIGKILL) during training or inside a save, signalled (SIGTERM, SIGUSR1,
SLURM's requeue) to save and exit, launched under torchrun on two ranks; each rerun continues bit-identically.
"""

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from processes import Job, free_port, wait_for
from run_script import finish, launch, untimed

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "run_script.py")


def final(path):
    return torch.load(path.with_name(f"{path.stem}-rank0{path.suffix}"), weights_only=False)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The job run straight through, launched once for every test here that compares a stopped and rerun job
    with it (the job is deterministic: one launch serves them all)."""
    tmp_path = tmp_path_factory.mktemp("straight")
    code, out = finish(
        launch("--dir", str(tmp_path / "straight"), "--out", str(tmp_path / "straight.pt"), "--epochs", "3")
    )
    assert code == 0, out
    return final(tmp_path / "straight.pt")


def assert_same_training(a, b):
    for k, v in a["state"]["model"].items():
        assert torch.equal(v, b["state"]["model"][k]), k
    assert a["state"]["step"] == b["state"]["step"] and untimed(a["history"]) == untimed(b["history"])


def job_args(tmp_path, *extra):
    """The resumable job of these tests: 3 epochs into tmp_path/job, its result in tmp_path/job.pt."""
    return ["--dir", str(tmp_path / "job"), "--out", str(tmp_path / "job.pt"), "--epochs", "3", *extra]


def test_sigkill_during_training_resumes_from_the_last_checkpoint_bit_identically(tmp_path, straight):
    job = job_args(tmp_path, "--checkpoint-every", "3")
    with launch(*job, "--step-delay", "0.05") as proc:
        wait_for(lambda: len(list((tmp_path / "job").glob("step-*"))) >= 2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    code, out = finish(launch(*job))
    assert code == 0, out
    assert_same_training(final(tmp_path / "job.pt"), straight)


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_valid(tmp_path, straight):
    job = job_args(tmp_path, "--checkpoint-every", "3")
    with launch(*job, "--slow-save", "3") as proc:  # hangs inside the second save, after its first file
        job_dir = tmp_path / "job"
        wait_for(lambda: list(job_dir.glob(".step-*.tmp")) and len(list(job_dir.glob("step-*"))) == 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    code, out = finish(launch(*job))
    assert code == 0, out
    assert not list((tmp_path / "job").glob(".step-*.tmp"))
    assert_same_training(final(tmp_path / "job.pt"), straight)


def logged(path):
    """Whether the run wrote its first record (ct.run creates the file earlier, when it checks it is writable)."""
    return path.exists() and path.stat().st_size > 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_sigterm_saves_and_exits_cleanly_and_a_rerun_continues(tmp_path, sig, straight):
    job = job_args(tmp_path)
    with launch(*job, "--step-delay", "0.05") as proc:
        wait_for(lambda: logged(tmp_path / "job" / "metrics.jsonl"))  # training began: the handlers are in place
        proc.send_signal(sig)
        code, out = finish(proc)
    assert code == 0 and "PREEMPTED" in out, out
    stopped = final(tmp_path / "job.pt")
    assert 0 < stopped["steps"] < 24
    assert (tmp_path / "job" / f"step-{stopped['steps']:09d}").is_dir()  # saved where it stopped
    code, out = finish(launch(*job))
    assert code == 0 and "DONE" in out, out
    assert_same_training(final(tmp_path / "job.pt"), straight)


def test_preemption_under_slurm_requeues_the_job(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "requeued"}\n')
    (fake / "scontrol").chmod(0o755)
    job = job_args(tmp_path, "--step-delay", "0.05")
    with launch(*job, env={"PATH": f"{fake}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}) as proc:
        wait_for(lambda: logged(tmp_path / "job" / "metrics.jsonl"))  # training began: the handlers are in place
        proc.send_signal(signal.SIGUSR1)
        code, out = finish(proc)
    assert code == 0, out
    assert (tmp_path / "requeued").read_text().strip() == "requeue 4242"


def test_two_ranks_under_torchrun_resume_bit_identically(tmp_path):
    def torchrun(*args):
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={port}",
            SCRIPT,
            *args,
        ]
        code, out = finish(Job(command, {**os.environ, "OMP_NUM_THREADS": "1"}), timeout=300)
        assert code == 0, out[-6000:]

    torchrun("--dir", str(tmp_path / "a"), "--out", str(tmp_path / "a.pt"), "--epochs", "2")
    torchrun("--dir", str(tmp_path / "b"), "--out", str(tmp_path / "b.pt"), "--max-steps", "3")
    torchrun("--dir", str(tmp_path / "b"), "--out", str(tmp_path / "b.pt"), "--epochs", "2")
    for rank in range(2):
        a = torch.load(tmp_path / f"a-rank{rank}.pt", weights_only=False)
        b = torch.load(tmp_path / f"b-rank{rank}.pt", weights_only=False)
        assert_same_training(a, b)
        assert a["state"]["step"] == 2 * 4
        assert a["threads_left"] in ([], None), "ct.run left the process group alive (its DDP wrapper?)"

"""ct.run on a real single-node SLURM cluster (tests/slurm_cluster.py): sbatch + srun, pre-emption and requeue,
scancel, and a time limit's warning signal. Skipped, with the reason, where the cluster cannot start (not root, or
SLURM not installed: .ci/run installs it when it runs as root with apt)."""

import sys
import time
from pathlib import Path

import pytest
import torch
from elastic_runs import assert_bit_identical
from slurm_cluster import SlurmCluster, unavailable

HERE = Path(__file__).resolve().parent
WHY = unavailable()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(WHY is not None, reason=str(WHY))]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield c
    finally:
        c.stop()


def submit(cluster, folder, name, *args, sbatch=""):
    """A 2-task batch job that runs elastic_job.py with srun (no torchrun), its checkpoints in folder/name."""
    script = f"""#!/bin/bash
#SBATCH --job-name=ct-{name}
#SBATCH --ntasks=2
#SBATCH --output={folder}/{name}.out
#SBATCH --open-mode=append
#SBATCH --requeue
{sbatch}
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
export OMP_NUM_THREADS=1
echo "start: restart ${{SLURM_RESTART_COUNT:-0}}"
srun {sys.executable} {HERE / "elastic_job.py"} --dir {folder / name} --out {folder / name}.pt {" ".join(args)}
"""
    return cluster.sbatch(script, name)


def results(folder, name):
    return [torch.load(folder / f"{name}-rank{r}.pt", weights_only=False) for r in range(2)]


def training_began(folder, name):
    path = folder / name / "metrics.jsonl"  # ct.run creates it early; its first record comes after 2 updates
    return path.exists() and path.stat().st_size > 0


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout}s")
        time.sleep(0.05)


def run_time(info):
    """scontrol's RunTime ([D-]HH:MM:SS) in seconds."""
    days, _, clock = info["RunTime"].rpartition("-")
    h, m, sec = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


# Jobs that mostly sleep are submitted first, by fixtures that the first test asks for: they run while the
# other tests do, and the module takes about as long as its longest job, not the sum.
@pytest.fixture(scope="session")
def time_limited(cluster, tmp_path_factory):
    """A job that would outlast its 2-minute limit, warned by SIGUSR1 60 s before (slurmctld checks limits every
    ~30 s: the signal comes 30 to 60 s after the start). Without requeueing, it saves and ends."""
    folder = tmp_path_factory.mktemp("limit")
    args = ("--step-delay", "5", "--no-requeue")
    return folder, submit(cluster, folder, "limit", *args, sbatch="#SBATCH --time=2 --signal=USR1@60")


@pytest.fixture(scope="session")
def to_cancel(cluster, tmp_path_factory):
    """A long job (4 s per micro-batch) for scancel to stop."""
    folder = tmp_path_factory.mktemp("cancel")
    return folder, submit(cluster, folder, "job", "--step-delay", "4")


def test_sbatch_and_srun_without_torchrun_train_as_torchrun_does(
    cluster, tmp_path, uninterrupted_elastic_job, time_limited, to_cancel
):
    job = submit(cluster, tmp_path, "job")
    info = cluster.wait(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=180)
    assert info["JobState"] == "COMPLETED", (tmp_path / "job.out").read_text()[-4000:]
    straight = results(tmp_path, "job")
    assert [(r["source"], r["restart"]) for r in straight] == [("slurm", "0")] * 2  # SLURM_PROCID, ... read
    assert straight[0]["steps"] == 12 and not straight[0]["preempted"]
    assert_bit_identical(straight, uninterrupted_elastic_job)  # the same training as under torchrun


def test_preemption_saves_requeues_and_the_rerun_ends_bit_identical(cluster, uninterrupted_elastic_job, tmp_path):
    job = submit(cluster, tmp_path, "job", "--step-delay", "0.2")
    wait_for(lambda: training_began(tmp_path, "job"), 120, "training")
    cluster.signal(job, "USR1")  # what a pre-empting scheduler sends first
    info = cluster.wait(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=180, restarts=1)
    out = (tmp_path / "job.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", out[-4000:]
    assert "start: restart 0" in out and "start: restart 1" in out  # --open-mode=append kept the first run's
    assert f"run: saved and requeued SLURM job {job}" in out
    resumed = results(tmp_path, "job")
    assert [r["restart"] for r in resumed] == ["1", "1"]
    assert_bit_identical(resumed, uninterrupted_elastic_job)


def test_scancel_saves_and_does_not_requeue(cluster, to_cancel):
    folder, job = to_cancel
    wait_for(lambda: training_began(folder, "job"), 120, "training")
    cluster.signal(job, "TERM")
    cluster.wait(job, ("CANCELLED", "COMPLETED", "FAILED"), timeout=60)
    time.sleep(3)  # a requeue would show by now
    info = cluster.job(job)
    assert info["Restarts"] == "0" and info["JobState"] == "CANCELLED", info
    stopped = results(folder, "job")
    assert all(r["preempted"] for r in stopped) and 0 < stopped[0]["steps"] < 12
    assert (folder / "job" / f"step-{stopped[0]['steps']:09d}").is_dir()  # saved where it stopped


def test_a_time_limit_warning_saves_before_the_kill(cluster, time_limited):
    folder, job = time_limited
    info = cluster.wait(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=240)
    out = (folder / "limit.out").read_text()
    assert info["JobState"] == "COMPLETED", out[-4000:]  # it ended itself, not the limit's kill (TIMEOUT)
    assert run_time(info) < 120, info
    stopped = results(folder, "limit")
    assert all(r["preempted"] for r in stopped) and 0 < stopped[0]["steps"] < 12
    assert (folder / "limit" / f"step-{stopped[0]['steps']:09d}").is_dir()
    assert "requeued" not in out  # --no-requeue: ct.run(requeue=False)

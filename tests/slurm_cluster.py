"""A real single-node SLURM cluster for the tests: munged, slurmctld and slurmd, started without systemd.

``SlurmCluster(folder)`` writes ``slurm.conf`` (state, spool, pid and log files under ``folder``), installs
it at the default path ``/etc/slurm/slurm.conf`` that the client commands read (the file there before is
put back on ``stop``), starts the daemons and waits until the node is idle. ``stop()`` cancels every job,
then ends the daemons it started by PID, each checked by its ``/proc/PID/comm`` name.

It needs root and the Debian packages ``slurmctld slurmd slurm-client munge`` (``.ci/run`` installs them
when it can); ``unavailable()`` says why it cannot run here, for a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["SlurmCluster", "unavailable"]

CONF = Path("/etc/slurm/slurm.conf")
LOCK = Path("/tmp/composetrain-slurm-tests.lock")  # one test cluster per machine at a time
PROGRAMS = (
    "munged",
    "munge",
    "unmunge",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "scancel",
    "sinfo",
    "squeue",
)


def unavailable() -> str | None:
    """Why a test cluster cannot start here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a SLURM test cluster needs root (its daemons run as root and it writes /etc/slurm/slurm.conf)"
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd "
            "slurm-client munge (.ci/run does it when it runs as root with apt)"
        )
    return None


def _run(*command: str, timeout: float = 30, check: bool = True) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}: {done.stdout}{done.stderr}")
    return done.stdout


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


class SlurmCluster:
    """A single-node SLURM cluster whose files all live in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.started: dict[str, int] = {}  # daemon name -> pid, of those this cluster started
        self.previous_conf: bytes | None = None
        self.lock = open(LOCK, "w")  # noqa: SIM115 - held until stop()
        deadline = time.monotonic() + 300
        while True:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.lock.close()
                    raise RuntimeError(f"another test cluster holds {LOCK} for more than 300 s") from None
                time.sleep(1)

    def conf(self) -> str:
        f = self.folder
        node = _run("slurmd", "-C").splitlines()[0].split()  # NodeName=vm CPUs=2 Boards=1 ...
        # 8 CPUs on 2 cores (config_overrides): three 2-task jobs side by side, two of them mostly asleep
        hardware = [w for w in node[1:] if not w.startswith(("CPUs=", "Boards=", "SocketsPerBoard="))]
        hardware = [w for w in hardware if not w.startswith(("CoresPerSocket=", "ThreadsPerCore="))]
        return "\n".join(
            [
                "ClusterName=composetrain",
                f"SlurmctldHost={self.host}(127.0.0.1)",
                "SlurmUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                "AuthInfo=cred_expire=5",  # a requeued job waits cred_expire before running again (120 s by default)
                "SchedulerParameters=sched_interval=2,batch_sched_delay=0",
                "MpiDefault=none",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ReturnToService=2",
                "MailProg=/bin/true",
                "SlurmdParameters=config_overrides",
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                "KillWait=10",
                "MinJobAge=600",  # finished jobs stay visible to scontrol for the tests
                # job ids (ct.rendezvous derives its port from them) away from other runs' on this machine
                f"FirstJobId={random.randrange(1000, 14000)}",
                f"StateSaveLocation={f / 'state'}",
                f"SlurmdSpoolDir={f / 'spool'}",
                f"SlurmctldPidFile={f / 'slurmctld.pid'}",
                f"SlurmdPidFile={f / 'slurmd.pid'}",
                f"SlurmctldLogFile={f / 'slurmctld.log'}",
                f"SlurmdLogFile={f / 'slurmd.log'}",
                f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 "
                f"ThreadsPerCore=1 {' '.join(hardware)} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def start(self) -> SlurmCluster:
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        text = self.conf()
        CONF.parent.mkdir(parents=True, exist_ok=True)
        if CONF.exists():
            self.previous_conf = CONF.read_bytes()
        (self.folder / "slurm.conf").write_text(text)
        CONF.write_text(text)
        try:
            self._start_munge()
            self._daemon("slurmctld", ["slurmctld", "-i"], self.folder / "slurmctld.pid")
            self._daemon("slurmd", ["slurmd"], self.folder / "slurmd.pid")
            self._wait_idle(60)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True, timeout=10).returncode == 0:
            return  # a munged runs already: use it, leave it running
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        self._daemon("munged", ["runuser", "-u", "munge", "--", "munged"], run_dir / "munged.pid")
        deadline = time.monotonic() + 20
        while subprocess.run("munge -n | unmunge", shell=True, capture_output=True, timeout=10).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("munged started but munge -n | unmunge still fails")
            time.sleep(0.2)

    def _daemon(self, name: str, command: list[str], pid_file: Path) -> None:
        """Start a daemon that forks into the background and writes ``pid_file``; remember its pid."""
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        _run(*command)
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError, ValueError, IndexError):  # IndexError: created, not yet written
                pid = int(pid_file.read_text().split()[0])
                if _comm(pid) == name:
                    self.started[name] = pid
                    return
            if time.monotonic() > deadline:
                log = self.folder / f"{name}.log"
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"{name} did not start (no live pid in {pid_file}); its log ends:\n{tail}")
            time.sleep(0.1)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            state = _run("sinfo", "-h", "-o", "%t", check=False).strip()
            if state == "idle":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node is {state!r}, not idle, after {timeout}s")
            time.sleep(0.2)

    # -- jobs -------------------------------------------------------------------------------------------
    def sbatch(self, script: str, name: str) -> int:
        path = self.folder / f"{name}.sbatch"
        path.write_text(script)
        return int(_run("sbatch", "--parsable", str(path)).strip().split(";")[0])

    def signal(self, job_id: int, name: str) -> None:
        """``scancel JOB`` for TERM (SIGTERM to every step's tasks, then SIGKILL after KillWait), else
        ``scancel --signal=NAME JOB`` (the steps' tasks only, as a pre-empting scheduler sends it)."""
        _run("scancel", str(job_id)) if name == "TERM" else _run("scancel", f"--signal={name}", str(job_id))

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        out = _run("scontrol", "show", "job", "-o", str(job_id), check=False)
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def wait(self, job_id: int, states: tuple[str, ...], timeout: float, restarts: int = 0) -> dict[str, str]:
        """The job's fields once it reaches one of ``states`` after ``restarts`` requeues."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states and int(info.get("Restarts", "0")) >= restarts:
                return info
            if time.monotonic() > deadline:
                _run("scancel", str(job_id), check=False)
                raise TimeoutError(f"job {job_id} is {info.get('JobState')} after {timeout}s, not in {states}: {info}")
            time.sleep(0.2)

    # -- stop -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job, end the daemons this cluster started (by PID, name checked), restore slurm.conf."""
        try:
            if "slurmctld" in self.started:
                _run("scancel", "--user=root", "--full", check=False)
                self._wait_no_steps(30)
            for name in ("slurmd", "slurmctld", "munged"):
                pid = self.started.pop(name, None)
                if pid is not None:
                    self._end(pid, name)
        finally:
            if self.previous_conf is not None:
                CONF.write_bytes(self.previous_conf)
            elif CONF.exists() and CONF.read_text() == (self.folder / "slurm.conf").read_text():
                CONF.unlink()
            self.lock.close()

    def _wait_no_steps(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _run("squeue", "-h", check=False).strip():
                return
            time.sleep(0.2)

    @staticmethod
    def _end(pid: int, name: str) -> None:
        if _comm(pid) != name:
            return  # gone already (and its pid maybe reused): nothing of ours to end
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _comm(pid) == name and time.monotonic() < deadline:
            time.sleep(0.1)
        if _comm(pid) == name:
            os.kill(pid, signal.SIGKILL)

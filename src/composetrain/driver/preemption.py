"""Pre-emption for ct.run: SIGTERM / SIGUSR1 ask to stop, the ranks agree, SLURM requeues."""

from __future__ import annotations

import datetime
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from composetrain.core.util import RUN
from composetrain.launch.agree import largest
from composetrain.launch.rendezvous import Process

__all__ = ["StopSignal", "requeue"]


class StopSignal:
    """SIGTERM (``scancel``, torchrun's shutdown) or SIGUSR1 (SLURM's ``--signal=SIGUSR1@90``
    pre-emption warning) ask to stop. Ranks stop after the same update: each update they agree
    in one tiny all-reduce on a gloo group of its own, so the flag stays on the CPU and checking
    it never waits for a GPU; what else the ranks must decide alike after every update rides along."""

    def __init__(self, proc: Process) -> None:
        self.received: set[str] = set()
        self.agreed = False
        self.shared: list[float] = []  # the extra numbers of the last check, agreed
        self.previous: dict[int, Any] = {}
        # under the job's timeout: a new group's default is 30 minutes, a hang when a rank stops answering
        timeout = datetime.timedelta(seconds=proc.timeout)
        self.group: Any = dist.new_group(backend="gloo", timeout=timeout) if proc.world_size > 1 else None
        if threading.current_thread() is threading.main_thread():
            for name in ("SIGTERM", "SIGUSR1"):
                sig = getattr(signal, name, None)
                if sig is not None:
                    self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.add(signal.Signals(signum).name)

    def check(self, also: bool = False, extra: Sequence[float] = ()) -> bool:
        """After each update: has any rank been asked to stop (or, with ``also``, does this rank want to)?
        ``extra``: more numbers the ranks agree on in the same all-reduce, each the largest over the ranks
        (``ct.run``'s saves: writes still in flight anywhere, rank 0's clock), left in ``self.shared``."""
        wanted = bool(self.received) or also
        values = largest([float(wanted), *extra], self.group)
        self.agreed, self.shared = values[0] > 0, values[1:]
        return self.agreed

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None


def requeue(enabled: bool, stop: StopSignal, proc: Process) -> None:
    """After a save on SIGUSR1 (pre-emption, not ``scancel``'s SIGTERM), requeue the SLURM job."""
    job = proc.cluster.job_id  # read by the rendezvous, the one module that reads launcher variables
    if not (enabled and job and proc.is_main and "SIGUSR1" in stop.received):
        return
    try:
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, text=True, timeout=60)
        print(f"{RUN}: saved and requeued SLURM job {job}", file=sys.stderr)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"{RUN}: saved, but could not requeue SLURM job {job}: {e}", file=sys.stderr)

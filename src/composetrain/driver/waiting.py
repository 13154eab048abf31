"""What a rank waits for (internal): a rank that stops answering fails the others, naming what they waited for.

Every collective of a job runs under the rendezvous timeout (gloo and nccl both time out). The error
the backend raises then names a socket operation ("Timed out waiting 60000ms for recv operation"),
not what the job was doing; ``Waiting`` keeps the current phase of ``ct.run`` and turns such errors
into one that says which phase waited, for how long, and what to do, so that the process exits with
an error and torchrun (``--max-restarts``) or SLURM (``--requeue``) can restart the job.
"""

from __future__ import annotations

from composetrain.core.util import RUN
from composetrain.launch.rendezvous import Process

__all__ = ["Waiting"]

# what gloo, nccl and the stores say when a peer died or its connection broke
_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused")


class Waiting:
    """The phase this rank is in, named when the other ranks stop answering during it.

    Args:
        proc: this process in its job.
        timeout: the collectives' timeout, in seconds.
    """

    def __init__(self, proc: Process, timeout: float) -> None:
        self.proc, self.timeout = proc, timeout
        self.what = "starting"

    def now(self, what: str) -> None:
        """Enter phase ``what`` (e.g. "the save of checkpoint step 7")."""
        self.what = what

    def lost(self, error: BaseException) -> RuntimeError | None:
        """The error to raise instead of ``error`` when it says another rank stopped answering or died,
        else None (``error`` is some other failure: raise it as it is)."""
        if self.proc.world_size == 1:
            return None
        text = str(error)
        first = text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__
        where = f"{RUN}: rank {self.proc.rank} of {self.proc.world_size}"
        then = (
            "this process fails so that the launcher can restart the job, which resumes from the latest "
            "checkpoint (torchrun --max-restarts, SLURM --requeue)"
        )
        if "timed out" in text.lower() or "timeout" in text.lower():
            return RuntimeError(
                f"{where} waited more than {self.timeout:g}s for the other ranks during {self.what}: a rank stopped "
                f"answering (hung, stopped, or its node unreachable); {then} ({first})"
            )
        if any(s in text for s in _LOST):
            return RuntimeError(
                f"{where} lost another rank during {self.what}: a rank died or its connection broke; {then} ({first})"
            )
        return None

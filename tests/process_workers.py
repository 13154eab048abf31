"""What tests/test_processes.py's pools run: ranks that die, or will not leave."""

import atexit
import os
import signal
import time


def pid(rank, world):
    return os.getpid()


def die(rank, world, victim):
    """``victim`` is killed mid-call; the others wait for it, as in a collective, for good."""
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


def linger(rank, world, victim):
    """``victim`` will not exit when the pool closes (a thread stuck at the interpreter's exit, say)."""
    if rank == victim:
        atexit.register(time.sleep, 600)

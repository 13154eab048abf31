"""What ct.run knows of torch.compile: how often and how long it compiled, and its caches beside the checkpoints.

A composition that compiles (``ct.compile``) says so in ``Capabilities.compile_cache``; the driver then keeps
torch's compile caches (``torch.compiler.save_cache_artifacts``: the FX graph, AOTAutograd and dynamic-shape
caches) in ``checkpoint_dir/compile_cache.bin``, written atomically after a checkpoint, and loads them when it
starts, before the first compile, so that a requeued job compiles from cache. Loading unpickles what torch
wrote: the file is read from the run's own checkpoint_dir only (``ct.compile(cache=False)`` opts out).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

__all__ = ["CACHE_FILE", "CompileCache", "compile_totals"]

CACHE_FILE = "compile_cache.bin"
# one entry per frame TorchDynamo compiled (a recompilation too), with its seconds: tracing and the backend
_COMPILED = "_compile.compile_inner"


def compile_totals() -> tuple[int, float]:
    """Frames torch.compile compiled in this process so far, and the seconds it spent on them."""
    from torch._dynamo.utils import compilation_time_metrics  # torch's own record; no public API reads it (2.14)

    times = compilation_time_metrics.get(_COMPILED, [])
    return len(times), float(sum(times))


class CompileCache:
    """torch's compile caches kept in ``folder/compile_cache.bin``; only the main process writes it."""

    def __init__(self, folder: Path, writes: bool) -> None:
        self.path = folder / CACHE_FILE
        self.writes = writes
        self.written_at = -1  # compile_totals()[0] when last written: nothing new, nothing to write

    def load(self) -> bool:
        """Load the caches into torch's, if the file is there; True if it was."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return False
        try:
            torch.compiler.load_cache_artifacts(data)
        except Exception as e:  # another torch's, or cut short: a cache only, so compile afresh
            warnings.warn(
                f"run: {self.path} could not be loaded ({type(e).__name__}: {e}); compiling afresh", stacklevel=3
            )
            return False
        self.written_at = compile_totals()[0]
        return True

    def save(self) -> None:
        """Write torch's caches atomically (temp file, fsync, rename), if it compiled anything new."""
        count = compile_totals()[0]
        if not self.writes or count == self.written_at:
            return
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:  # nothing torch can save (a backend without caches): keep what the file holds
            return
        tmp = self.path.with_name(f".{CACHE_FILE}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(saved[0])
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:  # a cache only: the run goes on, the next restart compiles afresh
            warnings.warn(f"run: could not write {self.path} ({e}); a resumed run will compile afresh", stacklevel=3)
            return
        finally:
            tmp.unlink(missing_ok=True)
        self.written_at = count

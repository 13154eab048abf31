"""What ct.run knows of torch.compile: how often and how long it compiled, and its caches beside the checkpoints.

A composition that compiles (``ct.compile``) says so in ``Capabilities.compile_cache``. While ``ct.run`` trains it,
torch's compile caches (TorchInductor's: FX graphs, AOTAutograd, the compiled C++/Triton kernels; TorchDynamo's
dynamic-shape profiles only where ``torch.compiler.config.job_id`` is set) live in ``checkpoint_dir/compile_cache/``
instead of the machine's ``/tmp``, so that a requeued job, on whichever node, compiles from them. The folder rather
than torch's portable artefacts (``torch.compiler.save_cache_artifacts``): those hold the graphs but not the
compiled C++ kernels, and a restart measured here on the CPU gained nothing from them (benchmarks/README.md).
Loading a cache entry unpickles it and loads its kernels: the folder is the run's own checkpoint_dir only
(``ct.compile(cache=False)`` opts out).
"""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from composetrain.core.util import RUN

__all__ = ["CACHE_DIR", "CompileCache", "compile_totals"]

CACHE_DIR = "compile_cache"
# one entry per frame TorchDynamo compiled (a recompilation too), with its seconds: tracing and the backend's
# forward graph
_COMPILED = "_compile.compile_inner"
# AOTAutograd compiles a graph's backward lazily, at its first backward, outside the frame's compilation: an
# entry per backward compiled, with its seconds (inductor's backward took 2 of 10.6 s of compiling here)
_BACKWARD = "backward._backward_impl"


def compile_totals() -> tuple[int, float]:
    """Frames torch.compile compiled in this process so far, and the seconds it spent on them (their backward
    graphs' too)."""
    utils = sys.modules.get("torch._dynamo.utils")  # not imported: nothing compiled (importing it takes seconds)
    # torch's own record of its compilations; no public API reads it (torch 2.14)
    record = getattr(utils, "compilation_time_metrics", {})
    frames = record.get(_COMPILED, [])
    return len(frames), float(sum(frames) + sum(record.get(_BACKWARD, [])))


class CompileCache:
    """torch's compile caches in ``folder/compile_cache/`` between ``enter()`` and ``leave()`` (ct.run's loop)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / CACHE_DIR
        self._inside: AbstractContextManager[Any] | None = None

    def enter(self) -> None:
        """Point torch's caches at the folder (its in-memory caches cleared, so that they are read from it)."""
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

        if self._inside is None:
            try:
                self.path.mkdir(exist_ok=True)
            except FileExistsError:  # a file, or a link to nothing: mkdir's own message names neither
                raise FileExistsError(
                    f"{RUN}: {self.path} is not a folder, but ct.compile keeps torch's compile caches there; "
                    "move it away, or give ct.compile(cache=False)"
                ) from None
            inside = temporary_cache_dir(os.fspath(self.path))
            inside.__enter__()
            self._inside = inside

    def leave(self) -> None:
        """Back to the caches the process used before."""
        inside, self._inside = self._inside, None
        if inside is not None:
            inside.__exit__(None, None, None)

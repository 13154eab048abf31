"""A process that caches a small dataset: ``python cache_script.py OUT PATH [PATH ...]``, as one rank of a job.

Each ``__getitem__`` appends a line "pid store item" to ``OUT.calls`` (so the test counts how many processes
wrote each store, and which items the others read to compare its fingerprint), then
every path is cached in turn and a digest of the items read back is printed. Environment: ``SLOW``, seconds
per item; ``FSIZE``, a file size limit in bytes (a full disk, as EFBIG). No process group is ever created:
ct.cache is called at the top of a script, before any rendezvous.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import sys
import time
from typing import Any

import torch

import composetrain as ct


class Counted(torch.utils.data.Dataset[Any]):
    def __init__(self, calls: str, n: int = 30) -> None:
        self.calls, self.n, self.store = calls, n, 0  # store: which of the paths is being cached

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        with open(self.calls, "a") as f:
            f.write(f"{os.getpid()} {self.store} {i}\n")
        time.sleep(float(os.environ.get("SLOW", "0")))
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i


def main() -> None:
    out, paths = sys.argv[1], sys.argv[2:]
    if "FSIZE" in os.environ:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(os.environ["FSIZE"]), resource.RLIM_INFINITY))
    data = Counted(out + ".calls")
    for data.store, path in enumerate(paths):
        cached = ct.cache(data, path, num_workers=0, progress=False, timeout=60)
        digest = hashlib.sha256(b"".join(cached[i][0].numpy().tobytes() for i in range(len(cached)))).hexdigest()
        print(path, digest, flush=True)


if __name__ == "__main__":
    main()

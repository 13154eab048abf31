"""Trains one distributed case under whatever launched this process (torchrun, srun-like
environment variables, ...) and saves this rank's result to OUT/rank<r>.pt.

    torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT \\
        tests/launch_train.py OUT
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import distributed_workers
from helpers import process_group_threads

import composetrain as ct

CASE = {
    "composition": "distributed(mixed_precision(dtype='bf16')(accumulate(n)(step)))",
    "n": 2,
    "kind": "classify",
    "sizes": [[5, 7], [6, 6], [8, 3]],
    "seed": 3,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    with ct.rendezvous() as proc:  # the default 300 s: on a loaded machine the ranks import torch for a minute
        result = distributed_workers.train(CASE, proc.rank)
        result["cluster"] = proc.cluster
    result["threads_left"] = process_group_threads()
    torch.save(result, out / f"rank{proc.rank}.pt")

"""ct.cache and ct.run over it on every rank of a processes.Pool (its process group already up).

A module of its own, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import run_script
import torch

import composetrain as ct


class Rows(torch.utils.data.Dataset[Any]):
    """run_script's dataset, one sample at a time (ct.run then collates per sample), counting its reads."""

    def __init__(self) -> None:
        self.x, self.y = run_script.dataset().tensors
        self.calls = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        self.calls += 1
        return self.x[i], int(self.y[i])


def flip(batch: Any, generator: torch.Generator) -> Any:
    x, y = batch
    signs = torch.randint(0, 2, (len(x), 1), generator=generator, dtype=x.dtype) * 2 - 1
    return [x * signs, y]


def run_over_cache(rank: int, world: int, folder: str) -> dict[str, Any]:
    data = Rows()
    cached = ct.cache(data, Path(folder) / "store", progress=False)
    writes = data.calls
    augmented = ct.cache(data, Path(folder) / "store", augment=flip, progress=False)
    runs = {}
    for name, source in (("original", data), ("cache", cached), ("augmented", augmented)):
        state = run_script.state()
        ct.run(
            ct.distributed(run_script.step),
            state,
            source,
            batch_size=12,
            epochs=1,
            num_workers=0,
            progress=False,
            seed=5,
        )
        runs[name] = [p.detach().clone() for p in state.model.parameters()]
    return {"writes": writes, **runs}

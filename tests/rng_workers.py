"""Run on each rank of a processes.Pool: what a fresh ct.run's step first draws on that rank.

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

import random

import numpy as np
import run_script
import torch

import composetrain as ct


def first_draws(rank: int, world: int) -> tuple[list[float], float, float, list[float]]:
    seen = []

    def step(model, batch):
        if not seen:
            seen.append((torch.rand(4).tolist(), random.random(), float(np.random.rand())))
        return run_script.step(model, batch)

    state = run_script.state()
    ct.run(ct.distributed(step), state, run_script.dataset(48), batch_size=12, progress=False, max_steps=1, seed=0)
    state.release_runtime()
    first = next(state.model.parameters()).detach().flatten()[:4].tolist()  # the same weights on every rank
    return (*seen[0], first)

"""distributed(pipeline_split(...)) on pool ranks, and its single-process reference (rank None).

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from helpers import classify, make_batch, make_state
from test_pipeline import PLACEMENTS, model_of

import composetrain as ct


def distributed_pipeline(rank, world, chunks):
    state = make_state(model=model_of("encoder-decoder", 0 if rank is None else rank))
    split = ct.pipeline_split(PLACEMENTS["encoder-decoder"], chunks=chunks)
    train = split(classify) if rank is None else ct.distributed(split(ct.accumulate(2)(classify)))
    for i in range(3):
        batch = make_batch(8 * world, seed=i)
        if rank is not None:
            batch = tuple(t[8 * rank : 8 * (rank + 1)] for t in batch)
        train(state, batch)
    return [p.detach().clone() for p in state.model.parameters()]

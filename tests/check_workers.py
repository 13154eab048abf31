"""ct.check on every rank of a processes.Pool (its ranks import this module by name)."""

from helpers import classify, make_batch, make_state

import composetrain as ct


def under_a_group(rank, world):
    """A composition that synchronises the group is refused; the part inside it is checked on each rank."""
    state = make_state(rank)
    try:
        ct.check(ct.distributed(ct.accumulate(2)(classify)), state, make_batch(8, seed=rank))
        refused = "no error"
    except ValueError as e:
        refused = str(e)
    return {"refused": refused, "inside": bool(ct.check(ct.accumulate(2)(classify), state, make_batch(8, seed=rank)))}

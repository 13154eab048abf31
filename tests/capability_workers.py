"""ct.run with a user-defined transform that synchronises the processes itself (on every rank of a processes.Pool).

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

import run_script
import torch.distributed as dist

import composetrain as ct


class MeanGradients(ct.TrainStep):
    """A user's own data parallelism: the gradients' mean over the ranks, before the update."""

    syncs_processes = True

    def update(self, state, ctx):
        for p in state.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        return super().update(state, ctx)


def user_sync(rank, world):
    state = run_script.state()
    step = MeanGradients(ct.train_step(run_script.step))
    result = ct.run(step, state, run_script.dataset(), batch_size=12, num_workers=0, progress=False, epochs=1)
    return {"steps": result.steps, "params": [p.detach().clone() for p in state.model.parameters()]}


def user_no_sync(rank, world):
    """The same transform without the flag: ct.run cannot know that it synchronises, and refuses."""

    class Unflagged(MeanGradients):
        syncs_processes = False

    try:
        ct.run(
            Unflagged(ct.train_step(run_script.step)),
            run_script.state(),
            run_script.dataset(),
            batch_size=12,
            num_workers=0,
            progress=False,
        )
    except ValueError as e:
        return str(e)
    return "no error"

"""What ct.run knows of a composition: its capabilities (core.Capabilities) and its setup hook, never
a transform's name. A user-defined transform that states a capability is driven like the built-in one."""

import pytest
import run_script
import torch
import torch.distributed as dist
from processes import Pool

import composetrain as ct
from composetrain.core.protocol import Capabilities


def test_the_built_in_transforms_state_their_capabilities():
    step = run_script.step
    plain = Capabilities()
    assert ct.train_step(step).capabilities == plain
    for transform in (
        ct.accumulate(2),
        ct.accumulate("auto"),
        ct.mixed_precision,
        ct.clip_grad_norm(1.0),
        ct.checkpoint_activations([torch.nn.Linear]),
    ):
        assert transform(step).capabilities == plain, transform
    assert ct.distributed(step).capabilities == Capabilities(syncs_processes=True)
    assert ct.sharded(step).capabilities == Capabilities(syncs_processes=True, forward_needs_every_rank=True)
    assert ct.data_parallel(["cpu"])(step).capabilities == Capabilities(places_model=True)
    assert ct.pipeline_split({"0": "cpu"})(step).capabilities == Capabilities(places_model=True)


class Places(ct.TrainStep):
    """A user's transform that puts the model where it wants it (here: leaves it where it is)."""

    places_model = True


def test_a_composition_has_every_capability_of_its_steps_whatever_the_order():
    step = run_script.step
    inside = ct.distributed(ct.mixed_precision(ct.accumulate(2)(step)))
    outside = ct.clip_grad_norm(1.0)(ct.distributed(step))
    assert inside.capabilities == outside.capabilities == Capabilities(syncs_processes=True)
    both = Places(ct.accumulate(2)(ct.distributed(step)))
    assert both.capabilities == Capabilities(places_model=True, syncs_processes=True)


class Recorded(torch.nn.Sequential):
    """A model that records where ct.run moves it."""

    def to(self, *args, **kwargs):
        self.moves = [*getattr(self, "moves", []), (args, kwargs)]
        return super().to(*args, **kwargs)


@pytest.mark.parametrize("places_model", [True, False])
def test_a_transform_that_places_the_model_itself_is_left_to_it(places_model):
    model = Recorded(*run_script.model())
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05))
    step = ct.train_step(run_script.step)
    train = Places(step) if places_model else ct.accumulate(1)(step)
    ct.run(train, state, run_script.dataset(), batch_size=12, num_workers=0, progress=False, max_steps=2)
    assert state.step == 2
    assert getattr(model, "moves", []) == ([] if places_model else [((torch.device("cpu"),), {})])


def test_the_setup_hook_runs_once_before_resuming_outermost_first(tmp_path):
    """ct.run calls train_step.setup(state) after placing the model and before a checkpoint loads into
    it; each transform calls its inner step's (ct.sharded shards the model there)."""
    calls = []

    class Tells(ct.TrainStep):
        def __init__(self, inner, name):
            self.name = name
            super().__init__(inner)

        def setup(self, state):
            calls.append((self.name, state.step))
            super().setup(state)

    def train(max_steps):
        state = run_script.state()
        step = Tells(ct.accumulate(2)(Tells(ct.train_step(run_script.step), "inner")), "outer")
        ct.run(
            step,
            state,
            run_script.dataset(),
            batch_size=12,
            num_workers=0,
            progress=False,
            max_steps=max_steps,
            checkpoint_dir=tmp_path,
        )
        return state

    train(2)
    assert calls == [("outer", 0), ("inner", 0)]
    calls.clear()
    assert train(4).step == 4  # resumed from step 2: setup saw the fresh state, before the checkpoint loaded
    assert calls == [("outer", 0), ("inner", 0)]


def test_a_user_transform_that_syncs_the_processes_is_accepted_on_two_ranks():
    pool = Pool(2)
    try:
        a, b = pool.run(__name__, "user_sync")
        refused = pool.run(__name__, "user_no_sync")
    finally:
        pool.close()
    assert a["steps"] == b["steps"] == 4  # 96 samples, 12 per rank per update
    assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))  # the ranks agreed
    assert refused[0] == refused[1] and "does not synchronise them; wrap it: ct.distributed" in refused[0]


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.run with a user-defined transform that synchronises the processes itself.


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

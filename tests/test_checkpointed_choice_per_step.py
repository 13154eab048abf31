"""checkpoint_activations: each step checkpoints the submodules it names, also on a TrainState that
another checkpoint_activations step trained before.

Found by the adversarial pass: the chosen submodules were cached in the TrainState per model only, so a
second step with other modules (a changed policy mid-run, a second step for another phase) silently
checkpointed the first step's choice and not its own.
"""

import torch
import torch.nn.functional as F
from helpers import Block, Net

import composetrain as ct


def net():
    """inp, first and second (Blocks without the residual: tanh(Linear)), out."""
    return Net(first=lambda: Block(residual=False), second=lambda: Block(residual=False))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def test_each_step_checkpoints_its_own_choice_on_a_shared_state():
    model = net()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    seen = []
    for key in ("first", "second"):  # a chosen module runs with the wrapper as its instance-level forward
        model.get_submodule(key).register_forward_hook(
            lambda m, a, o, key=key: seen.append((key, "forward" in vars(m)))
        )
    batch = (torch.randn(4, 5), torch.randint(0, 3, (4,)))
    steps = {key: ct.checkpoint_activations(key)(step) for key in ("first", "second")}
    for key in ("first", "second", "first"):
        seen.clear()
        steps[key](state, batch)
        assert sorted(seen) == sorted([("first", key == "first"), ("second", key == "second")]), key


def test_the_choice_is_made_once_per_model_and_step():
    """The submodules are chosen at the first update, not searched again at every one."""
    asked = []

    def is_block(module):
        asked.append(module)
        return isinstance(module, Block)

    model = net()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    train = ct.checkpoint_activations(is_block)(step)
    for _ in range(3):
        train(state, (torch.randn(4, 5), torch.randint(0, 3, (4,))))
    assert len(asked) == len(list(model.modules())) - 1  # every submodule once, the root never

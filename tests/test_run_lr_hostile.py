"""The logged rate with optimizers that hold no usable rate: none at all (a custom optimizer without an "lr"
in its groups) logs null, as one whose rate is None (transformers' Adafactor with relative steps)."""

import run_script
import torch

import composetrain as ct


class NoRate(torch.optim.Optimizer):
    """Plain gradient descent by a factor its groups call "scale": no "lr" key anywhere."""

    def __init__(self, params):
        super().__init__(params, {"scale": 0.01})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["scale"])


def test_an_optimizer_without_a_rate_trains_and_logs_none():
    model = run_script.model()
    before = [p.detach().clone() for p in model.parameters()]
    state = ct.TrainState(model, NoRate(model.parameters()))
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 1}
    result = ct.run(run_script.step, state, run_script.dataset(), max_steps=2, **options)
    assert [(r["step"], r["lr"]) for r in result.history] == [(1, None), (2, None)]
    assert state.step == 2 and not torch.equal(next(model.parameters()), before[0])


def test_the_plot_takes_a_null_rate_as_no_point_without_a_warning(tmp_path, recwarn):
    """ct.run writes "lr": null on purpose (no rate, or a window made by an earlier process): not bad data."""
    from composetrain.plot import curves

    model = run_script.model()
    state = ct.TrainState(model, NoRate(model.parameters()))
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 1}
    ct.run(run_script.step, state, run_script.dataset(), max_steps=3, checkpoint_dir=tmp_path, **options)
    drawn = curves(tmp_path)
    assert drawn["learning rate"] == {} and drawn["training loss"]["train"][0] == [1, 2, 3]
    assert not [w for w in recwarn if "not numbers" in str(w.message)]

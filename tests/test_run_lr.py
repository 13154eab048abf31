"""ct.run logs the learning rate each update used (read before the scheduler steps), in the history, the metrics
file, TensorBoard and the plot: a warmup's first rate appears (PITFALLS 28)."""

import json
import re
import warnings

import pytest
import run_script
import torch

import composetrain as ct
from composetrain.plot import curves


def state(groups: bool = False):
    """run_script's model with a 4-update linear warmup from a quarter of the rate, then a decay every 3."""
    model = run_script.model()
    if groups:  # a no-decay group first, with its own rate (a head trained 10 times faster would be the other)
        params = list(model.parameters())
        opt = torch.optim.SGD(
            [{"params": params[1::2], "lr": 0.05, "weight_decay": 0.0}, {"params": params[::2], "lr": 0.5}],
            lr=0.05,
            momentum=0.9,
        )
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=4)
    decay = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return ct.TrainState(model, opt, torch.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[4]))


def rates_used(updates: int, groups: bool = False) -> list[list[float]]:
    """Each update's rates as the plain loop sees them: read just before optimizer.step()."""
    s = state(groups)
    used = []
    for _ in range(updates):
        used.append([g["lr"] for g in s.optimizer.param_groups])
        s.optimizer.step()
        s.scheduler.step()
    return used


def run(tmp, *, groups=False, tensorboard=False, **options):
    s = state(groups)
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 1, **options}
    return ct.run(run_script.step, s, run_script.dataset(), checkpoint_dir=tmp, tensorboard=tensorboard, **options)


def test_the_logged_rate_is_the_one_each_update_used_from_the_warmups_first(tmp_path):
    pytest.importorskip("tensorboard")
    from test_tensorboard_resume import scalars

    result = run(tmp_path, tensorboard=True, max_steps=10)
    used = [r[0] for r in rates_used(10)]
    assert used[0] == 0.05 * 0.25 and used[0] != used[1]  # the warmup's first rate
    assert [r["lr"] for r in result.history] == used
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in lines] == used
    board = scalars(tmp_path / "tensorboard", "train/lr")
    assert [s for s, _ in board] == list(range(1, 11))
    torch.testing.assert_close([v for _, v in board], used)  # float32 in the event file
    assert curves(tmp_path)["learning rate"]["train"] == (list(range(1, 11)), used)


def test_a_record_of_several_updates_logs_the_rate_of_its_last_update(tmp_path):
    result = run(tmp_path, max_steps=10, log_every=4)  # records at 4, 8 (and 10: the run stops inside a window)
    used = [r[0] for r in rates_used(10)]
    assert [(r["step"], r["lr"]) for r in result.history] == [(4, used[3]), (8, used[7]), (10, used[9])]


def test_with_several_groups_the_first_groups_rate_is_logged(tmp_path):
    result = run(tmp_path, groups=True, max_steps=6)
    used = rates_used(6, groups=True)
    assert used[0] == [0.05 * 0.25, 0.5 * 0.25]
    assert [r["lr"] for r in result.history] == [first for first, _ in used]


def test_with_several_groups_every_groups_rate_is_logged_in_the_file_tensorboard_and_the_plot(tmp_path):
    """timm's --layer-decay gives each group its own rate: lr_groups holds them all, in group order."""
    pytest.importorskip("tensorboard")
    from test_tensorboard_resume import scalars

    result = run(tmp_path, groups=True, max_steps=6, tensorboard=True)
    used = rates_used(6, groups=True)
    assert [r["lr_groups"] for r in result.history] == used
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr_groups"] for r in lines] == used
    for i in range(2):
        board = scalars(tmp_path / "tensorboard", f"train/lr_groups/{i}")
        torch.testing.assert_close([v for _, v in board], [u[i] for u in used])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a list is no panel of its own, and no bad data
        assert "lr_groups" not in curves(tmp_path)


def test_with_one_group_no_lr_groups_is_logged_and_a_window_of_an_earlier_process_logs_nulls(tmp_path):
    assert all("lr_groups" not in r for r in run(tmp_path / "one", max_steps=3).history)
    run(tmp_path / "two", groups=True, max_steps=5, log_every=3)
    again = run(tmp_path / "two", groups=True, max_steps=5, log_every=3)  # finished inside a window: made again
    assert again.history[-1]["lr"] is None and again.history[-1]["lr_groups"] == [None, None]


def test_a_metric_named_lr_groups_is_refused():
    def named(model, batch):
        return run_script.step(model, batch)[0], {"lr_groups": 1.0}

    with pytest.raises(ValueError, match=r"metric 'lr_groups', a name ct.run's training records use"):
        ct.train_step(named)(state(), next(iter(torch.utils.data.DataLoader(run_script.dataset(), batch_size=4))))


def test_a_resumed_run_logs_the_rates_of_a_straight_one(tmp_path):
    """Interrupted inside a logging window (its checkpoint holds updates not yet logged), then resumed: the
    records, rates included, are the straight run's."""
    straight = run(tmp_path / "a", max_steps=10, log_every=3)
    run(tmp_path / "b", max_steps=5, log_every=3)  # saved at 5 with update 4 and 5 unlogged
    resumed = run(tmp_path / "b", max_steps=10, log_every=3)
    assert [(r["step"], r["lr"]) for r in resumed.history] == [(r["step"], r["lr"]) for r in straight.history]
    used = [r[0] for r in rates_used(10)]
    assert [r["step"] for r in straight.history] == [3, 6, 8, 9, 10]  # 8 updates an epoch: its end logs
    assert [r["lr"] for r in straight.history] == [used[r["step"] - 1] for r in straight.history]


def test_a_window_no_update_of_this_process_made_logs_no_rate(tmp_path):
    """Run again after it finished inside a window: that window's record is made again from the checkpoint,
    whose updates an earlier process made; their rate is not known here, so it is null (not the next one's)."""
    first = run(tmp_path, max_steps=5, log_every=3)
    again = run(tmp_path, max_steps=5, log_every=3)
    assert [r["step"] for r in again.history] == [3, 5]
    assert again.history[-1]["lr"] is None and first.history[-1]["lr"] == rates_used(5)[4][0]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["lr"] is None


def test_a_tensor_rate_is_logged_as_it_was_used(tmp_path):
    """A tensor lr (torch.optim takes one): schedulers fill it in place, so the rate used is copied before."""
    s = state()
    for group in s.optimizer.param_groups:
        group["lr"] = torch.tensor(group["lr"], dtype=torch.float64)
    result = ct.run(
        run_script.step,
        s,
        run_script.dataset(),
        batch_size=12,
        num_workers=0,
        progress=False,
        log_every=1,
        max_steps=6,
    )
    used = [r[0] for r in rates_used(6)]
    assert [r["lr"] for r in result.history] == pytest.approx(used, rel=1e-15)
    assert all(type(r["lr"]) is float for r in result.history)


def sgd_state(lr, t_max=None, momentum=0.9):
    model = run_script.model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    return ct.TrainState(model, opt, None if t_max is None else torch.optim.lr_scheduler.CosineAnnealingLR(opt, t_max))


@pytest.mark.parametrize(
    ("first", "then", "named"),
    [
        ({"lr": 0.05}, {"lr": 0.5}, "param group 0 lr 0.05 (given 0.5)"),
        ({"lr": 0.05, "t_max": 20}, {"lr": 0.05, "t_max": 40}, "scheduler T_max 20 (given 40)"),
        ({"lr": 0.05, "t_max": 20}, {"lr": 0.5, "t_max": 20}, "param group 0 initial_lr 0.05 (given 0.5)"),
        # a scheduler that does not cycle momentum (as OneCycleLR does) leaves it the user's: a new one is named
        (
            {"lr": 0.05, "t_max": 20},
            {"lr": 0.05, "t_max": 20, "momentum": 0.5},
            "param group 0 momentum 0.9 (given 0.5)",
        ),
    ],
)
def test_settings_given_to_a_resumed_run_that_the_checkpoint_replaces_are_named(tmp_path, first, then, named):
    """A new lr or T_max given on resume is not used (the checkpoint's optimizer and scheduler are restored):
    ct.run says so, naming both values, and the fix; the run goes on with the checkpoint's."""
    args = {"batch_size": 12, "num_workers": 0, "progress": False, "checkpoint_dir": tmp_path}
    ct.run(run_script.step, sgd_state(**first), run_script.dataset(), max_steps=4, **args)
    resumed = sgd_state(**then)
    with pytest.warns(
        UserWarning,
        match=r"run: resuming from checkpoint .*step-000000004, whose optimizer and "
        rf"scheduler settings replace those given: {re.escape(named)}.*ct\.load_checkpoint",
    ):
        ct.run(run_script.step, resumed, run_script.dataset(), max_steps=8, **args)
    assert resumed.optimizer.param_groups[0].get("initial_lr", resumed.optimizer.param_groups[0]["lr"]) == 0.05


def test_a_resume_with_the_same_settings_under_onecyclelr_says_nothing_though_it_cycled_the_momentum(tmp_path):
    def one_cycle():
        model = run_script.model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return ct.TrainState(model, opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=12))

    args = {"batch_size": 12, "num_workers": 0, "progress": False, "checkpoint_dir": tmp_path, "log_every": 4}
    ct.run(run_script.step, one_cycle(), run_script.dataset(), max_steps=6, **args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.run(run_script.step, one_cycle(), run_script.dataset(), max_steps=12, **args)


def test_a_resume_with_the_same_settings_says_nothing_though_the_schedule_moved_the_rates(tmp_path):
    args = {"batch_size": 12, "num_workers": 0, "progress": False, "checkpoint_dir": tmp_path, "log_every": 4}
    ct.run(run_script.step, state(groups=True), run_script.dataset(), max_steps=6, **args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.run(run_script.step, state(groups=True), run_script.dataset(), max_steps=12, **args)


# -- optimizers that hold no usable rate ------------------------------------------------------------------------------


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

"""What ct.run does between epochs: on_epoch_start(state, epoch) before each epoch it trains (also one it resumes
part-way), on_epoch_end(state, epoch) once after each epoch's last update (before its checkpoint, evaluation and
epoch scheduler step: a resume runs it once), and a scheduler fed a metric (ReduceLROnPlateau, timm's plateau,
any timm scheduler) stepped with a named evaluation metric after each epoch's evaluation."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler
from torch.utils.data import TensorDataset

import composetrain as ct

EPOCHS, PER_EPOCH, BATCH = 4, 3, 4
QUICK = {"batch_size": BATCH, "num_workers": 0, "progress": False, "shuffle": False}


def data(n=PER_EPOCH * BATCH, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    return TensorDataset(x, (x[:, 0] > 0).long())


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double()


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def evaluate(model, batch):
    x, y = batch
    return {"loss": F.cross_entropy(model(x), y), "acc": (model(x).argmax(-1) == y).double().mean()}


def by_hand_eval(model, eval_set):
    """ct.run's evaluation: batch means weighted by batch size, over the eval data, in float64."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    with torch.no_grad():
        sums, count = None, 0
        for start in range(0, len(eval_set), BATCH):
            x, y = eval_set[start : start + BATCH]
            n = len(y)
            v = F.cross_entropy(model(x), y).to(torch.float64) * n
            sums = v if sums is None else sums + v
            count += n
    for m, training in modes:
        m.training = training
    return sums.item() / float(count)


def plain_state(seed=0):
    model = net(seed)
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))


def plateau_state(seed=0, kind="torch"):
    model = net(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if kind == "torch":
        plateau = lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return ct.TrainState(model, opt, plateau, scheduler_interval="epoch")
    timm_scheduler = pytest.importorskip("timm.scheduler")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        plateau = timm_scheduler.PlateauLRScheduler(opt, decay_rate=0.5, patience_t=0, mode="min")
    return ct.TrainState(model, opt, plateau)


def rates_of(state, rates):
    def recording(model, batch):
        rates.append(state.optimizer.param_groups[0]["lr"])
        return step(model, batch)

    return recording


EVAL = {"eval_step": evaluate, "eval_data": data(8, seed=1), "scheduler_metric": "eval.loss"}


@pytest.mark.parametrize("kind", ["torch", "timm"])
def test_a_plateau_scheduler_is_fed_each_epochs_evaluation_as_by_hand(kind):
    state, rates = plateau_state(kind=kind), []
    result = ct.run(rates_of(state, rates), state, data(), epochs=EPOCHS, **QUICK, **EVAL)
    hand, hand_rates = plateau_state(kind=kind), []
    train, eval_set = ct.train_step(step), data(8, seed=1)
    for epoch in range(EPOCHS):
        for start in range(0, PER_EPOCH * BATCH, BATCH):
            hand_rates.append(hand.optimizer.param_groups[0]["lr"])
            train(hand, data()[start : start + BATCH])
        metric = by_hand_eval(hand.model, eval_set)
        assert result.evals[epoch]["loss"] == metric
        hand.scheduler.step(metric) if kind == "torch" else hand.scheduler.step(epoch + 1, metric)
    assert rates == hand_rates and len(set(rates)) > 1  # it decayed, when it should
    assert state.optimizer.param_groups[0]["lr"] == hand.optimizer.param_groups[0]["lr"]
    for a, b in zip(state.model.state_dict().values(), hand.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("stop", [PER_EPOCH * 2, PER_EPOCH * 2 + 1])
def test_a_run_resumed_at_or_after_an_epoch_end_feeds_the_metric_once(tmp_path, stop):
    """Saved at an epoch's end before its evaluation: the resumed run evaluates and steps the scheduler then."""
    straight, rates = plateau_state(), []
    ct.run(rates_of(straight, rates), straight, data(), epochs=EPOCHS, **QUICK, **EVAL)
    first, again = plateau_state(), []
    ct.run(rates_of(first, again), first, data(), max_steps=stop, checkpoint_dir=tmp_path, **QUICK, **EVAL)
    resumed = plateau_state(seed=5)
    result = ct.run(rates_of(resumed, again), resumed, data(), epochs=EPOCHS, checkpoint_dir=tmp_path, **QUICK, **EVAL)
    assert again[-(EPOCHS * PER_EPOCH - stop) :] == rates[stop:]
    assert resumed.scheduler.state_dict() == straight.scheduler.state_dict()
    assert resumed.epoch == straight.epoch == EPOCHS
    assert [e["step"] for e in result.evals] == [PER_EPOCH * (e + 1) for e in range(EPOCHS)]
    for a, b in zip(resumed.model.state_dict().values(), straight.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_the_metric_of_ct_ema_s_weights_can_feed_it():
    state = plateau_state()
    result = ct.run(
        ct.ema(0.5)(step), state, data(), epochs=2, **QUICK, **{**EVAL, "scheduler_metric": "eval_ema.loss"}
    )
    hand = lr_scheduler.ReduceLROnPlateau(torch.optim.SGD(net().parameters(), lr=0.5), patience=0, factor=0.5)
    for e in result.evals:
        hand.step(e["eval_ema"]["loss"])
    assert state.scheduler.state_dict()["best"] == hand.state_dict()["best"]
    assert result.evals[0]["eval_ema"]["loss"] != result.evals[0]["loss"]


def test_an_unknown_metric_is_named_after_the_save_and_the_fixed_command_resumes(tmp_path):
    state = plateau_state()
    bad = {**EVAL, "scheduler_metric": "eval.los"}
    with pytest.raises(ValueError) as e:
        ct.run(step, state, data(), epochs=2, checkpoint_dir=tmp_path, **QUICK, **bad)
    said = str(e.value)
    assert "scheduler_metric='eval.los'" in said and "['acc', 'loss']" in said and "eval_ema" not in said
    assert (tmp_path / f"step-{PER_EPOCH:09d}").is_dir()  # the epoch's training is kept
    fixed = plateau_state()
    ct.run(step, fixed, data(), epochs=2, checkpoint_dir=tmp_path, **QUICK, **EVAL)
    assert fixed.epoch == 2 and fixed.step == 2 * PER_EPOCH


# -- refused before anything starts -------------------------------------------------------------------------
def refused(state, error, pattern, **options):
    before = [p.clone() for p in state.model.parameters()]
    with pytest.raises(error, match=pattern):
        ct.run(step, state, data(), epochs=2, **QUICK, **options)
    assert state.step == 0 and state.epoch == 0
    assert all(torch.equal(a, b) for a, b in zip(before, state.model.parameters(), strict=True))


def test_a_scheduler_that_needs_a_metric_without_one_is_refused():
    refused(
        plateau_state(),
        ValueError,
        r"^run: the scheduler ReduceLROnPlateau steps on a metric, and scheduler_metric is not given: it would never "
        r"decay; .*scheduler_metric='eval.loss'",
        eval_step=evaluate,
        eval_data=data(8),
    )


def test_a_metric_for_a_scheduler_that_takes_none_is_refused():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for scheduler in (lr_scheduler.StepLR(opt, 2), None):
        state = ct.TrainState(model, opt, scheduler)
        refused(state, ValueError, r"^run: scheduler_metric='eval.loss' is given, but ", **EVAL)


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"scheduler_metric": "eval.loss"}, ValueError, r"scheduler_metric='eval.loss' but no eval_step"),
        ({**EVAL, "eval_every": 2}, ValueError, r"scheduler_metric='eval.loss' with eval_every=2"),
        ({**EVAL, "scheduler_metric": "loss"}, ValueError, r"scheduler_metric must name an evaluation metric"),
        ({**EVAL, "scheduler_metric": "eval."}, ValueError, r"scheduler_metric must name an evaluation metric"),
        ({**EVAL, "scheduler_metric": "train.loss"}, ValueError, r"scheduler_metric must name an evaluation metric"),
        ({**EVAL, "scheduler_metric": 3}, TypeError, r"scheduler_metric must be a str .*got 3 \(int\)"),
    ],
)
def test_a_bad_scheduler_metric_is_refused_naming_what_arrived(options, error, pattern):
    refused(plateau_state(), error, rf"^run: {pattern}", **options)


@pytest.mark.parametrize("name", ["on_epoch_start", "on_epoch_end"])
@pytest.mark.parametrize("hook", [3, nn.Linear, lambda state: None, lambda: None])
def test_a_hook_that_cannot_be_called_as_fn_state_epoch_is_refused(name, hook):
    state = plain_state()
    refused(state, TypeError, rf"^run: {name} must be a function {name}\(state, epoch\), got ", **{name: hook})


async def _async_hook(state, epoch):
    pass


def _generator_hook(state, epoch):
    yield epoch


@pytest.mark.parametrize(
    ("hook", "why"),
    [
        (_async_hook, r"it returns a coroutine \(async def\) that ct\.run would not await: its body would never run"),
        (_generator_hook, r"it returns a generator that ct\.run would not iterate: its body would never run"),
        (lambda *, state, epoch: None, r"its signature \(\*, state, epoch\) cannot be called as fn\(state, epoch\)"),
        (
            lambda state, epoch, extra: None,
            r"its signature \(state, epoch, extra\) cannot be called as fn\(state, epoch\)",
        ),
        (nn.Linear, r"it is a class: calling it would build one"),
        (3, r"it is not callable"),
    ],
    ids=["async", "generator", "keywords", "three", "class", "int"],
)
def test_a_refused_hook_is_told_why_it_cannot_be_called(hook, why):
    """'must be a function on_epoch_end(state, epoch), got <function ...> (function)': a function arrived, and the
    message did not say what was wrong with it."""
    pattern = rf"^run: on_epoch_end must be a function on_epoch_end\(state, epoch\), got .*; {why}; e\.g\. "
    refused(plain_state(), TypeError, pattern, on_epoch_end=hook)


# -- the hooks ----------------------------------------------------------------------------------------------
def hooked(calls, seen):
    """on_epoch_end halves the BatchNorm's running variance (a change to the state: checkpointed) and records
    the epoch; on_epoch_start records which epoch starts and turns the step's 'mixup' off from epoch 2."""
    flags = {"mixup": True}

    def start(state, epoch):
        calls.append(("start", epoch, state.step))
        flags["mixup"] = epoch < 2  # timm's --mixup-off-epoch 2: a function of the epoch, set again on resume

    def end(state, epoch):
        calls.append(("end", epoch, state.step))
        with torch.no_grad():
            state.model[1].running_var.mul_(0.5)

    def mixing(model, batch):
        x, y = batch
        seen.append(flags["mixup"])
        return step(model, (x.flip(0) * 0.5 + x * 0.5, y) if flags["mixup"] else (x, y))

    return mixing, start, end


def test_the_hooks_run_at_each_epochs_start_and_end_in_order():
    calls, seen = [], []
    mixing, start, end = hooked(calls, seen)
    state = plain_state()
    evaluated = []
    result = ct.run(
        mixing,
        state,
        data(),
        epochs=3,
        on_epoch_start=start,
        on_epoch_end=end,
        eval_step=lambda m, b: evaluated.append(m[1].running_var.clone()) or {"x": 0.0},
        eval_data=data(4),
        **QUICK,
    )
    expected = []
    for epoch in range(3):
        expected += [("start", epoch, epoch * PER_EPOCH), ("end", epoch, (epoch + 1) * PER_EPOCH)]
    assert calls == expected and result.epochs == 3
    assert seen == [True] * 2 * PER_EPOCH + [False] * PER_EPOCH
    assert torch.equal(evaluated[-1], state.model[1].running_var)  # the evaluation sees what the hook did


@pytest.mark.parametrize("stop", [PER_EPOCH, PER_EPOCH + 1, 2 * PER_EPOCH - 1, 2 * PER_EPOCH])
def test_a_resumed_run_runs_each_epoch_end_once_and_restarts_the_epoch_it_resumes(tmp_path, stop):
    straight_calls, straight_seen = [], []
    mixing, start, end = hooked(straight_calls, straight_seen)
    straight = plain_state()
    ct.run(mixing, straight, data(), epochs=3, on_epoch_start=start, on_epoch_end=end, **QUICK)
    runs, seen = [], []
    for seed, options in ((0, {"max_steps": stop}), (9, {"epochs": 3})):  # the resumed one from the checkpoint
        runs.append([])
        mixing, start, end = hooked(runs[-1], seen)  # a fresh process: the flag starts on again
        state = plain_state(seed)
        ct.run(
            mixing, state, data(), on_epoch_start=start, on_epoch_end=end, checkpoint_dir=tmp_path, **QUICK, **options
        )
    ends = [c for c in runs[0] + runs[1] if c[0] == "end"]
    assert ends == [c for c in straight_calls if c[0] == "end"]  # each epoch's end once, across the resume
    assert runs[1][0] == ("start", stop // PER_EPOCH, stop)  # the epoch it resumes in starts again, where it stood
    assert seen[-(3 * PER_EPOCH - stop) :] == straight_seen[stop:]
    for a, b in zip(state.model.state_dict().values(), straight.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


# -- timm's --dist-bn on two ranks ----------------------------------------------------------------------------
@pytest.mark.parametrize("reduce", [False, True], ids=["own", "dist-bn reduce"])
def test_dist_bn_at_each_epoch_end_gives_every_rank_and_the_checkpoint_the_mean_statistics(pool, tmp_path, reduce):
    """Under ct.distributed each rank's BatchNorm keeps its own running statistics; timm's distribute_bn in
    on_epoch_end averages them before the epoch's evaluation and checkpoint."""
    ranks = pool.run(__name__, "run_dist_bn", str(tmp_path), reduce)
    for k in ("1.running_mean", "1.running_var"):
        assert torch.equal(ranks[0]["live"][k], ranks[1]["live"][k]) == reduce, k
        assert torch.equal(ranks[0]["saved"][k], ranks[0]["live"][k]), k  # the epoch end's checkpoint has them


def run_dist_bn(rank: int, world: int, folder: str, reduce: bool) -> dict[str, dict[str, torch.Tensor]]:
    utils = pytest.importorskip("timm.utils")
    state = plain_state()

    def dist_bn(state, epoch):  # timm's train.py: after train_one_epoch, before validate and the save
        utils.distribute_bn(state.model, world, reduce=True)

    result = ct.run(
        ct.distributed(step),
        state,
        data(4 * PER_EPOCH * BATCH // 2, seed=rank),  # each rank its own samples (a sampler shares them anyway)
        epochs=2,
        checkpoint_dir=folder,
        on_epoch_end=dist_bn if reduce else None,
        **QUICK,
    )
    saved = plain_state(3)
    ct.load_checkpoint(saved, result.checkpoint)
    return {"live": dict(state.model.state_dict()), "saved": dict(saved.model.state_dict())}


def test_a_metric_of_weights_the_composition_does_not_evaluate_is_refused_before_training(tmp_path):
    state = plateau_state()
    with pytest.raises(ValueError) as e:
        ct.run(step, state, data(), epochs=1, **QUICK, **{**EVAL, "scheduler_metric": "eval_ema.loss"})
    said = str(e.value)
    assert said.startswith("run: scheduler_metric='eval_ema.loss' names the evaluation of weights 'ema'")
    assert "['eval']" in said and "ct.ema" in said
    assert state.step == 0 and state.epoch == 0


# -- found by the issue-37 adversary --------------------------------------------------------------------------
def test_an_evaluation_of_nan_steps_the_plateau_as_by_hand_and_the_run_goes_on():
    """A NaN metric (0/0, an epoch that diverged) is no improvement to ReduceLROnPlateau, as timm's train.py feeds
    it; refused, the run stopped after its checkpoint and its resume evaluated to NaN and stopped again."""
    state, calls = plateau_state(), []

    def nan_at_epochs_1_and_2(model, batch):
        calls.append(state.step)
        metrics = evaluate(model, batch)
        bad = state.step in (2 * PER_EPOCH, 3 * PER_EPOCH)
        return {**metrics, "loss": torch.tensor(float("nan"), dtype=torch.float64) if bad else metrics["loss"]}

    result = ct.run(step, state, data(), epochs=EPOCHS, **QUICK, **{**EVAL, "eval_step": nan_at_epochs_1_and_2})
    hand = lr_scheduler.ReduceLROnPlateau(torch.optim.SGD(net().parameters(), lr=0.5), patience=0, factor=0.5)
    for e in result.evals:
        hand.step(e["loss"])
    assert [e["loss"] != e["loss"] for e in result.evals] == [False, True, True, False]
    assert state.epoch == EPOCHS and state.optimizer.param_groups[0]["lr"] == hand.optimizer.param_groups[0]["lr"]
    assert state.optimizer.param_groups[0]["lr"] <= 0.5 * 0.5**2  # decayed on each NaN epoch


@pytest.mark.parametrize("name", ["on_epoch_start", "on_epoch_end"])
@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda s: s.end_epoch(), r"state\.epoch from \d+ to \d+"),
        (lambda s: setattr(s, "epoch", s.epoch + 3), r"state\.epoch from \d+ to \d+"),
        (lambda s: ct.train_step(step)(s, data(4)[:]), r"state\.step from \d+ to \d+"),
        (lambda s: setattr(s, "model", net(3)), r"state\.model"),
        (lambda s: setattr(s, "optimizer", torch.optim.SGD(s.model.parameters(), lr=1.0)), r"state\.optimizer"),
        (lambda s: setattr(s, "scheduler", None), r"state\.scheduler"),
    ],
    ids=["end_epoch", "epoch", "an update", "model", "optimizer", "scheduler"],
)
def test_a_hook_that_moves_the_runs_count_or_swaps_what_it_trains_is_refused_at_once(tmp_path, name, change, named):
    """A plain loop's state.end_epoch() moved into on_epoch_end would step an epoch scheduler twice an epoch; an
    update in a hook, a model or optimizer swapped in: the run's count, its checkpoints and its scheduler would no
    longer agree with what trains. Refused when the hook returns, before the epoch's checkpoint."""
    state = plain_state()
    opt = state.optimizer
    state = ct.TrainState(state.model, opt, lr_scheduler.StepLR(opt, 1, gamma=0.5), scheduler_interval="epoch")

    def hook(s, epoch):
        if epoch == 1:
            change(s)

    with pytest.raises(ValueError, match=rf"^run: {name} changed {named}.*leave "):
        ct.run(step, state, data(), epochs=3, checkpoint_dir=tmp_path, **QUICK, **{name: hook})
    saved = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-"))
    assert saved == [f"step-{PER_EPOCH:09d}"]  # nothing saved after the hook

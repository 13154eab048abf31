"""ct.run's loop: updates per epoch and max_steps, every epoch reshuffled by the seed, loader workers, evaluation
as an exact mean (every eval_every updates, without grad, each submodule's mode restored), the bottleneck report.
"""

import time

import pytest
import run_script
import torch
from helpers import assert_states_equal
from run_script import train, untimed
from torch.utils.data import Dataset, TensorDataset

import composetrain as ct
from composetrain.driver.reader import auto_workers


@pytest.mark.parametrize(("drop_last", "per_epoch"), [(False, 9), (True, 8)])
def test_updates_per_epoch_and_epochs(drop_last, per_epoch):
    state = run_script.state()
    data = TensorDataset(*run_script.dataset(100).tensors)  # 100 samples in batches of 12: 8 full, one of 4
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "log_every": 4}
    result = ct.run(ct.accumulate(2)(run_script.step), state, data, epochs=3, drop_last=drop_last, **options)
    assert state.step == result.steps == 3 * per_epoch and result.epochs == 3
    assert result.history[-1]["step"] == 3 * per_epoch


def test_max_steps_counts_optimizer_updates():
    state, result = train(max_steps=11)
    assert state.step == 11 and result.epochs == 1  # 8 per epoch: 11 stops inside the second
    state, result = train(epochs=1, max_steps=100)
    assert state.step == 8  # whichever ends first


def test_every_epoch_reshuffles_and_the_seed_decides_the_order():
    def orders(seed):
        seen = []

        def spy(model, batch):
            seen.append(batch[0][:, 0].tolist())
            return run_script.step(model, batch)

        ct.run(
            spy,
            run_script.state(),
            run_script.dataset(),
            batch_size=96,
            epochs=3,
            num_workers=0,
            progress=False,
            seed=seed,
        )
        return seen

    first = orders(1)
    assert first[0] != first[1] != first[2] and sorted(first[0]) == sorted(first[1])  # set_epoch every epoch
    assert orders(1) == first and orders(2) != first


def test_evaluation_is_an_exact_mean_over_the_eval_data():
    def evaluate(model, batch):
        x, y = batch
        return {"acc": (model(x).argmax(-1) == y).double().mean(), "n": 1.0}

    state, result = train(epochs=2, eval_step=evaluate, eval_data=run_script.dataset(50))
    assert state.model.training  # back in training mode after each evaluation
    x, y = run_script.dataset(50).tensors
    state.model.eval()
    with torch.no_grad():
        expected = (state.model(x).argmax(-1) == y).double().mean().item()
    assert [e["epoch"] for e in result.evals] == [1, 2]
    assert result.evals[-1]["acc"] == pytest.approx(expected, abs=1e-12) and result.evals[-1]["n"] == 1.0


class Slow(Dataset):
    def __init__(self, delay):
        self.delay = delay
        self.inner = run_script.dataset()

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.inner[i]


def test_the_bottleneck_report_names_the_cause():
    state = run_script.state()
    result = ct.run(run_script.step, state, Slow(0.01), batch_size=12, num_workers=0, progress=False)
    assert result.data_wait > 0.5 and "data loading is" in result.bottleneck
    spare = auto_workers()
    if spare > 0:
        assert f"raise num_workers (now 0; this process has cores for {spare})" in result.bottleneck
    else:
        assert "already use every spare core" in result.bottleneck
    _, fast = train(epochs=1)
    assert fast.bottleneck.startswith("compute-bound")


def test_max_steps_alone_runs_until_that_many_updates_even_when_some_are_skipped():
    import math as m

    calls = []

    def sometimes_overflows(model, batch):
        calls.append(1)
        loss, metrics = run_script.step(model, batch)
        return (loss * m.inf if len(calls) % 5 == 0 else loss), metrics

    model = run_script.model().float()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = TensorDataset(run_script.dataset().tensors[0].float(), run_script.dataset().tensors[1])
    result = ct.run(
        ct.mixed_precision(dtype="fp16")(sometimes_overflows),
        state,
        data,
        batch_size=12,
        max_steps=20,
        num_workers=0,
        progress=False,
    )
    assert state.step == 20 and sum(r["skipped"] for r in result.history) >= 4


def test_workers_give_the_same_training_and_draw_distinct_random_streams():
    _, with_workers = train(epochs=2, num_workers=2)
    _, without = train(epochs=2, num_workers=0)
    assert untimed(with_workers.history) == untimed(without.history)

    class Noisy(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return torch.tensor([float(info.id if info else -1), float(torch.rand(()))])

    seen = []

    def spy(model, batch):
        seen.extend(batch.tolist())
        return model(torch.zeros(1, 6, dtype=torch.float64)).sum() * 0 + model[0].weight.sum() * 0

    ct.run(spy, run_script.state(), Noisy(), batch_size=2, num_workers=2, shuffle=False, progress=False)
    by_worker = {w: [r for i, r in seen if i == w] for w in (0.0, 1.0)}
    assert by_worker[0.0] and by_worker[1.0] and by_worker[0.0] != by_worker[1.0]  # not one shared stream


def test_eval_every_counts_updates_and_eval_runs_without_grad():
    grad_modes = []

    def evaluate(model, batch):
        grad_modes.append(torch.is_grad_enabled())
        x, y = batch
        return {"acc": (model(x).argmax(-1) == y).double().mean()}

    _, result = train(epochs=2, eval_step=evaluate, eval_data=run_script.dataset(24), eval_every=5)
    assert [e["step"] for e in result.evals] == [5, 10, 15] and not any(grad_modes)


def test_evaluation_restores_each_submodules_own_mode():
    """A frozen BatchNorm stays in eval mode after ct.run's evaluation, not only the model's flag."""
    seen = []

    def step(model, batch):
        seen.append(tuple(m.training for m in model.modules()))
        return run_script.step(model, batch)

    state = run_script.state()
    state.model.train()
    frozen = next(state.model.modules())  # make one submodule's mode differ from the model's
    children = list(state.model.children())
    children[0].eval()
    expected = tuple(m.training for m in state.model.modules())
    ct.run(
        step,
        state,
        run_script.dataset(),
        batch_size=12,
        epochs=2,
        eval_step=run_script.accuracy,
        eval_data=run_script.dataset(30),
        num_workers=0,
        progress=False,
    )
    assert frozen.training and set(seen) == {expected}  # the same modes before and after each evaluation


def test_a_numpy_integer_seed_is_an_int_seed():
    np = pytest.importorskip("numpy")
    a, _ = train(max_steps=3, seed=np.int64(5))
    b, _ = train(max_steps=3, seed=5)
    assert_states_equal(a, b)


def test_log_and_evaluation_records_number_the_epoch_alike():
    """One convention in one metrics file: "epoch" is the epochs completed at the record's step, so the log record
    and the evaluation at an epoch's end say the same, and a record inside the first epoch says 0."""

    def evaluate(model, batch):
        return {"n": 1.0}

    _, result = train(epochs=2, log_every=3, eval_step=evaluate, eval_data=run_script.dataset(12), eval_every=4)
    per_epoch = 8  # 96 samples in batches of 12
    for record in result.history + result.evals:
        assert record["epoch"] == record["step"] // per_epoch, record
    ends = {r["step"]: r["epoch"] for r in result.history if r["step"] % per_epoch == 0}
    assert ends == {e["step"]: e["epoch"] for e in result.evals if e["step"] % per_epoch == 0} == {8: 1, 16: 2}

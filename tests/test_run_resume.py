"""ct.run resumed from its checkpoint_dir: bit-identical to running straight (mid-epoch, mid-window, under
mixed precision, after a failed evaluation, from a DataLoader given as is), corrupt checkpoints skipped and
pruned aside, another model's or another data setting's checkpoint refused.
"""

import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
import run_script
import torch
from helpers import assert_states_equal
from hypothesis import given
from run_script import accuracy, train, untimed
from torch.utils.data import TensorDataset

import composetrain as ct


def test_resuming_after_k_epochs_is_bit_identical_to_running_straight(tmp_path):
    straight, straight_result = train(tmp_path / "a", epochs=4)
    train(tmp_path / "b", epochs=2)
    resumed, resumed_result = train(tmp_path / "b", epochs=4)  # the same command, a larger total
    assert_states_equal(resumed, straight)
    assert untimed(resumed_result.history) == untimed(straight_result.history)


@pytest.mark.parametrize("stop_at", [5, 11])
def test_resuming_mid_epoch_and_mid_window_is_bit_identical(tmp_path, stop_at):
    """Dropout draws from the restored RNG, accumulate(2) splits every batch, the sampler
    restarts part-way through the epoch."""
    straight, _ = train(tmp_path / "a", epochs=3)
    train(tmp_path / "b", max_steps=stop_at)
    assert sorted(p.name for p in (tmp_path / "b").glob("step-*"))[-1] == f"step-{stop_at:09d}"
    resumed, _ = train(tmp_path / "b", epochs=3)
    assert_states_equal(resumed, straight)


def test_resume_under_mixed_precision_with_skipped_updates_is_bit_identical(tmp_path):
    import math as m

    def run_on(path, offset=0, **options):
        calls = []

        def overflows_now_and_then(model, batch):
            calls.append(1)
            loss, metrics = run_script.step(model, batch)
            return (loss * m.inf if (len(calls) + offset) % 7 == 0 else loss), metrics

        model = run_script.model().float()
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        data = TensorDataset(run_script.dataset().tensors[0].float(), run_script.dataset().tensors[1])
        train = ct.mixed_precision(dtype="fp16")(overflows_now_and_then)
        ct.run(train, state, data, batch_size=12, checkpoint_dir=path, num_workers=0, progress=False, **options)
        return state

    straight = run_on(tmp_path / "a", epochs=3)
    run_on(tmp_path / "b", max_steps=9)  # 10 calls: one skipped at the 7th
    resumed = run_on(tmp_path / "b", epochs=3, offset=10)  # its call count goes on where the first left off
    assert_states_equal(resumed, straight)
    assert (
        resumed.state_dict()["transforms"]["mixed_precision"] == straight.state_dict()["transforms"]["mixed_precision"]
    )


@pytest.mark.parametrize("damaged", ["state.pt", "rank-0.pt"])
def test_a_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path, damaged):
    straight, _ = train(tmp_path / "a", epochs=3)
    train(tmp_path / "b", epochs=2)
    newest = sorted((tmp_path / "b").glob("step-*"))[-1]
    (newest / damaged).write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint .*step-000000016"):
        resumed, _ = train(tmp_path / "b", epochs=3)
    assert_states_equal(resumed, straight)


def test_a_checkpoint_of_another_model_is_refused_and_nothing_is_overwritten(tmp_path):
    train(tmp_path, epochs=1)

    def files():  # the lock files name their last holder: rewritten by every run
        return {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if not p.name.startswith(".lock-")}

    before = files()
    linear = torch.nn.Linear(6, 2).double()
    other = ct.TrainState(linear, torch.optim.SGD(linear.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"run: the latest checkpoint .*step-000000008 does not fit this model"):
        ct.run(
            run_script.step,
            other,
            run_script.dataset(),
            batch_size=12,
            checkpoint_dir=tmp_path,
            num_workers=0,
            progress=False,
            seed=5,
        )
    assert files() == before


def test_resuming_with_other_data_settings_is_refused_not_looped(tmp_path):
    """A checkpoint at step 5 of batch 12 cannot continue with batch 48 (it used to spin forever)."""
    train(tmp_path, max_steps=5)
    with pytest.raises(
        ValueError, match=r"other data settings \(batch_size was 12, now 48, updates_per_epoch was 8, now 2\)"
    ):
        train(tmp_path, epochs=2, batch_size=48)


def test_a_run_refused_at_resume_still_releases_what_it_set_up(tmp_path, monkeypatch):
    """The model is set up (sharded, wrapped) and the log opened before the checkpoint is read: a refusal
    there releases the runtime state and closes the log, as the end of any run does."""
    from composetrain.driver import run as driver
    from composetrain.driver.monitor import MetricsLog

    train(tmp_path, max_steps=5)
    calls, close = [], driver._Driver.close

    def closing(self):
        calls.append("close")
        close(self)

    monkeypatch.setattr(driver._Driver, "close", closing)
    monkeypatch.setattr(MetricsLog, "close", lambda self: calls.append("log"))
    with pytest.raises(ValueError, match="other data settings"):
        train(tmp_path, epochs=2, batch_size=48)
    assert calls == ["close", "log"]


def test_pruning_keeps_the_newest_and_moves_corrupt_checkpoints_aside(tmp_path):
    straight, _ = train(tmp_path / "a", epochs=3)
    train(tmp_path / "b", epochs=2, keep_checkpoints=1)
    assert sorted(p.name for p in (tmp_path / "b").glob("step-*")) == ["step-000000016"]
    bogus = tmp_path / "b" / "step-000000099"  # newer than anything, and unreadable
    bogus.mkdir()
    (bogus / "state.pt").write_bytes(b"junk")
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint .*step-000000099"):
        resumed, result = train(tmp_path / "b", epochs=3, keep_checkpoints=1)
    assert_states_equal(resumed, straight)
    assert sorted(p.name for p in (tmp_path / "b").glob("*step-*")) == ["corrupt-step-000000099", "step-000000024"]
    assert result.checkpoint == tmp_path / "b" / "step-000000024" and result.checkpoint.is_dir()


def test_a_dataloader_given_as_is_resumes_mid_epoch_exactly(tmp_path):
    """RandomSampler draws its shuffle from the global RNG: replayed from the epoch's start."""
    from torch.utils.data import DataLoader

    def given_loader():
        return DataLoader(run_script.dataset(), batch_size=12, shuffle=True)

    def run_on(path, **options):
        state = run_script.state()
        ct.run(
            ct.accumulate(2)(run_script.step),
            state,
            given_loader(),
            checkpoint_dir=path,
            progress=False,
            seed=5,
            log_every=4,
            **options,
        )
        return state

    straight = run_on(tmp_path / "a", epochs=3)
    run_on(tmp_path / "b", max_steps=11)
    assert_states_equal(run_on(tmp_path / "b", epochs=3), straight)


@pytest.mark.parametrize(
    ("options", "evaluated_at"), [({}, [8, 16]), ({"eval_every": 5, "checkpoint_every": 5}, [5, 10, 15])]
)
def test_a_failing_evaluation_keeps_its_checkpoint_and_the_resumed_run_evaluates_again(tmp_path, options, evaluated_at):
    calls = []

    def fails_once(model, batch):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("evaluation crashed")
        return accuracy(model, batch)

    options = {"epochs": 2, "eval_data": run_script.dataset(24), **options}
    with pytest.raises(RuntimeError, match="evaluation crashed"):
        train(tmp_path / "b", eval_step=fails_once, **options)
    assert (tmp_path / "b" / f"step-{evaluated_at[0]:09d}").is_dir()  # saved before the evaluation
    resumed, result = train(tmp_path / "b", eval_step=accuracy, **options)
    straight, expected = train(tmp_path / "a", eval_step=accuracy, **options)
    assert_states_equal(resumed, straight)
    assert [e["step"] for e in result.evals] == evaluated_at and result.evals == expected.evals


def indexed(n=20):
    """Samples that carry their index, so that a run's spy can tell which were trained on."""
    x, y = run_script.dataset(n).tensors
    return TensorDataset(x, y, torch.arange(n))


def run_given(path, make_loader, seen, **options):
    def spy(model, batch):
        x, y, i = batch
        seen.extend(i.tolist())
        return run_script.step(model, (x, y))

    state = run_script.state()
    ct.run(spy, state, make_loader(), checkpoint_dir=path, progress=False, seed=5, log_every=3, **options)
    return state


def assert_resumes_exactly(tmp_path, make_loader, stop, epochs=2):
    """Stopped after ``stop`` updates and rerun to ``epochs``: every sample once per epoch, in the
    uninterrupted run's order, and the same parameters bit for bit (dropout draws from the restored RNG)."""
    straight_seen, seen = [], []
    straight = run_given(tmp_path / "a", make_loader, straight_seen, epochs=epochs)
    run_given(tmp_path / "b", make_loader, seen, max_steps=stop)
    resumed = run_given(tmp_path / "b", make_loader, seen, epochs=epochs)
    n = len(make_loader().dataset)
    assert [sorted(seen[e * n : (e + 1) * n]) for e in range(epochs)] == [list(range(n))] * epochs
    assert seen == straight_seen
    assert_states_equal(resumed, straight)


def test_a_given_loader_with_persistent_workers_resumes_exactly(tmp_path):
    """Its first iterator draws the workers' seed before the order, later epochs only the order:
    stopped at update 7 of 2 epochs of 5, 7 of the 20 samples used to be trained twice and 7 never."""
    from torch.utils.data import DataLoader

    def make_loader():
        return DataLoader(indexed(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)

    assert_resumes_exactly(tmp_path, make_loader, stop=7)


def test_a_given_loader_with_its_own_generator_resumes_exactly(tmp_path):
    """The loader's generator decides its shuffle; it used to restart from its seed on resume."""
    from torch.utils.data import DataLoader

    def make_loader():
        return DataLoader(indexed(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))

    assert_resumes_exactly(tmp_path, make_loader, stop=7)
    assert_resumes_exactly(tmp_path / "at-an-epoch-end", make_loader, stop=5, epochs=3)


@given(
    n=st.integers(3, 10),
    batch_size=st.integers(1, 4),
    shuffle=st.booleans(),
    generator=st.sampled_from([None, "loader", "sampler"]),
    data=st.data(),
)
def test_any_given_loader_resumes_with_every_sample_once_per_epoch(n, batch_size, shuffle, generator, data):
    """Shuffled or not, drawing from the global RNG, the loader's generator or the sampler's own,
    stopped after any update: the rerun trains each sample once per epoch, as the straight run did."""
    from torch.utils.data import DataLoader, RandomSampler

    def make_loader():
        dataset, g = indexed(n), torch.Generator().manual_seed(3)
        if generator == "sampler" and shuffle:
            return DataLoader(dataset, batch_size=batch_size, sampler=RandomSampler(dataset, generator=g))
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=g if generator else None)

    stop = data.draw(st.integers(1, 2 * -(-n // batch_size) - 1), label="stop")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny steps: threads only add overhead on a busy machine
    try:
        with tempfile.TemporaryDirectory() as tmp:
            assert_resumes_exactly(Path(tmp), make_loader, stop=stop)
    finally:
        torch.set_num_threads(threads)


def test_a_given_loader_with_a_distributed_sampler_resumes_exactly(tmp_path):
    """Its order is decided by its seed and the epoch ct.run sets: both restored for the epoch resumed,
    so that a sampler rebuilt with another seed still finishes the epoch it joins with each sample once."""
    from torch.utils.data import DataLoader, DistributedSampler

    def loader_with(seed):
        dataset = indexed()
        return DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=seed))

    assert_resumes_exactly(tmp_path, lambda: loader_with(7), stop=7)
    seen = []
    run_given(tmp_path / "c", lambda: loader_with(7), seen, max_steps=7)
    run_given(tmp_path / "c", lambda: loader_with(8), seen, epochs=2)
    assert sorted(seen[20:]) == list(range(20))


@pytest.mark.parametrize(
    ("second", "pattern"),
    [
        ("no generator", r"continues a DataLoader that drew from 1 generator\(s\) of its own, and this one has 0"),
        ("the dataset", r"stopped inside an epoch of a DataLoader given as is, and this run got a Dataset"),
    ],
)
def test_a_given_loader_whose_order_cannot_continue_is_refused_before_anything_changes(tmp_path, second, pattern):
    from torch.utils.data import DataLoader

    def make_loader():
        return DataLoader(indexed(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))

    run_given(tmp_path, make_loader, [], max_steps=7)
    other = {
        "no generator": lambda: DataLoader(indexed(), batch_size=4, shuffle=True),
        "the dataset": lambda: indexed(),
    }[second]
    state = run_script.state()
    before = [p.clone() for p in state.model.parameters()]
    with pytest.raises(ValueError, match=r"run: checkpoint .*step-000000007 " + pattern):
        ct.run(
            lambda m, b: run_script.step(m, b[:2]),
            state,
            other(),
            batch_size=4,
            checkpoint_dir=tmp_path,
            progress=False,
            seed=5,
            epochs=2,
            num_workers=0,
        )
    assert state.step == 0 and all(torch.equal(p, q) for p, q in zip(before, state.model.parameters(), strict=True))

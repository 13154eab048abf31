"""ct.run: epochs and steps, shuffles, logging without host syncs, exact resume, pre-emption, bad input."""

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import hypothesis.strategies as st
import pytest
import run_script
import torch
from dist_pool import Pool, free_port
from helpers import assert_states_equal
from hypothesis import given, settings
from launching import Job, alive, wait_all
from torch.utils.data import Dataset, TensorDataset

import composetrain as ct
from composetrain.driver import loading as ct_loading

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "run_script.py")


def train(tmp=None, **options):
    state = run_script.state()
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 4, **options}
    result = ct.run(ct.accumulate(2)(run_script.step), state, run_script.dataset(), checkpoint_dir=tmp, **options)
    return state, result


# -- the loop -------------------------------------------------------------------------------------
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


def test_metrics_are_read_only_at_log_points(monkeypatch):
    state = run_script.state()
    reads = []
    for name in ("item", "tolist"):
        original = getattr(torch.Tensor, name)

        def spy(self, original=original, name=name):
            if self.is_floating_point():  # metrics; not the loader's integer seed draws
                reads.append(state.step)
            return original(self)

        monkeypatch.setattr(torch.Tensor, name, spy)
    result = ct.run(
        ct.accumulate(2)(run_script.step),
        state,
        run_script.dataset(),
        batch_size=12,
        epochs=2,
        log_every=5,
        num_workers=0,
        progress=False,
    )
    monkeypatch.undo()
    assert reads and set(reads) == {5, 8, 10, 15, 16}  # multiples of 5, and each epoch's end
    assert all(isinstance(v, (int, float)) for r in result.history for v in r.values())  # no tensors kept


def test_history_and_metrics_file(tmp_path):
    _, result = train(tmp_path, epochs=2)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == result.history
    assert {"step", "epoch", "loss", "acc", "lr", "skipped", "updates_per_s", "data_wait"} <= lines[0].keys()
    assert lines[-1]["loss"] < lines[0]["loss"]


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
    spare = ct_loading.auto_workers()
    if spare > 0:
        assert f"raise num_workers (now 0; this process has cores for {spare})" in result.bottleneck
    else:
        assert "already use every spare core" in result.bottleneck
    _, fast = train(epochs=1)
    assert fast.bottleneck.startswith("compute-bound")


# -- exact resume ----------------------------------------------------------------------------------
def test_resuming_after_k_epochs_is_bit_identical_to_running_straight(tmp_path):
    straight, straight_result = train(tmp_path / "a", epochs=4)
    train(tmp_path / "b", epochs=2)
    resumed, resumed_result = train(tmp_path / "b", epochs=4)  # the same command, a larger total
    assert_states_equal(resumed, straight)
    assert untimed(resumed_result.history) == untimed(straight_result.history)


def untimed(history):
    return [{k: v for k, v in r.items() if k not in ("updates_per_s", "data_wait")} for r in history]


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
            run_script.step, other, run_script.dataset(), batch_size=12, checkpoint_dir=tmp_path, num_workers=0,
            progress=False, seed=5,
        )  # fmt: skip
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


def test_a_loader_without_length_is_refused():
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(run_script.dataset())

    with pytest.raises(TypeError, match="a DataLoader over an IterableDataset has no length"):
        ct.run(run_script.step, run_script.state(), DataLoader(Stream(), batch_size=4), progress=False)


def test_the_metrics_file_after_a_crash_holds_each_record_once(tmp_path):
    train(tmp_path, max_steps=6, checkpoint_every=3)  # logs at 4, checkpoint at 3 and 6
    checkpoint_6 = tmp_path / "step-000000006"
    import shutil

    shutil.rmtree(checkpoint_6)  # as if killed after logging step 4 and before saving step 6
    _, result = train(tmp_path, epochs=2, checkpoint_every=3)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [r["step"] for r in result.history] == [4, 8, 12, 16]


# -- processes killed and signalled ------------------------------------------------------------------
def launch(*args, env=None):
    """run_script.py with ``args``; use it in a ``with`` block (killed with all it started on the way out)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return Job([sys.executable, SCRIPT, *args], env)


def finish(job, timeout=180):
    """Its exit code and output; killed with all it started, and the test failed, past ``timeout``."""
    with job:
        return job.finish(timeout)


def wait_for(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never came true")
        time.sleep(0.05)


def final(path):
    return torch.load(path.with_name(f"{path.stem}-rank0{path.suffix}"), weights_only=False)


def straight_run(tmp_path):
    code, out = finish(
        launch("--dir", str(tmp_path / "straight"), "--out", str(tmp_path / "straight.pt"), "--epochs", "3")
    )
    assert code == 0, out
    return final(tmp_path / "straight.pt")


def assert_same_training(a, b):
    for k, v in a["state"]["model"].items():
        assert torch.equal(v, b["state"]["model"][k]), k
    assert a["state"]["step"] == b["state"]["step"] and untimed(a["history"]) == untimed(b["history"])


def job_args(tmp_path, *extra):
    """The resumable job of these tests: 3 epochs into tmp_path/job, its result in tmp_path/job.pt."""
    return ["--dir", str(tmp_path / "job"), "--out", str(tmp_path / "job.pt"), "--epochs", "3", *extra]


def test_sigkill_during_training_resumes_from_the_last_checkpoint_bit_identically(tmp_path):
    straight = straight_run(tmp_path)
    job = job_args(tmp_path, "--checkpoint-every", "3")
    with launch(*job, "--step-delay", "0.05") as proc:
        wait_for(lambda: len(list((tmp_path / "job").glob("step-*"))) >= 2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    code, out = finish(launch(*job))
    assert code == 0, out
    assert_same_training(final(tmp_path / "job.pt"), straight)


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_valid(tmp_path):
    straight = straight_run(tmp_path)
    job = job_args(tmp_path, "--checkpoint-every", "3")
    with launch(*job, "--slow-save", "3") as proc:  # hangs inside the second save, after its first file
        job_dir = tmp_path / "job"
        wait_for(lambda: list(job_dir.glob(".step-*.tmp")) and len(list(job_dir.glob("step-*"))) == 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    code, out = finish(launch(*job))
    assert code == 0, out
    assert not list((tmp_path / "job").glob(".step-*.tmp"))
    assert_same_training(final(tmp_path / "job.pt"), straight)


def logged(path):
    """Whether the run wrote its first record (ct.run creates the file earlier, when it checks it is writable)."""
    return path.exists() and path.stat().st_size > 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_sigterm_saves_and_exits_cleanly_and_a_rerun_continues(tmp_path, sig):
    straight = straight_run(tmp_path)
    job = job_args(tmp_path)
    with launch(*job, "--step-delay", "0.05") as proc:
        wait_for(lambda: logged(tmp_path / "job" / "metrics.jsonl"))  # training began: the handlers are in place
        proc.send_signal(sig)
        code, out = finish(proc)
    assert code == 0 and "PREEMPTED" in out, out
    stopped = final(tmp_path / "job.pt")
    assert 0 < stopped["steps"] < 24
    assert (tmp_path / "job" / f"step-{stopped['steps']:09d}").is_dir()  # saved where it stopped
    code, out = finish(launch(*job))
    assert code == 0 and "DONE" in out, out
    assert_same_training(final(tmp_path / "job.pt"), straight)


def test_preemption_under_slurm_requeues_the_job(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "requeued"}\n')
    (fake / "scontrol").chmod(0o755)
    job = job_args(tmp_path, "--step-delay", "0.05")
    with launch(*job, env={"PATH": f"{fake}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}) as proc:
        wait_for(lambda: logged(tmp_path / "job" / "metrics.jsonl"))  # training began: the handlers are in place
        proc.send_signal(signal.SIGUSR1)
        code, out = finish(proc)
    assert code == 0, out
    assert (tmp_path / "requeued").read_text().strip() == "requeue 4242"


SLEEPER = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {worker.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


@pytest.mark.parametrize("ending", ["timeout", "error"])
def test_a_launched_job_is_killed_with_everything_it_started(tmp_path, ending):
    """A job that sleeps, with a worker in a session of its own (as torchrun starts its workers):
    a timeout, or an error in the test while it runs, leaves neither of them running."""
    pids = tmp_path / "pids"
    job = Job([sys.executable, "-c", SLEEPER, str(pids)])
    if ending == "timeout":
        with job:
            wait_for(pids.exists)
            with pytest.raises(pytest.fail.Exception, match=r"still running after 0.5s, killed"):
                job.finish(timeout=0.5)
    else:
        with pytest.raises(TimeoutError), job:
            wait_for(pids.exists)
            wait_for(lambda: False, timeout=0.5)  # the test gives up while the job still runs
    parent, worker = (int(p) for p in pids.read_text().split())
    assert job.returncode == -signal.SIGKILL
    for pid, who in ((parent, "the job"), (worker, "its worker")):
        with contextlib.suppress(TimeoutError):
            wait_for(lambda pid=pid: not alive(pid), timeout=5)  # SIGKILL is delivered asynchronously
        assert not alive(pid), f"{who} (pid {pid}) is still running"  # killed: gone, or a zombie


def test_waiting_for_several_jobs_kills_them_all_as_soon_as_one_fails(tmp_path):
    """As a rank that crashes leaves the others waiting in the rendezvous: no waiting for the timeout."""
    pids = tmp_path / "pids"
    with Job([sys.executable, "-c", SLEEPER, str(pids)]) as waiting:
        wait_for(pids.exists)
        failing = Job([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
        start = time.monotonic()
        expected = r"a process failed, the others were killed(?s:.)*exit 3:\nboom"
        with pytest.raises(pytest.fail.Exception, match=expected):
            wait_all([waiting, failing], timeout=120)
        assert time.monotonic() - start < 60
    for pid in (int(p) for p in pids.read_text().split()):
        with contextlib.suppress(TimeoutError):
            wait_for(lambda pid=pid: not alive(pid), timeout=5)
        assert not alive(pid), f"pid {pid} is still running"


def test_a_pool_whose_rank_hangs_is_killed_on_timeout():
    hung = Pool(1)
    try:
        with pytest.raises(TimeoutError, match=r"run_cases.hang: some rank did not reply within 1s"):
            hung.run("run_cases", "hang", timeout=1)
        assert not any(alive(p.pid) for p in hung.procs)
    finally:
        hung.close()


# -- bad input -------------------------------------------------------------------------------------
def quick(**options):
    state = run_script.state()
    data = options.pop("data", run_script.dataset())
    step = options.pop("step", run_script.step)
    return ct.run(step, state, data, **{"num_workers": 0, "progress": False, **options})


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"data": TensorDataset(torch.zeros(0, 6)), "batch_size": 4}, ValueError, r"run: the dataset is empty"),
        ({}, ValueError, r"run: batch_size is required when data is a Dataset, e.g. batch_size=64"),
        (
            {"batch_size": 200, "drop_last": True},
            ValueError,
            r"batch_size=200 on 1 process\(es\) needs 200 samples .* has 96",
        ),
        ({"batch_size": 0}, ValueError, r"batch_size must be a positive int, got 0"),
        (
            {"batch_size": 4, "epochs": 0},
            ValueError,
            r"run: epochs must be a positive int, got 0 .*e\.g\. epochs=10 or None",
        ),
        ({"batch_size": 4, "log_every": 0}, ValueError, r"log_every must be a positive int, got 0"),
        ({"batch_size": 4, "num_workers": -1}, ValueError, r"num_workers must be a non-negative int, got -1 \(int\)"),
        ({"data": 42, "batch_size": 4}, TypeError, r"data must be a torch Dataset or DataLoader, got 42 \(int\)"),
        ({"batch_size": 4, "eval_data": run_script.dataset()}, ValueError, "give eval_step and eval_data together"),
    ],
)
def test_bad_input_is_a_clear_error(options, error, pattern):
    with pytest.raises(error, match=pattern):
        quick(**options)


def test_an_unwritable_checkpoint_dir_is_a_clear_error_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    state = run_script.state()
    before = [p.clone() for p in state.model.parameters()]
    with pytest.raises(PermissionError, match=r"checkpoint_dir .*file/runs' is not writable"):
        ct.run(
            run_script.step, state, run_script.dataset(), batch_size=12, checkpoint_dir=blocker / "runs", progress=False
        )
    assert state.step == 0 and all(torch.equal(p, q) for p, q in zip(before, state.model.parameters(), strict=True))


# -- two ranks ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool():
    p = Pool(2)
    yield p
    p.close()


def test_two_ranks_in_the_pool(pool):
    results = pool.run("run_cases", "two_ranks")
    a, b = results
    assert a["steps"] == b["steps"] == 3 * 4  # 96 samples, 12 per rank per update: 4 updates per epoch
    assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))
    assert a["epoch_firsts"][0] != b["epoch_firsts"][0]  # each rank its own share
    assert a["epoch_firsts"][0] != a["epoch_firsts"][1] != a["epoch_firsts"][2]  # reshuffled every epoch
    assert a["evals"] == b["evals"] and a["evals"][-1]["acc"] == pytest.approx(a["single_process_eval"], abs=1e-12)
    assert untimed(a["history"]) == untimed(b["history"])
    assert {r["global_batch"] for r in a["history"]} == {24}  # 12 per rank: the input of ct.scaled_lr
    with pytest.raises(RuntimeError, match=r"does not synchronise them; wrap it: ct.distributed"):
        pool.run("run_cases", "not_distributed")


def test_two_ranks_log_the_mean_over_the_global_batch_like_one_process(pool):
    """Every logged loss and metric is the mean over all ranks' samples of the window's updates,
    recomputed here in one process from the parameters and micro-batches each rank trained on
    (to float32 rounding: the log reads the values as float32)."""
    import torch.nn.functional as F

    a, b = pool.run("run_cases", "logged_means")
    model = a["model"]
    per_update = []
    for u in range(len(a["seen"]) // 2):  # accumulate(2): two forwards per update on each rank
        calls = [a["seen"][2 * u], a["seen"][2 * u + 1], b["seen"][2 * u], b["seen"][2 * u + 1]]
        params = calls[0][0]
        assert all(torch.equal(p, q) for ps, _ in calls for p, q in zip(ps, params, strict=True))
        x = torch.cat([batch[0] for _, batch in calls])
        y = torch.cat([batch[1] for _, batch in calls])
        assert len(y) == 24  # the global batch: 12 samples on each rank
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(params), model.parameters())
            logits = model(x)
        per_update.append((F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).double().mean().item()))
    assert len(per_update) == 8 == a["history"][-1]["step"]
    start = 0
    for record in a["history"]:
        window = per_update[start : record["step"]]
        start = record["step"]
        assert record["loss"] == pytest.approx(sum(w[0] for w in window) / len(window), rel=1e-6), record
        assert record["acc"] == pytest.approx(sum(w[1] for w in window) / len(window), rel=1e-6), record
    assert untimed(a["history"]) == untimed(b["history"])


def test_a_signal_to_one_rank_stops_every_rank_after_the_same_update(pool):
    a, b = pool.run("run_cases", "signal_one_rank")
    assert a == b and a["preempted"] and a["steps"] == 6 and a["saved"] == "step-000000006"


def test_ranks_with_loaders_of_different_lengths_run_the_same_updates(pool):
    assert pool.run("run_cases", "uneven_loaders") == [8, 8]  # 4 batches per epoch on the shorter rank


def test_an_unwritable_checkpoint_dir_fails_on_every_rank_without_hanging(pool):
    messages = pool.run("run_cases", "unwritable", timeout=60)
    assert all("checkpoint_dir" in m and "is not writable" in m for m in messages)


def test_two_ranks_under_torchrun_resume_bit_identically(tmp_path):
    def torchrun(*args):
        port = free_port()
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}", SCRIPT, *args,
        ]  # fmt: skip
        code, out = finish(Job(command, {**os.environ, "OMP_NUM_THREADS": "1"}), timeout=300)
        assert code == 0, out[-6000:]

    torchrun("--dir", str(tmp_path / "a"), "--out", str(tmp_path / "a.pt"), "--epochs", "2")
    torchrun("--dir", str(tmp_path / "b"), "--out", str(tmp_path / "b.pt"), "--max-steps", "3")
    torchrun("--dir", str(tmp_path / "b"), "--out", str(tmp_path / "b.pt"), "--epochs", "2")
    for rank in range(2):
        a = torch.load(tmp_path / f"a-rank{rank}.pt", weights_only=False)
        b = torch.load(tmp_path / f"b-rank{rank}.pt", weights_only=False)
        assert_same_training(a, b)
        assert a["state"]["step"] == 2 * 4
        assert a["threads_left"] in ([], None), "ct.run left the process group alive (its DDP wrapper?)"


def test_every_rank_refuses_eval_metric_names_that_differ_between_ranks(pool):
    messages = pool.run("run_cases", "eval_names_differ", timeout=50)
    expected = (
        "ValueError: run: eval_step returned different metric names on different ranks (rank 0: ['acc']; "
        "rank 1: ['acc', 'extra']); return the same names on every rank"
    )
    assert messages == [expected, expected]


def test_an_evaluation_failing_on_one_rank_fails_every_rank(pool):
    messages = pool.run("run_cases", "eval_fails_on_one_rank", timeout=50)
    assert messages == [
        "RuntimeError: run: evaluation failed on rank 1: RuntimeError: the eval step broke",
        "RuntimeError: the eval step broke",
    ]


def test_every_rank_refuses_training_metric_names_that_differ_between_ranks(pool):
    messages = pool.run("run_cases", "train_names_differ", timeout=50)
    expected = (
        "ValueError: run: the step returned different metric names on different ranks (rank 0: ['acc']; "
        "rank 1: ['acc', 'extra']); return the same names on every rank"
    )
    assert messages == [expected, expected]


def test_every_rank_logs_the_window_a_stop_cut_short(pool):
    a, b = pool.run("run_cases", "stop_inside_a_window", timeout=50)
    assert [r["step"] for r in a] == [3] and untimed(a) == untimed(b)


# -- hardening: evaluation, logging, ct.run's arguments ------------------------------------------------
def accuracy(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).double().mean()}


def test_an_eval_metric_missing_from_some_batches_is_refused_not_diluted():
    calls = []

    def sometimes_extra(model, batch):  # 50 samples in batches of 12: 5 batches, "extra" in the 3rd only
        calls.append(1)
        return {**accuracy(model, batch), **({"extra": 1.0} if len(calls) == 3 else {})}

    state = run_script.state()
    with pytest.raises(ValueError) as caught:
        ct.run(
            ct.accumulate(2)(run_script.step), state, run_script.dataset(), batch_size=12, num_workers=0,
            progress=False, eval_step=sometimes_extra, eval_data=run_script.dataset(50),
        )  # fmt: skip
    assert str(caught.value) == (
        "run: eval_step returned metric 'extra' for batch 3 but not for batch 1 (metrics ['acc', 'extra'] against "
        "['acc']); return the same metric names for every batch"
    )
    assert state.model.training  # evaluation leaves train mode restored, also when it fails


@pytest.mark.parametrize(
    ("metric", "shown"),
    [(torch.ones(12, dtype=torch.float64), "shape (12,)"), ("high", "'high' (str)")],
)
def test_a_non_scalar_eval_metric_is_a_clear_error(metric, shown):
    def evaluate(model, batch):
        return {"acc": metric}

    with pytest.raises(ValueError) as caught:
        quick(batch_size=12, eval_step=evaluate, eval_data=run_script.dataset(24))
    assert str(caught.value) == (
        f"run: eval_step's metric 'acc' must be a scalar (the batch mean), got {shown} for batch 1; reduce it, "
        "e.g. (pred == y).double().mean()"
    )


def test_training_metric_names_that_change_between_updates_are_a_clear_error():
    calls = []

    def sometimes_extra(model, batch):
        calls.append(1)
        loss, metrics = run_script.step(model, batch)
        return loss, {**metrics, **({"extra": 1.0} if len(calls) == 7 else {})}

    with pytest.raises(ValueError) as caught:
        quick(batch_size=12, log_every=4, step=sometimes_extra)
    assert str(caught.value) == (
        "run: the step returned metric 'extra' for update 3 since the last log point but not for update 1 "
        "(metrics ['acc', 'extra'] against ['acc']); return the same metric names from every update"
    )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"seed": "abc"}, TypeError, "run: seed must be a non-negative int, got 'abc' (str); e.g. seed=0"),
        ({"seed": 2.5}, TypeError, "run: seed must be a non-negative int, got 2.5 (float); e.g. seed=0"),
        ({"seed": -1}, ValueError, "run: seed must be a non-negative int, got -1 (int); e.g. seed=0"),
        ({"seed": 2**64}, ValueError, f"run: seed must be below 2**32, got {2**64} (int); e.g. seed=0"),
        (
            {"max_steps": 2.0},
            TypeError,
            "run: max_steps must be a positive int, got 2.0 (float); e.g. max_steps=10 or None",
        ),
        (
            {"shuffle": "no"},
            TypeError,
            "run: shuffle must be True or False (or None: the default), got 'no' (str); e.g. shuffle=True",
        ),
        (
            {"drop_last": 1},
            TypeError,
            "run: drop_last must be True or False (or None: the default), got 1 (int); e.g. drop_last=True",
        ),
        ({"progress": "yes"}, TypeError, "run: progress must be True or False, got 'yes' (str); e.g. progress=True"),
        ({"requeue": None}, TypeError, "run: requeue must be True or False, got None (NoneType); e.g. requeue=True"),
        *(
            (
                {"timeout": bad},
                error,
                f"run: timeout must be a positive, finite number, got {shown}; e.g. timeout=300 (seconds)",
            )
            for bad, error, shown in [
                (0, ValueError, "0 (int)"),
                (-1.0, ValueError, "-1.0 (float)"),
                (float("inf"), ValueError, "inf (float)"),
                ("5", TypeError, "'5' (str)"),  # a wrong kind is a TypeError, as for every option
            ]
        ),
        (
            {"checkpoint_every": 3},
            ValueError,
            "run: checkpoint_every=3 but no checkpoint_dir to save in; give checkpoint_dir, or leave "
            "checkpoint_every out",
        ),
        (
            {"eval_every": 3},
            ValueError,
            "run: eval_every=3 but no eval_step to evaluate with; give eval_step and eval_data, or leave "
            "eval_every out",
        ),
    ],
)
def test_bad_run_options_are_refused_before_anything_runs(options, error, message):
    state = run_script.state()
    before = [p.detach().clone() for p in state.model.parameters()]
    with pytest.raises(error) as caught:
        ct.run(run_script.step, state, run_script.dataset(), batch_size=12, num_workers=0, **options)
    assert str(caught.value) == message
    assert state.step == 0 and all(torch.equal(p, q) for p, q in zip(before, state.model.parameters(), strict=True))


def test_options_a_given_dataloader_would_ignore_are_refused():
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    fix = "leave it out (the DataLoader is used as given), or pass the Dataset and let ct.run build the loader"
    shuffled = DataLoader(run_script.dataset(), batch_size=12, shuffle=True)
    custom = DataLoader(run_script.dataset(), batch_sampler=BatchSampler(SequentialSampler(range(96)), 12, False))
    for loader, options, message in [
        (shuffled, {"batch_size": 24}, f"run: batch_size=24 but the DataLoader given batches by 12; {fix}"),
        (custom, {"batch_size": 12}, f"run: batch_size=12 but the DataLoader given batches by its BatchSampler; {fix}"),
        (shuffled, {"drop_last": True}, f"run: drop_last=True but the DataLoader given has drop_last=False; {fix}"),
        (
            shuffled,
            {"shuffle": False},
            f"run: shuffle=False but the DataLoader given has a RandomSampler (shuffled); {fix}",
        ),
    ]:
        with pytest.raises(ValueError) as caught:
            ct.run(run_script.step, run_script.state(), loader, progress=False, **options)
        assert str(caught.value) == message
    # the loader's own values, and the defaults, are no error; a Dataset for eval_data batches as the loader does
    state = run_script.state()
    result = ct.run(
        run_script.step, state, shuffled, batch_size=12, shuffle=True, drop_last=False, progress=False,
        eval_step=accuracy, eval_data=run_script.dataset(50),
    )  # fmt: skip
    assert state.step == 8 and len(result.evals) == 1


def test_a_run_stopped_inside_a_logging_window_logs_it(tmp_path):
    _, short = train(max_steps=3, log_every=50)
    assert [r["step"] for r in short.history] == [3]
    _, stopped = train(tmp_path / "b", max_steps=5)  # logs at 4, then the one-update window of step 5
    assert [r["step"] for r in stopped.history] == [4, 5]
    _, resumed = train(tmp_path / "b", epochs=2)  # the checkpoint at 5 still holds its window: exact history
    _, straight = train(epochs=2)
    assert untimed(resumed.history) == untimed(straight.history)
    lines = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert untimed(lines) == untimed(straight.history)


@settings(max_examples=12)
@given(max_steps=st.integers(1, 20), log_every=st.integers(1, 12))
def test_every_update_is_logged_exactly_once(max_steps, log_every):
    """The records' windows cover every update once: log points, epoch ends (8 updates each), the stop."""
    losses = []

    def spy(model, batch):
        loss, metrics = run_script.step(model, batch)
        losses.append(loss.item())
        return loss, metrics

    result = ct.run(
        spy, run_script.state(), run_script.dataset(), batch_size=12, num_workers=0, progress=False,
        max_steps=max_steps, log_every=log_every,
    )  # fmt: skip
    steps = [r["step"] for r in result.history]
    assert steps == sorted({s for s in range(1, max_steps + 1) if s % log_every == 0 or s % 8 == 0} | {max_steps})
    windows = [b - a for a, b in zip([0, *steps], steps, strict=False)]
    weighted = sum(r["loss"] * n for r, n in zip(result.history, windows, strict=True))
    assert weighted == pytest.approx(sum(losses), rel=1e-6)  # float32 losses, averaged in float64


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


def test_a_log_file_of_another_run_is_moved_aside_and_a_resumed_run_keeps_its_own(tmp_path):
    import warnings

    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "run": "another"}\n')
    with pytest.warns(
        UserWarning, match=r"log.jsonl' held 1 lines that are not this run's .* moved them to .*log.jsonl.1'"
    ):
        train(tmp_path / "b", max_steps=5, log_file=log)
    assert (tmp_path / "log.jsonl.1").read_text() == '{"step": 1, "run": "another"}\n'
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the run's own log is continued, not moved aside
        _, resumed = train(tmp_path / "b", epochs=2, log_file=log)
    assert [json.loads(line) for line in log.read_text().splitlines()] == resumed.history
    with pytest.warns(UserWarning, match=r"moved them to .*log.jsonl.2'"):  # a fresh run never overwrites it
        _, fresh = train(epochs=1, log_file=log)
    assert [json.loads(line) for line in log.read_text().splitlines()] == fresh.history
    assert [json.loads(line) for line in (tmp_path / "log.jsonl.2").read_text().splitlines()] == resumed.history


def test_a_half_launched_job_says_what_is_missing(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError) as caught:
        ct.run(ct.distributed(run_script.step), run_script.state(), run_script.dataset(), batch_size=12)
    assert str(caught.value) == (
        "rendezvous: WORLD_SIZE=2 is set but RANK is not: launch with torchrun, or set RANK, LOCAL_RANK, "
        "MASTER_ADDR, MASTER_PORT (or unset WORLD_SIZE to run a single process)"
    )


def test_an_unwritable_log_file_is_a_clear_error_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    state = run_script.state()
    with pytest.raises(PermissionError, match=r"run: log_file '.*file/log.jsonl' is not writable \(.*\); choose a"):
        ct.run(run_script.step, state, run_script.dataset(), batch_size=12, log_file=blocker / "log.jsonl")
    assert state.step == 0


# -- resuming a DataLoader given as is -----------------------------------------------------------------
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
            lambda m, b: run_script.step(m, b[:2]), state, other(), batch_size=4, checkpoint_dir=tmp_path,
            progress=False, seed=5, epochs=2, num_workers=0,
        )  # fmt: skip
    assert state.step == 0 and all(torch.equal(p, q) for p, q in zip(before, state.model.parameters(), strict=True))


# -- evaluations in the metrics file, TensorBoard ---------------------------------------------------
def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_evaluations_are_logged_and_a_resumed_run_writes_the_same_file(tmp_path):
    from run_cases import evaluate

    options = {"epochs": 3, "eval_step": evaluate, "eval_data": run_script.dataset(30), "eval_every": 5}
    _, straight = train(tmp_path / "a", **options)
    train(tmp_path / "b", max_steps=11, **options)  # stopped inside the second epoch
    train(tmp_path / "b", **options)
    a, b = read_lines(tmp_path / "a" / "metrics.jsonl"), read_lines(tmp_path / "b" / "metrics.jsonl")
    kinds = [(r["step"], "eval" in r) for r in a]
    assert kinds == [(r["step"], "eval" in r) for r in b]
    evals = [r for r in a if "eval" in r]
    assert [e["step"] for e in evals] == [e["step"] for e in straight.evals] == [5, 10, 15, 20]
    assert [e["eval"] for e in evals] == [
        {k: v for k, v in e.items() if k not in ("step", "epoch")} for e in straight.evals
    ]
    assert [e["eval"] for e in evals] == [e["eval"] for e in b if "eval" in e]
    assert [r["loss"] for r in a if "loss" in r] == [r["loss"] for r in b if "loss" in r]


def test_tensorboard_gets_training_and_evaluation_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from run_cases import evaluate
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    options = {"epochs": 2, "eval_step": evaluate, "eval_data": run_script.dataset(30), "tensorboard": True}
    _, result = train(tmp_path, **options)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/acc", "train/lr", "eval/acc"} <= set(tags)
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in result.history]
    assert [e.value for e in events.Scalars("eval/acc")] == pytest.approx([e["acc"] for e in result.evals])


def test_tensorboard_needs_somewhere_to_write():
    state = run_script.state()
    with pytest.raises(ValueError, match=r"tensorboard=True writes beside the metrics file, but there is none"):
        ct.run(run_script.step, state, run_script.dataset(), batch_size=12, tensorboard=True, progress=False)
    with pytest.raises(TypeError, match=r"tensorboard must be True, False or a folder, got 1 \(int\)"):
        ct.run(run_script.step, state, run_script.dataset(), batch_size=12, tensorboard=1, progress=False)
    assert state.step == 0


# -- found by an adversarial review ------------------------------------------------------------------
def test_evaluation_restores_each_submodules_own_mode():
    """A frozen BatchNorm stays in eval mode after ct.run's evaluation, not only the model's flag."""
    from run_cases import evaluate

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
    ct.run(step, state, run_script.dataset(), batch_size=12, epochs=2, eval_step=evaluate,
           eval_data=run_script.dataset(30), num_workers=0, progress=False)  # fmt: skip
    assert frozen.training and set(seen) == {expected}  # the same modes before and after each evaluation


@pytest.mark.parametrize("name", ["loss", "step", "lr", "data_wait"])
def test_a_metric_named_like_a_record_field_is_refused(name):
    def step(model, batch):
        loss, metrics = run_script.step(model, batch)
        return loss, {**metrics, name: 1.0}

    with pytest.raises(ValueError, match=rf"the step returns metric '{name}', a name ct.run's training records"):
        ct.run(step, run_script.state(), run_script.dataset(), batch_size=12, num_workers=0, progress=False)


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"eval_step": 5, "eval_data": None}, TypeError, r"run: eval_step must be a function, got 5 \(int\)"),
        ({"collate_fn": 5}, TypeError, r"run: collate_fn must be a function, got 5 \(int\)"),
        ({"num_workers": "many"}, TypeError, r"run: num_workers must be a non-negative int, got 'many' \(str\)"),
        (
            {"data": "tuple"},
            TypeError,
            r"run: data must be a Dataset or DataLoader, got \(tensor.*TensorDataset\(x, y\)",
        ),
        ({"data": "dict"}, TypeError, r"run: data must be a Dataset or DataLoader, got \{'x'"),
        ({"data": "loader", "collate_fn": list}, ValueError, r"run: collate_fn is given but so is a DataLoader"),
    ],
)
def test_data_and_functions_of_the_wrong_kind_are_refused_before_training(options, error, pattern):
    x, y = run_script.dataset().tensors
    data = {"tuple": (x, y), "dict": {"x": x, "y": y}, "loader": torch.utils.data.DataLoader(run_script.dataset(), 12)}
    options = {"data": run_script.dataset(), "batch_size": 12, "progress": False, **options}
    options["data"] = (
        data.get(options["data"], options["data"]) if isinstance(options["data"], str) else options["data"]
    )
    if options["data"] is data["loader"]:
        del options["batch_size"]
    state = run_script.state()
    with pytest.raises(error, match=pattern):
        ct.run(run_script.step, state, **options)
    assert state.step == 0


def test_a_numpy_integer_seed_is_an_int_seed():
    np = pytest.importorskip("numpy")
    a, _ = train(max_steps=3, seed=np.int64(5))
    b, _ = train(max_steps=3, seed=5)
    assert_states_equal(a, b)

"""The global sample sequence of ``ct.run(global_batch_size=G)`` (driver/global_batches.py), in one process: each
epoch's updates hold every sample once, whatever the number of processes sharing them; ranks read contiguous,
near-equal shares; a run stopped anywhere starts the next update; on one process it is the ``batch_size`` run;
the loader's workers read what it says; what it cannot run is refused with the numbers and the fix.
The same job on 2 and 3 real processes, resumed across them: tests/test_resume_anywhere.py.
"""

import json
import os
import shutil
import signal

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from helpers import (
    GLOBAL_BATCH,
    SAMPLES,
    global_batch_job,
    global_batch_refusal,
    global_batch_state,
    indexed_dataset,
    indexed_loss,
    reseal,
)
from hypothesis import given
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

import composetrain as ct
from composetrain.checkpoint.format import SHARED, read
from composetrain.core.metric_names import MEASURED
from composetrain.driver.global_batches import GlobalBatches, global_problem, share, world_sizes


@st.composite
def sequences(draw):
    samples = draw(st.integers(1, 60))
    global_batch = draw(st.integers(1, 12))
    world = draw(st.sampled_from(world_sizes(global_batch, limit=4)))
    options = {"shuffle": draw(st.booleans()), "seed": draw(st.integers(0, 2**32 - 1))}
    options["drop_last"] = draw(st.booleans())
    return samples, global_batch, world, options


def epoch_of(samples, global_batch, world, options, epoch, start=0):
    """Each rank's batches of one epoch, from update ``start`` on."""
    ranks = [GlobalBatches(samples, global_batch, rank=r, world_size=world, **options) for r in range(world)]
    for r in ranks:
        r.set_epoch(epoch, start=start * r.per_rank)
    return [list(r) for r in ranks]


@given(sequences(), st.integers(0, 3))
def test_each_update_is_the_same_samples_on_any_number_of_processes(sequence, epoch):
    samples, global_batch, world, options = sequence
    one = epoch_of(samples, global_batch, 1, options, epoch)[0]
    shares = epoch_of(samples, global_batch, world, options, epoch)
    full, short = divmod(samples, global_batch)
    kept = short > 0 and not options["drop_last"]
    assert (
        len(one)
        == full + kept
        == GlobalBatches(samples, global_batch, rank=0, world_size=1, **options).updates_per_epoch
    )
    assert [len(u) for u in one] == [global_batch] * full + [short] * kept  # none padded
    seen = [i for u in one for i in u]
    assert len(set(seen)) == len(seen) and set(seen) <= set(range(samples))  # none repeated
    assert len(seen) == samples or options["drop_last"]
    for k, update in enumerate(one):  # each rank a contiguous share, in rank order, near-equal
        assert all(len(s) == len(one) for s in shares)
        assert [i for s in shares for i in s[k]] == update
        sizes = [len(s[k]) for s in shares]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@given(sequences(), st.integers(0, 3), st.data())
def test_a_run_stopped_after_any_update_starts_the_next_one(sequence, epoch, data):
    samples, global_batch, world, options = sequence
    whole = epoch_of(samples, global_batch, world, options, epoch)
    done = data.draw(st.integers(0, len(whole[0])))
    assert epoch_of(samples, global_batch, world, options, epoch, start=done) == [r[done:] for r in whole]


def test_the_order_is_distributed_samplers_and_the_shares_split_as_documented():
    """On one process the order is DistributedSampler's (seed + epoch): global_batch_size is batch_size there."""
    data = TensorDataset(torch.arange(23))
    for epoch in range(3):
        sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        ours = GlobalBatches(23, 23, shuffle=True, seed=7, drop_last=False, rank=0, world_size=1)
        ours.set_epoch(epoch)
        assert list(ours) == [list(sampler)]
    assert [share(4, r, 3) for r in range(3)] == [(0, 2), (2, 3), (3, 4)]
    assert [share(6, r, 3) for r in range(3)] == [(0, 2), (2, 4), (4, 6)]
    assert world_sizes(12) == [1, 2, 3, 4, 6, 12] and world_sizes(6, 4) == [1, 2]
    assert world_sizes(6, at_most=2) == [1, 2]


def test_what_the_processes_cannot_run_is_named_with_the_numbers_and_the_fix():
    assert global_problem(40, 6, 3, False, False) is None
    assert global_problem(40, 6, 4, False, False).startswith(
        "global_batch_size=6 cannot be shared evenly among 4 processes (6 / 4 is not whole); run it on a number of "
        "processes that divides 6 (1, 2, 3, 6), or choose a global_batch_size that 4 divides (e.g. 4 or 8)"
    )
    assert "the dataset has 5 and drop_last=True would leave no update" in global_problem(5, 6, 2, True, False)
    assert global_problem(5, 6, 2, False, False) is None  # one short update of 5: 3 and 2
    assert "short one of 2 sample(s), too few for 3 processes" in global_problem(38, 6, 3, False, False)
    assert global_problem(38, 6, 3, True, False) is None  # dropped
    assert global_problem(40, 6, 2, False, True) is None and "divides both 6 and 4 (1, 2)" in global_problem(
        40, 6, 3, False, True
    )


def test_a_resumed_job_is_not_sent_to_a_global_batch_size_its_checkpoint_refuses():
    """A requeued job on 4 processes of a run of global_batch_size=6: another global_batch_size changes the run,
    which its checkpoints refuse (naming both); the number of processes is the fix there."""
    problem = global_problem(40, 6, 4, False, False)
    assert "a run resumed from its checkpoints keeps the global_batch_size it was saved with" in problem
    assert "resume it on 1, 2, 3 or 6 processes" in problem


def test_under_a_mesh_the_numbers_are_data_shards_and_the_message_says_so():
    """Tensor parallel 2 on 8 processes: 4 data shards share the global batch, so the message counts shards (not the
    processes, which would give the wrong divisors) and says how the job's processes make them."""
    said = global_problem(40, 6, 4, False, False, per_shard=2)
    assert said.startswith(
        "global_batch_size=6 cannot be shared evenly among 4 data shards (6 / 4 is not whole); run it on a number "
        "of data shards that divides 6 (1, 2, 3, 6)"
    )
    assert said.endswith("the job's 8 processes make 4 data shards, and the global batch is shared among the shards)")
    assert "too few for 3 data shards" in global_problem(38, 6, 3, False, False, per_shard=2)
    assert "every data shard must read as many" in global_problem(40, 6, 3, False, True, per_shard=4)
    assert global_problem(40, 6, 3, False, False, per_shard=2) is None


def test_on_one_process_global_batch_size_is_batch_size_bit_for_bit(tmp_path):
    """The order is DistributedSampler's and the shares the whole update: the same samples, the same model."""
    import run_script

    results = []
    for size in ({"batch_size": 12}, {"global_batch_size": 12}):
        s = run_script.state()
        result = ct.run(
            ct.accumulate(2)(run_script.step),
            s,
            run_script.dataset(100),
            num_workers=0,
            progress=False,
            seed=5,
            epochs=2,
            log_every=4,
            **size,
        )
        results.append((s, run_script.untimed(result.history)))
    (a, history_a), (b, history_b) = results
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))
    assert history_a == history_b and {r["global_batch"] for r in history_b} == {12}


class Items(Dataset):
    """A dataset read sample by sample (loader workers read it when asked to)."""

    def __init__(self, n):
        self.data = indexed_dataset(n)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def test_loader_workers_read_the_samples_the_sequence_says(tmp_path):
    """The sequence is the sampler's alone: read by 2 workers, every update gets the samples it gets in this process."""
    seen = {}
    for workers in (0, 2):
        s, found = global_batch_state(), []

        def step(model, batch, found=found, s=s):
            found.append((s.step + 1, batch[2].tolist()))
            return indexed_loss(model, batch)

        ct.run(
            step,
            s,
            Items(SAMPLES),
            global_batch_size=GLOBAL_BATCH,
            epochs=2,
            num_workers=workers,
            progress=False,
            seed=3,
        )
        seen[workers] = (found, [p.detach().clone() for p in s.model.parameters()])
    assert seen[0][0] == seen[2][0] and len(seen[0][0]) == 14
    assert all(torch.equal(p, q) for p, q in zip(seen[0][1], seen[2][1], strict=True))


def test_a_run_stopped_mid_window_in_one_process_resumes_bit_for_bit(tmp_path):
    straight = global_batch_job(0, 1, str(tmp_path / "a"))
    stopped = global_batch_job(0, 1, str(tmp_path / "b"), {"stop_at": 5})
    # the checkpoint keeps the unlogged updates' means over ranks too (here: the one rank's own), for any W
    saved, problem = read(tmp_path / "b" / "step-000000005" / "state.pt", SHARED, lambda v: None)
    assert (
        problem is None
        and saved["settings"]["global_batch_size"] == GLOBAL_BATCH
        and saved["settings"]["batch_size"] is None
    )
    assert [(w["loss"].dtype, w["skipped"]) for w in saved["window"]] == [(torch.float64, False)] * 2  # 4 and 5
    resumed = global_batch_job(0, 1, str(tmp_path / "b"))
    assert stopped["preempted"] and stopped["steps"] == 5 and resumed["steps"] == 14
    assert all(torch.equal(v, resumed["params"][k]) for k, v in straight["params"].items())
    untimed = [{k: v for k, v in r.items() if k not in MEASURED} for r in straight["history"]]
    assert [{k: v for k, v in r.items() if k not in MEASURED} for r in resumed["history"]] == (untimed)


def test_a_changed_global_batch_size_is_refused_naming_both(tmp_path):
    """8 and 9 make the same 5 updates of 40 samples: only the setting itself tells the runs apart."""
    global_batch_job(0, 1, str(tmp_path), {"global_batch_size": 8, "max_steps": 2})
    found = global_batch_refusal(0, 1, str(tmp_path), {"global_batch_size": 9})
    assert found["params_unchanged"] and found["files_after"] == [f for f in found["files_before"] if ".lock" not in f]
    assert (
        found["error"].startswith(
            f"ValueError: run: checkpoint {tmp_path / 'step-000000002'} continues a run of global_batch_size=8, and "
            "this run has global_batch_size=9: it changes the run"
        )
        and "resume with global_batch_size=8" in found["error"]
    )
    other = global_batch_refusal(0, 1, str(tmp_path), {"global_batch_size": None, "batch_size": 8})  # per process, now
    assert other["params_unchanged"] and "other data settings" in other["error"]
    assert "global_batch_size was 8, now None" in other["error"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"batch_size": 4, "global_batch_size": 8},
            "run: batch_size=4 and global_batch_size=8 are both given; give one: batch_size is per process",
        ),
        ({}, "run: batch_size is required when data is a Dataset, e.g. batch_size=64 (per process), or global_batch"),
        ({"global_batch_size": 0}, "global_batch_size"),
        ({"data": "loader", "global_batch_size": 8}, "run: global_batch_size=8 but data is a DataLoader"),
        ({"data": "loader", "global_batch_size": 8, "batch_size": 4}, "run: global_batch_size=8 but data is a"),
    ],
)
def test_arguments_that_do_not_define_the_global_batch_are_refused_before_anything(tmp_path, options, expected):
    s = global_batch_state()
    before = [p.detach().clone() for p in s.model.parameters()]
    options = dict(options)
    data = indexed_dataset()
    if options.pop("data", None) == "loader":
        data = DataLoader(data, batch_size=4)
    with pytest.raises((ValueError, TypeError), match=expected.replace("(", r"\(").replace(")", r"\)")):
        ct.run(indexed_loss, s, data, checkpoint_dir=tmp_path / "run", progress=False, **options)
    assert not (tmp_path / "run").exists()
    assert all(torch.equal(p, q) for p, q in zip(before, s.model.parameters(), strict=True))


def test_a_checkpoint_written_before_the_shared_window_reads_as_one_without(tmp_path):
    """state.pt gained "window" (the unlogged updates' means over ranks): one without it reads, with none."""
    global_batch_job(0, 1, str(tmp_path), {"max_steps": 2})
    path = tmp_path / "step-000000002" / "state.pt"
    payload = torch.load(path, weights_only=True)
    del payload["window"]
    torch.save(payload, tmp_path / "old.pt")
    value, problem = read(tmp_path / "old.pt", SHARED, lambda v: None)
    assert problem is None and value["window"] == []
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2]


def test_a_checkpoint_keeps_the_window_as_means_over_ranks_which_another_world_size_continues():
    """What Progress writes into state.pt's window, and reads back when this rank's own part does not apply."""
    from composetrain.core.protocol import StepOutput
    from composetrain.driver.progress import Progress, Schedule

    s = Schedule(7, 2, None, 3, None, None)
    mine = [StepOutput(torch.tensor(0.5), {"acc": torch.tensor(1.0)}, False)]
    f64 = torch.float64
    means = [StepOutput(torch.tensor(0.25, dtype=f64), {"acc": torch.tensor(0.75, dtype=f64)}, False)]
    shared, local = Progress(s, 0, 0, 4, window=mine).to_checkpoint({}, {}, [], means)
    assert shared["window"] == [{"loss": means[0].loss, "metrics": means[0].metrics, "skipped": False}]
    assert local["window"][0]["loss"] == 0.5  # this rank's own, for a resume on the same number of processes
    same = Progress.from_checkpoint(shared, local, s, start=4)
    other = Progress.from_checkpoint(shared, None, s, start=4)
    assert [o.loss.item() for o in same.window] == [0.5] and [o.loss.item() for o in other.window] == [0.25]
    assert other.order is None and other.position == 4


def shifted(batch, generator):
    x, *rest = batch
    return [x + 0.01 * torch.randn(x.shape, generator=generator, dtype=x.dtype), *rest]


def test_a_cache_stores_workers_read_and_augment_the_shares_the_sequence_says(tmp_path):
    """A ct.cache store is read a whole share at a time, by its workers too (each share with its epoch and rank)."""
    store = ct.cache(Items(SAMPLES), tmp_path / "store", augment=shifted, progress=False)
    seen = {}
    for workers in (0, 1):
        s, found = global_batch_state(), []

        def step(model, batch, found=found, s=s):
            found.append((s.step + 1, batch[2].tolist(), batch[0].sum().item()))
            return indexed_loss(model, batch)

        ct.run(step, s, store, global_batch_size=GLOBAL_BATCH, epochs=2, num_workers=workers, progress=False, seed=3)
        seen[workers] = (found, [p.detach().clone() for p in s.model.parameters()])
    assert seen[0][0] == seen[1][0] and len(seen[0][0]) == 14
    assert all(torch.equal(p, q) for p, q in zip(seen[0][1], seen[1][1], strict=True))


def test_loading_a_checkpoint_keeps_the_live_runtime_state_it_lacks():
    """Saved on one process (ct.sharded and ct.distributed are the plain step there: no runtime state), resumed on
    several, whose setup sharded the model already: the group it is sharded over must stay the state's."""

    class Held(ct.RuntimeState):
        pass

    saved = global_batch_state().state_dict()
    assert "held" not in saved["transforms"]
    live = global_batch_state()
    held = live.transform_state("held", Held)
    live.load_state_dict(saved)
    assert live.transform_state("held", Held) is held


def test_a_dataset_of_another_length_is_refused_as_in_a_batch_size_run(tmp_path):
    global_batch_job(0, 1, str(tmp_path), {"max_steps": 2})
    found = global_batch_refusal(
        0, 1, str(tmp_path), {"samples": 38, "seed": 5}
    )  # 7 updates of 6 either way: the length differs
    assert found["params_unchanged"] and "other data settings (samples was 40, now 38)" in found["error"]


# -- random draws in loader workers after a resume --------------------------------------------------------------------
class Noisy(Dataset):
    """An augmentation drawn per sample in the loader's workers (torch.rand), returned with the sample."""

    def __init__(self):
        self.data = indexed_dataset()

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return (*self.data[i], torch.rand(()))


def noisy_run(directory, stop_at=None):
    """The draws each update's samples got, (update, draws), read by one loader worker."""
    s, draws = global_batch_state(), []

    def step(model, batch):
        x, y, _, drawn = batch
        draws.append((s.step + 1, drawn.tolist()))
        if stop_at is not None and s.step + 1 == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)  # saved after this update
        return F.cross_entropy(model(x), y)

    ct.run(
        step,
        s,
        Noisy(),
        global_batch_size=GLOBAL_BATCH,
        epochs=1,
        num_workers=1,
        progress=False,
        seed=3,
        checkpoint_dir=directory,
    )
    return draws


def test_a_resumed_runs_loader_workers_draw_new_numbers_not_the_fresh_starts_again(tmp_path):
    """README: random augmentation in loader workers restarts from new seeds on resume (exact only if seeded per
    sample). Seeded as at the fresh start, a resumed run's workers drew its first updates' numbers again, for other
    samples: every requeue of a job replayed one stream of augmentations from its start."""
    first = noisy_run(tmp_path / "a", stop_at=3)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    resumed, again = noisy_run(tmp_path / "a"), noisy_run(tmp_path / "b")
    assert [u for u, _ in first] == [1, 2, 3] and [u for u, _ in resumed] == [4, 5, 6, 7]
    assert [d for _, d in resumed[:3]] != [d for _, d in first]
    assert not {v for _, d in resumed for v in d} & {v for _, d in first for v in d}
    assert resumed == again  # seeded from the seed, the rank and where it resumed: any two resumes there draw alike


# -- evaluation's batches ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("accumulate", "largest"), [(None, 6), (ct.accumulate(micro_batch=2), 2), (ct.accumulate(4), 2)]
)
def test_evaluation_reads_batches_no_larger_than_the_training_forward(accumulate, largest):
    """A run defined by its global batch reads G/W samples per process and update, twice as many on half the
    processes; accumulate(micro_batch=m) keeps the training's forwards at m, and evaluation must not read G/W at
    once beside it (on one process: the whole global batch), or a job resumed on fewer processes runs out of memory
    in its first evaluation. It reads batches of the training's forward size instead (the means are exact)."""
    s, sizes = global_batch_state(), []

    def evaluate(model, batch):
        x, y, _ = batch
        sizes.append(len(x))
        return {"ce": F.cross_entropy(model(x), y)}

    step = indexed_loss if accumulate is None else accumulate(indexed_loss)
    result = ct.run(
        step,
        s,
        indexed_dataset(),
        global_batch_size=GLOBAL_BATCH,
        epochs=1,
        num_workers=0,
        progress=False,
        eval_step=evaluate,
        eval_data=indexed_dataset(13),
    )
    assert max(sizes) == largest and sum(sizes) == 13
    with torch.no_grad():
        x, y, _ = indexed_dataset(13)[:]
        s.model.eval()
        assert result.evals[-1]["ce"] == pytest.approx(F.cross_entropy(s.model(x), y).item(), rel=1e-12)


# -- a checkpoint whose unlogged updates do not add up to its step ----------------------------------------------------
@pytest.mark.parametrize("part", ["rank-0.pt", "state.pt"])
def test_a_checkpoint_whose_unlogged_updates_do_not_add_up_is_set_aside(tmp_path, part):
    """The window (updates 4 and 5, after the record at 3) continues the next record; one edited or damaged so that
    it does not hold step - last record's updates would make that record another mean, silently. rank-0.pt's is read
    on the same number of processes, state.pt's (the means over ranks) on another: here the checkpoint says 2."""
    straight = global_batch_job(0, 1, None)
    global_batch_job(0, 1, str(tmp_path), {"stop_at": 5, "checkpoint_every": 2})
    folder = tmp_path / "step-000000005"
    payload = torch.load(folder / part, weights_only=True)
    payload["window"] = payload["window"][:1]
    if part == "state.pt":
        payload["world_size"], payload["data_shards"] = 2, [0, 1]  # its window is the one read on this number
    torch.save(payload, folder / part)
    reseal(folder)
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint .*step-000000005: its 1 unlogged upd"):
        resumed = global_batch_job(0, 1, str(tmp_path), {"checkpoint_every": 2})  # from step 4
    assert all(torch.equal(v, resumed["params"][k]) for k, v in straight["params"].items())
    untimed = [{k: v for k, v in r.items() if k not in MEASURED} for r in straight["history"]]
    assert [{k: v for k, v in r.items() if k not in MEASURED} for r in resumed["history"]] == (untimed)


def test_a_window_holding_skipped_updates_adds_up_by_its_applied_ones(tmp_path):
    """A skipped update (non-finite under mixed_precision) is in the window but not in the step: a checkpoint saved
    with one there is sound, and resumes as the uninterrupted run."""

    def run(directory, stop_after=None):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        s, calls = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)), []

        def step(model, batch):
            x, y, i = batch
            calls.append(1)
            if len(calls) == stop_after:
                os.kill(os.getpid(), signal.SIGTERM)
            loss = F.cross_entropy(model(x.float()), y)
            return loss * float("inf") if bool((i == 24).any()) else loss  # update 5: skipped

        result = ct.run(
            ct.mixed_precision(step, dtype="fp16"),
            s,
            indexed_dataset(),
            global_batch_size=GLOBAL_BATCH,
            epochs=1,
            shuffle=False,
            num_workers=0,
            progress=False,
            log_every=3,
            checkpoint_dir=directory,
        )
        return s, result

    straight, whole = run(None)
    run(tmp_path, stop_after=6)  # saved after update 6: the window holds 4, 5 (skipped) and 6, after the record at 3
    window = torch.load(tmp_path / "step-000000005" / "rank-0.pt", weights_only=True)["window"]
    assert [w["skipped"] for w in window] == [False, True, False]
    resumed, result = run(tmp_path)
    assert whole.steps == result.steps == 6 and [r["skipped"] for r in result.history] == [0, 1]
    assert [(r["step"], r["loss"]) for r in result.history] == [(r["step"], r["loss"]) for r in whole.history]
    assert all(torch.equal(p, q) for p, q in zip(straight.model.parameters(), resumed.model.parameters(), strict=True))


def test_batchnorm_is_named_only_where_it_makes_the_run_depend_on_the_number_of_processes():
    from composetrain.driver.global_batches import batchnorm_problem

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    assert batchnorm_problem(model, 40, 6, 1, False) is None  # one process: the run itself
    problem = batchnorm_problem(model, 40, 6, 3, False)
    assert problem.startswith("global_batch_size=6 on 3 processes with BatchNorm in training mode ('1' (BatchNorm1d))")
    assert "(2 samples per update, 1 in the last, short one)" in problem and "one sample fails" in problem
    assert "short one" not in batchnorm_problem(model, 40, 6, 3, True) and "one sample" not in batchnorm_problem(
        model, 40, 6, 2, False
    )
    model[1].eval()  # frozen statistics: each process normalises alike
    assert batchnorm_problem(model, 40, 6, 3, False) is None
    synced = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.SyncBatchNorm(8))
    assert batchnorm_problem(synced, 40, 6, 3, False) is None  # statistics over every process: the run's own

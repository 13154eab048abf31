"""The global sample sequence of ``ct.run(global_batch_size=G)`` (driver/global_batches.py), in one process: each
epoch's updates hold every sample once, whatever the number of processes sharing them; ranks read contiguous,
near-equal shares; a run stopped anywhere starts the next update; on one process it is the ``batch_size`` run;
the loader's workers read what it says; what it cannot run is refused with the numbers and the fix.
The same job on 2 and 3 real processes, resumed across them: tests/test_resume_anywhere.py.
"""

import json

import hypothesis.strategies as st
import pytest
import torch
from global_batch_workers import G, dataset, job, refused
from hypothesis import given
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

import composetrain as ct
from composetrain.checkpoint.format import SHARED, read
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
        self.data = dataset(n)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def test_loader_workers_read_the_samples_the_sequence_says(tmp_path):
    """The sequence is the sampler's alone: read by 2 workers, every update gets the samples it gets in this process."""
    import global_batch_workers as w

    seen = {}
    for workers in (0, 2):
        s, found = w.state(), []

        def step(model, batch, found=found, s=s):
            found.append((s.step + 1, batch[2].tolist()))
            return w._plain(model, batch)

        ct.run(step, s, Items(w.N), global_batch_size=G, epochs=2, num_workers=workers, progress=False, seed=3)
        seen[workers] = (found, [p.detach().clone() for p in s.model.parameters()])
    assert seen[0][0] == seen[2][0] and len(seen[0][0]) == 14
    assert all(torch.equal(p, q) for p, q in zip(seen[0][1], seen[2][1], strict=True))


def test_a_run_stopped_mid_window_in_one_process_resumes_bit_for_bit(tmp_path):
    straight = job(0, 1, str(tmp_path / "a"))
    stopped = job(0, 1, str(tmp_path / "b"), {"stop_at": 5})
    # the checkpoint keeps the unlogged updates' means over ranks too (here: the one rank's own), for any W
    saved, problem = read(tmp_path / "b" / "step-000000005" / "state.pt", SHARED, lambda v: None)
    assert problem is None and saved["settings"]["global_batch_size"] == G and saved["settings"]["batch_size"] is None
    assert [(w["loss"].dtype, w["skipped"]) for w in saved["window"]] == [(torch.float64, False)] * 2  # 4 and 5
    resumed = job(0, 1, str(tmp_path / "b"))
    assert stopped["preempted"] and stopped["steps"] == 5 and resumed["steps"] == 14
    assert all(torch.equal(v, resumed["params"][k]) for k, v in straight["params"].items())
    untimed = [{k: v for k, v in r.items() if k not in ("updates_per_s", "data_wait")} for r in straight["history"]]
    assert [{k: v for k, v in r.items() if k not in ("updates_per_s", "data_wait")} for r in resumed["history"]] == (
        untimed
    )


def test_a_changed_global_batch_size_is_refused_naming_both(tmp_path):
    """8 and 9 make the same 5 updates of 40 samples: only the setting itself tells the runs apart."""
    job(0, 1, str(tmp_path), {"global_batch_size": 8, "max_steps": 2})
    found = refused(0, 1, str(tmp_path), {"global_batch_size": 9})
    assert found["params_unchanged"] and found["files_after"] == [f for f in found["files_before"] if ".lock" not in f]
    assert (
        found["error"].startswith(
            f"ValueError: run: checkpoint {tmp_path / 'step-000000002'} continues a run of global_batch_size=8, and "
            "this run has global_batch_size=9: it changes the run"
        )
        and "resume with global_batch_size=8" in found["error"]
    )
    other = refused(0, 1, str(tmp_path), {"global_batch_size": None, "batch_size": 8})  # per process, now
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
    import global_batch_workers as w

    s = w.state()
    before = [p.detach().clone() for p in s.model.parameters()]
    options = dict(options)
    data = w.dataset()
    if options.pop("data", None) == "loader":
        data = DataLoader(data, batch_size=4)
    with pytest.raises((ValueError, TypeError), match=expected.replace("(", r"\(").replace(")", r"\)")):
        ct.run(w._plain, s, data, checkpoint_dir=tmp_path / "run", progress=False, **options)
    assert not (tmp_path / "run").exists()
    assert all(torch.equal(p, q) for p, q in zip(before, s.model.parameters(), strict=True))


def test_a_checkpoint_written_before_the_shared_window_reads_as_one_without(tmp_path):
    """state.pt gained "window" (the unlogged updates' means over ranks): one without it reads, with none."""
    job(0, 1, str(tmp_path), {"max_steps": 2})
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
    import global_batch_workers as w

    store = ct.cache(Items(w.N), tmp_path / "store", augment=shifted, progress=False)
    seen = {}
    for workers in (0, 1):
        s, found = w.state(), []

        def step(model, batch, found=found, s=s):
            found.append((s.step + 1, batch[2].tolist(), batch[0].sum().item()))
            return w._plain(model, batch)

        ct.run(step, s, store, global_batch_size=G, epochs=2, num_workers=workers, progress=False, seed=3)
        seen[workers] = (found, [p.detach().clone() for p in s.model.parameters()])
    assert seen[0][0] == seen[1][0] and len(seen[0][0]) == 14
    assert all(torch.equal(p, q) for p, q in zip(seen[0][1], seen[1][1], strict=True))


def test_loading_a_checkpoint_keeps_the_live_runtime_state_it_lacks():
    """Saved on one process (ct.sharded and ct.distributed are the plain step there: no runtime state), resumed on
    several, whose setup sharded the model already: the group it is sharded over must stay the state's."""
    import global_batch_workers as w

    class Held(ct.RuntimeState):
        pass

    saved = w.state().state_dict()
    assert "held" not in saved["transforms"]
    live = w.state()
    held = live.transform_state("held", Held)
    live.load_state_dict(saved)
    assert live.transform_state("held", Held) is held


def test_a_dataset_of_another_length_is_refused_as_in_a_batch_size_run(tmp_path):
    job(0, 1, str(tmp_path), {"max_steps": 2})
    found = refused(0, 1, str(tmp_path), {"samples": 38, "seed": 5})  # 7 updates of 6 either way: the length differs
    assert found["params_unchanged"] and "other data settings (samples was 40, now 38)" in found["error"]

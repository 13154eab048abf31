"""ct.run's refusals: bad data, options, metrics and functions are clear errors (naming run, the argument, what
arrived and the fix), raised before anything trains or is written.
"""

import pytest
import run_script
import torch
from run_script import accuracy
from torch.utils.data import TensorDataset

import composetrain as ct


def test_a_loader_without_length_or_state_is_refused_where_it_would_be_resumed(tmp_path):
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(run_script.dataset())

    loader = DataLoader(Stream(), batch_size=4)
    with pytest.raises(TypeError, match=r"checkpoint_dir is given, but the DataLoader given has no state_dict\(\)"):
        ct.run(run_script.step, run_script.state(), loader, progress=False, checkpoint_dir=tmp_path)
    assert ct.run(run_script.step, run_script.state(), loader, progress=False).steps == 24  # read once: 96 / 4


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


def test_an_eval_metric_missing_from_some_batches_is_refused_not_diluted():
    calls = []

    def sometimes_extra(model, batch):  # 50 samples in batches of 12: 5 batches, "extra" in the 3rd only
        calls.append(1)
        return {**accuracy(model, batch), **({"extra": 1.0} if len(calls) == 3 else {})}

    state = run_script.state()
    with pytest.raises(ValueError) as caught:
        ct.run(
            ct.accumulate(2)(run_script.step),
            state,
            run_script.dataset(),
            batch_size=12,
            num_workers=0,
            progress=False,
            eval_step=sometimes_extra,
            eval_data=run_script.dataset(50),
        )
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
        run_script.step,
        state,
        shuffled,
        batch_size=12,
        shuffle=True,
        drop_last=False,
        progress=False,
        eval_step=accuracy,
        eval_data=run_script.dataset(50),
    )
    assert state.step == 8 and len(result.evals) == 1


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

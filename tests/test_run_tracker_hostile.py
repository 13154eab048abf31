"""ct.run's on_record against odd trackers: a generator or async function (calling it runs nothing: every record
would be lost without a word) is refused before anything runs, and a tracker that returns one stops the run."""

import functools

import pytest
import run_script

import composetrain as ct

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 2}


def generator(record):
    yield record


async def coroutine(record):
    return record


async def async_generator(record):
    yield record


class AsyncCall:
    async def __call__(self, record):
        return record


@pytest.mark.parametrize(
    "tracker",
    [generator, coroutine, async_generator, AsyncCall(), functools.partial(coroutine), functools.partial(AsyncCall())],
    ids=[
        "generator",
        "coroutine",
        "async generator",
        "async __call__",
        "partial of a coroutine",
        "partial of an object",
    ],
)
def test_a_tracker_whose_call_runs_nothing_is_refused_before_anything_runs(tmp_path, tracker):
    state = run_script.state()
    with pytest.raises(TypeError, match=r"run: on_record must be a plain function .* runs none of its body"):
        ct.run(run_script.step, state, run_script.dataset(), checkpoint_dir=tmp_path, on_record=tracker, **OPTIONS)
    assert state.step == 0 and not any(tmp_path.iterdir())


def test_a_tracker_that_returns_a_generator_stops_the_run_and_says_why(tmp_path):
    """Not seen before the run (a lambda around a generator function): its first record stops it, saved."""
    state = run_script.state()
    with pytest.raises(RuntimeError, match=r"on_record returned a generator .* on the record of update 2") as e:
        ct.run(
            run_script.step,
            state,
            run_script.dataset(),
            checkpoint_dir=tmp_path,
            on_record=lambda r: generator(r),
            max_steps=6,
            **OPTIONS,
        )
    assert state.step == 2 and "step-000000002" in str(e.value)


def _resumed_at_4_with(tmp_path, damage):
    """Saved at 4 and 6 (records 3, 4e, 6), the 6 removed as if the run was killed before it: ``damage``, then the
    run to 12 from 4. The tracker's records, each once, as a straight run's; and that run's."""
    from run_script import untimed
    from run_workers import evaluate

    options = {
        **OPTIONS,
        "log_every": 3,
        "checkpoint_every": 4,
        "eval_step": evaluate,
        "eval_data": run_script.dataset(24),
        "eval_every": 4,
    }

    def train(folder, got, max_steps):
        ct.run(
            run_script.step,
            run_script.state(),
            run_script.dataset(),
            checkpoint_dir=folder,
            on_record=got.append,
            max_steps=max_steps,
            **options,
        )

    straight, got = [], []
    train(tmp_path / "a", straight, 12)
    train(tmp_path / "b", got, 6)
    import shutil

    shutil.rmtree(tmp_path / "b" / "step-000000006")
    damage(tmp_path / "b")
    train(tmp_path / "b", got, 12)
    return untimed(got), untimed(straight)


@pytest.mark.parametrize(
    "text",
    ["[[5, true, 1]]", "[5, 6]", '[[5, true], "x", null, [7]]', "[" * 100_000, "{}"],
    ids=["a triple", "ints", "mixed", "nested too deep", "a dict"],
)
def test_a_damaged_list_of_sent_records_is_read_as_far_as_it_holds_pairs(tmp_path, text):
    """``.metrics.jsonl.sent`` is ct.run's own, but a file on disk: entries that are no [step, evaluation?] pair
    (or JSON nested too deep to parse) are left out, never a ValueError/TypeError/RecursionError from ct.run after
    the checkpoint was loaded."""
    got, straight = _resumed_at_4_with(tmp_path, lambda folder: (folder / ".metrics.jsonl.sent").write_text(text))
    assert [(r["step"], "eval" in r) for r in got] == [(r["step"], "eval" in r) for r in straight]
    assert got == straight


def test_a_metrics_line_nested_too_deep_for_json_counts_as_cut_short(tmp_path):
    def damage(folder):
        with open(folder / "metrics.jsonl", "a") as f:
            f.write("[" * 100_000 + "\n")

    got, straight = _resumed_at_4_with(tmp_path, damage)
    assert got == straight


def test_a_list_of_sent_records_that_is_a_folder_is_refused_before_anything_resumes(tmp_path):
    run_script_state = run_script.state()
    (tmp_path / ".metrics.jsonl.sent").mkdir()
    before = {k: v.clone() for k, v in run_script_state.model.state_dict().items()}
    with pytest.raises(PermissionError, match=r"log_file .*\.metrics\.jsonl\.sent.* is a folder"):
        ct.run(
            run_script.step,
            run_script_state,
            run_script.dataset(),
            checkpoint_dir=tmp_path,
            max_steps=2,
            on_record=print,
            **OPTIONS,
        )
    assert all(v.equal(before[k]) for k, v in run_script_state.model.state_dict().items())

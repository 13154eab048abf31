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
            run_script.step, state, run_script.dataset(), checkpoint_dir=tmp_path, on_record=lambda r: generator(r),
            max_steps=6, **OPTIONS,
        )  # fmt: skip
    assert state.step == 2 and "step-000000002" in str(e.value)

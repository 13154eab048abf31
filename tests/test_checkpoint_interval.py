"""When ct.run saves: ``checkpoint_every`` in updates, in wall-clock time (``"90s"``, ``"30min"``, ``"2h"``), both,
or ``"epoch"``; a run with a ``checkpoint_dir`` and no ``checkpoint_every`` saves every 10 minutes. The clock is
rank 0's: its saves come at the same update on every rank, whatever the other ranks' clocks say (a pool of two
gloo ranks, each given a clock of its own); a clock save that comes due while another is being written waits for
it without stalling the training."""

import threading
import time

import numpy as np
import pytest
import run_script
from hypothesis import given
from hypothesis import strategies as st

import composetrain as ct
import composetrain.checkpoint.files as files
import composetrain.driver.saving as saving
from composetrain.core.util import show
from composetrain.driver.options import ASYNC_DEFAULT, DEFAULT_INTERVAL, CheckpointOptions

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 4}
# which update each save comes at, by the clock alone: written synchronously, none is put off by another in flight
# (how a background save defers the next is tested on its own, with the writes held)
SYNC = {**OPTIONS, "checkpoint_async": False}


@pytest.mark.parametrize(
    ("every", "updates", "seconds"),
    [
        ("90s", None, 90.0),
        ("30min", None, 1800.0),
        ("2h", None, 7200.0),
        ("1.5h", None, 5400.0),
        ("0.5s", None, 0.5),
        (500, 500, None),
        (np.int64(7), 7, None),
        ((500, "30min"), 500, 1800.0),
        (("30min", 500), 500, 1800.0),
        ("epoch", None, None),
    ],
)
def test_checkpoint_every_takes_updates_a_duration_both_or_epoch(every, updates, seconds):
    options = CheckpointOptions("runs/a", every)
    assert (options.every_updates, options.every_seconds) == (updates, seconds)
    assert type(options.every_updates) in (int, type(None))  # a NumPy count kept as a plain int


@given(st.integers(1, 10**6), st.sampled_from([("s", 1), ("min", 60), ("h", 3600)]))
def test_a_duration_is_its_number_of_units(n, unit):
    name, scale = unit
    assert CheckpointOptions("runs/a", f"{n}{name}").every_seconds == n * scale
    assert CheckpointOptions("runs/a", (3, f"{n}{name}")).every_seconds == n * scale


@pytest.mark.parametrize(
    ("every", "error"),
    [
        ("30", ValueError),  # no unit
        ("30m", ValueError),  # minutes are min
        ("1d", ValueError),
        ("0s", ValueError),
        ("0.0h", ValueError),
        ("-5s", ValueError),
        ("s", ValueError),
        ("30 min", ValueError),
        ("1e3s", ValueError),
        ("inf s", ValueError),
        ("", ValueError),
        (0, ValueError),
        (-3, ValueError),
        ((0, "30s"), ValueError),
        (1.5, TypeError),
        (True, TypeError),
        ((1, 2), TypeError),
        (("1s", "2s"), TypeError),
        ((500,), TypeError),
        (("epoch", 5), TypeError),
        ([500, "30min"], TypeError),
        ((True, "30s"), TypeError),
        ("9" * 400 + "s", ValueError),  # a float past 1e308: inf seconds, which would never save
        ((None, "30s"), TypeError),  # a pair is a count and a duration: "30s" alone says the duration
    ],
)
def test_anything_else_is_refused_naming_the_forms_it_takes(every, error):
    with pytest.raises(error) as caught:
        CheckpointOptions("runs/a", every)
    message = str(caught.value)
    assert message.startswith("run: checkpoint_every must be "), message
    assert show(every) in message or show(every[0]) in message or show(every[1]) in message, message


def test_a_run_with_a_folder_saves_every_ten_minutes_unless_told_in_the_background_unless_told():
    assert DEFAULT_INTERVAL == "10min" and ASYNC_DEFAULT is True
    options = CheckpointOptions("runs/a")
    assert options.every_seconds == 600 and options.every_updates is None and options.checkpoint_async is True
    assert CheckpointOptions("runs/a", checkpoint_async=True).checkpoint_async is True
    assert CheckpointOptions("runs/a", "epoch").every_seconds is None  # epoch ends only: as before
    assert CheckpointOptions("runs/a", 100).every_seconds is None  # a count given: no clock
    assert CheckpointOptions("runs/a", checkpoint_async=False).checkpoint_async is False
    nothing = CheckpointOptions(None)
    assert (nothing.checkpoint_every, nothing.checkpoint_async, nothing.every_seconds) == (None, None, None)
    for given_ in ({"checkpoint_every": "30min"}, {"checkpoint_async": False}):
        with pytest.raises(ValueError, match=r"^run: checkpoint_(every|async)=.* but no checkpoint_dir to save in"):
            CheckpointOptions(None, **given_)
    with pytest.raises(TypeError, match=r"^run: checkpoint_async must be True or False .*got 1 \(int\)"):
        CheckpointOptions("runs/a", checkpoint_async=1)


class Clock:
    """A clock the step moves ``tick`` seconds per update (``saving``'s ``time``, for the monotonic reads)."""

    perf_counter = staticmethod(time.perf_counter)

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def monotonic(self) -> float:
        return self.now


def ticking(clock, before=None):
    calls = []

    def step(model, batch):
        calls.append(None)
        if before is not None:
            before(len(calls))
        clock.now += clock.tick
        return run_script.step(model, batch)

    return step


def saved_steps(folder):
    return [int(p.name.removeprefix("step-")) for p in sorted(folder.glob("step-*"))]


@pytest.mark.parametrize(
    ("every", "expected"),
    [
        ("25s", [3, 6, 8, 11, 12]),  # since the last save began: the epoch's end (8) counts as one
        ((5, "25s"), [3, 5, 8, 10, 12]),
        ("epoch", [8, 12]),
        (5, [5, 8, 10, 12]),
    ],
)
def test_a_save_comes_once_the_interval_has_passed_since_the_last_began(tmp_path, monkeypatch, every, expected):
    clock = Clock(10.0)  # 10 s per update
    monkeypatch.setattr(saving, "time", clock)
    state = run_script.state()
    ct.run(
        ticking(clock),
        state,
        run_script.dataset(),
        checkpoint_dir=tmp_path,
        max_steps=12,
        checkpoint_every=every,
        keep_checkpoints=20,
        **SYNC,
    )
    assert saved_steps(tmp_path) == expected


def test_the_default_saves_every_ten_minutes(tmp_path, monkeypatch):
    clock = Clock(250.0)  # a slow update: 250 s
    monkeypatch.setattr(saving, "time", clock)
    ct.run(
        ticking(clock),
        run_script.state(),
        run_script.dataset(),
        checkpoint_dir=tmp_path,
        max_steps=7,
        keep_checkpoints=20,
        **SYNC,
    )
    assert saved_steps(tmp_path) == [3, 6, 7]  # 750 s, then 750 s after the save of 3 began; the last


@pytest.mark.parametrize(
    ("eight_written", "expected", "deferred"),
    [
        (9, [3, 7, 8, 11, 12], 1),  # the save of 8 written during update 9: the clock's save after 11 is made
        (12, [3, 7, 8, 12], 2),  # still written after update 11: that one put off too, to the last save (12)
    ],
)
def test_a_clock_save_due_while_another_is_written_waits_for_it_without_stalling(
    tmp_path, monkeypatch, eight_written, expected, deferred
):
    """The save of 3 is held in its writes until update 7 begins: the clock's save due after update 6 is put off
    (update 7 trains meanwhile), and made at the first boundary after that save is published (7). The save of 8
    is held until update ``eight_written`` begins; every other update from 7 on waits for the writes in flight
    before it ends, so that the test, not the disk's speed, says what is in flight at each boundary (a real write
    outlasts several updates of a few milliseconds: the save of 8 still written after update 11 puts the clock's
    save off to 12)."""
    clock = Clock(10.0)
    monkeypatch.setattr(saving, "time", clock)
    gates, real = {3: threading.Event(), 8: threading.Event()}, files._write

    def held(obj, path):
        step = int(path.parent.name.removeprefix(".step-").removesuffix(".tmp"))
        if step in gates:
            assert gates[step].wait(60)
        return real(obj, path)

    monkeypatch.setattr(files, "_write", held)

    def release(n):
        if n == 7:
            gates[3].set()
        if n == eight_written:
            gates[8].set()
        if n >= 7 and (n < 9 or gates[8].is_set()):
            while any(t.name.startswith("checkpoint step") for t in threading.enumerate()):
                time.sleep(0.01)  # its writes over before this update ends: published at this boundary

    result = ct.run(
        ticking(clock, release),
        run_script.state(),
        run_script.dataset(),
        checkpoint_dir=tmp_path,
        max_steps=12,
        checkpoint_every="25s",
        keep_checkpoints=20,
        checkpoint_async=True,
        **OPTIONS,
    )
    assert saved_steps(tmp_path) == expected
    said = f"{deferred} save(s) by the clock came due while the previous one was still being written"
    assert said in result.bottleneck, result.bottleneck
    assert "save(s) waited" not in result.bottleneck  # no save by count or epoch found one in flight


def test_only_rank_0s_clock_decides_and_every_rank_saves_at_the_same_update(pool, tmp_path):
    """Rank 0's clock runs fast (10 s per update), rank 1's stands still: both save by rank 0's. Then the other way
    round: rank 1's clock alone says a save is due, and no rank saves but at the epochs' ends and the end."""
    fast0 = pool.run(__name__, "clock_on_one_rank", str(tmp_path / "fast0"), 0)
    fast1 = pool.run(__name__, "clock_on_one_rank", str(tmp_path / "fast1"), 1)
    assert fast0 == [[3, 4, 7, 8, 10]] * 2  # 4 updates per epoch on 2 ranks
    assert fast1 == [[4, 8, 10]] * 2
    assert saved_steps(tmp_path / "fast0") == [3, 4, 7, 8, 10]


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------


def clock_on_one_rank(rank, world, directory, fast):
    clock = Clock(10.0 if rank == fast else 0.0)
    saves, real = [], files.Checkpoints._begin

    def begin(self, step, *args, **kwargs):
        saves.append(step)
        return real(self, step, *args, **kwargs)

    saving.time, files.Checkpoints._begin = clock, begin
    try:
        ct.run(
            ct.distributed(ticking(clock)),
            run_script.state(),
            run_script.dataset(),
            checkpoint_dir=directory,
            max_steps=10,
            checkpoint_every="25s",
            keep_checkpoints=20,
            **SYNC,
        )
    finally:
        saving.time, files.Checkpoints._begin = time, real
    return saves

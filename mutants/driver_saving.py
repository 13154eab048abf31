"""The planted bugs of src/composetrain/driver/saving.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "(not self.tracked or self.resumed or self.checkpoints.newest is not None)",
        "replace": "(True or self.resumed or self.checkpoints.newest is not None)",
        "tests": [
            "tests/test_checkpoint_async.py::test_with_a_tracker_the_first_checkpoint_is_written_in_the_foreground_and_the_rest_in_the_background",
            "tests/test_run_tracker.py::test_each_record_reaches_the_tracker_once_across_runs_killed_again_and_again",
        ],
        "why": (
            "a tracked run's first checkpoint in the background: killed before it is published, the run starts "
            "afresh and sends the tracker again the records made while it was written"
        ),
        "from": "adv35",
    },
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "(not self.tracked or self.resumed or self.checkpoints.newest is not None)",
        "replace": "(not self.tracked or self.checkpoints.newest is not None)",
        "tests": [
            "tests/test_checkpoint_async.py::test_with_a_tracker_the_first_checkpoint_is_written_in_the_foreground_and_the_rest_in_the_background",
        ],
        "why": "a resumed tracked run writes its first save in the foreground: a stall for nothing",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "        if not last:  # the run's last save ends it",
        "replace": "        if True:  # the run's last save ends it",
        "tests": [
            "tests/test_checkpoint_async.py::test_the_runs_last_save_however_slow_is_no_stall_named_in_the_bottleneck",
        ],
        "why": (
            "the run's last save counted as a stall: the bottleneck tells a run that saved once to save less often"
        ),
        "from": "adv35",
    },
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "        due = self.is_main and self.seconds is not None",
        "replace": "        due = self.seconds is not None",
        "tests": [
            "tests/test_checkpoint_interval.py::test_only_rank_0s_clock_decides_and_every_rank_saves_at_the_same_update",
        ],
        "why": "the interval on each rank's own clock: a rank whose clock runs fast makes every rank save",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "        self.since, self.late = time.monotonic(), False",
        "replace": "        self.late = False",
        "tests": [
            "tests/test_checkpoint_interval.py::test_a_save_comes_once_the_interval_has_passed_since_the_last_began",
        ],
        "why": "the clock counts from the run's start, not the last save: once due, a save after every update",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "        if due and busy:",
        "replace": "        if False:",
        "tests": [
            "tests/test_checkpoint_interval.py::test_a_clock_save_due_while_another_is_written_waits_for_it_without_stalling",
        ],
        "why": (
            "a clock save due while one is written waits for it: a save slower than the interval stalls the training"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "                self.waits += 1\n",
        "replace": "",
        "tests": [
            "tests/test_checkpoint_async.py::test_at_most_one_save_is_in_flight_and_a_save_that_finds_one_waits",
        ],
        "why": "a save that waited for the previous one is not counted: result.bottleneck never names the stall",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/driver/saving.py",
        "find": "        if self.count and share >= 0.2:",
        "replace": "        if self.count and share > 1:",
        "tests": [
            "tests/test_checkpoint_async.py::test_saves_that_stall_training_are_named_in_the_bottleneck",
        ],
        "why": "result.bottleneck never names checkpoint stalls, however much of the loop they take",
        "from": "checkpoint_async",
    },
]

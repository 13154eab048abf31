"""The planted bugs of src/composetrain/driver/schedules.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/schedules.py",
        "find": "if found is None or steps <= 2 * found[0]:",
        "replace": "if found is None or steps <= 2 * found[0] * 10:",
        "tests": [
            "tests/test_epoch_schedules.py::test_a_schedule_built_in_epochs_but_stepped_per_update_is_warned_about_with_the_fix",
        ],
        "why": "24.3: the horizon check too lenient to see a schedule built in epochs stepped per update",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/schedules.py",
        "find": "        return start + tail[0], f",
        "replace": "        return tail[0], f",
        "tests": [
            "tests/test_epoch_schedules.py::test_horizons",
        ],
        "why": "24.3: a SequentialLR's horizon forgets the milestones before its last schedule",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/schedules.py",
        "find": "or steps <= total - taken:",
        "replace": "or steps < total - taken:",
        "tests": [
            "tests/test_epoch_schedules.py::test_a_per_epoch_one_cycle_too_short_for_the_run_is_refused_before_the_first_update",
        ],
        "why": "adversarial: off by one: a OneCycleLR with exactly the epochs' steps is refused",
        "from": "issue24_ema",
    },
]

"""The planted bugs of src/composetrain/core/scheduling.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": ('        if interval != "epoch":\n            raise TypeError('),
        "replace": ('        if interval != "update":\n            raise TypeError('),
        "tests": [
            "tests/test_epoch_schedules.py::test_reduce_lr_on_plateau_is_refused_per_update_and_driven_per_epoch_with_a_metric",
        ],
        "why": "adversarial: ReduceLROnPlateau refused with the other interval's reason",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": "    needed = step_needs(scheduler)\n",
        "replace": "    needed = []\n",
        "tests": [
            "tests/test_scheduler_kinds.py",
        ],
        "why": "29.8: a timm scheduler accepted; its step() raises TypeError after the first optimizer.step()",
        "from": "issue29_atomic",
    },
]

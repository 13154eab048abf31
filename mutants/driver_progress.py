"""The planted bugs of src/composetrain/driver/progress.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/progress.py",
        "find": "        return Due(bool(self.window), True, not self.schedule.eval_every, True)",
        "replace": "        return Due(bool(self.window), False, not self.schedule.eval_every, True)",
        "tests": [
            "tests/test_streams.py::test_each_pass_is_an_epoch_begun_with_set_epoch_and_ended_saved",
        ],
        "why": "a pass's end is not saved: the run's last pass, finished, is trained again when it is rerun",
        "from": "streams",
    },
]

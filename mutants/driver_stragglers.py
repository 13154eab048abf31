"""The planted bugs of src/composetrain/driver/stragglers.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/stragglers.py",
        "find": '                "cause": "data" if data >= compute else "compute",\n',
        "replace": '                "cause": "compute" if data >= compute else "data",\n',
        "tests": [
            "tests/test_stragglers.py::test_a_rank_waiting_on_data_is_named_so",
        ],
        "why": "the cause swapped: a rank slow to read its data is sent to check its device",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/stragglers.py",
        "find": "mine.own > threshold * median and",
        "replace": "mine.own < threshold * median and",
        "tests": [
            "tests/test_stragglers.py::test_a_rank_waiting_on_data_is_named_so",
        ],
        "why": "the straggler threshold inverted: the fast ranks are named",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/stragglers.py",
        "find": '"cause": "data" if data >= compute else "compute"',
        "replace": '"cause": "compute" if data >= compute else "data"',
        "tests": [
            "tests/test_stragglers.py::test_a_rank_waiting_on_data_is_named_so",
        ],
        "why": "the cause swapped: a rank waiting on its loader sent to check its GPU",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/stragglers.py",
        "find": "return max(self.step - self.waited, 0.0)",
        "replace": "return self.step",
        "tests": [
            "tests/test_stragglers.py::test_a_rank_computing_slowly_is_named_so_though_every_step_lasts_as_long",
        ],
        "why": "the waits for the others not taken off: every rank's step is as long as the slowest's, none is named",
        "from": "observability",
    },
]

"""The planted bugs of src/composetrain/checkpoint/loading.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/loading.py",
        "find": "    problem = problem or mismatch(folder, STATE_FILE, sums)\n",
        "replace": "",
        "tests": [
            "tests/test_checkpoint_trust.py::test_load_checkpoint_refuses_a_flipped_bit",
        ],
        "why": "29.12: ct.load_checkpoint never verifies",
        "from": "issue29_run",
    },
]

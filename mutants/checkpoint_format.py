"""The planted bugs of src/composetrain/checkpoint/format.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'if payload["world_size"] != world_size:',
        "replace": 'if payload["world_size"] < world_size:',
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_checkpoint_of_two_processes_is_refused_in_one_and_kept",
        ],
        "why": "20.10: a checkpoint of more processes than the run has is resumed",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "READS = (2, 3)",
        "replace": "READS = (3,)",
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_checkpoint_of_format_2_loads_without_checksums_and_one_of_format_3_needs_them",
        ],
        "why": "29.12: checkpoints written before checksums are refused",
        "from": "issue29_run",
    },
]

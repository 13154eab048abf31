"""The planted bugs of src/composetrain/core/batching.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/batching.py",
        "find": "[size // k + (i < size % k) for i in range(k)]",
        "replace": "[size // k + (i <= size % k) for i in range(k)]",
        "tests": [
            "tests/test_batching.py",
        ],
        "why": "uneven split: the pieces' sizes off by one",
        "from": "core",
    },
]

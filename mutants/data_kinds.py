"""The planted bugs of src/composetrain/data/kinds.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/kinds.py",
        "find": "    return None if as_mapped(dataset) is None and _wrapped(dataset) else [dataset]",
        "replace": "    return [dataset]",
        "tests": [
            "tests/test_cache_wrapped.py",
        ],
        "why": "another library's wrapper taken for a dataset ct.run can read whole",
        "from": "issue29_reader",
    },
]

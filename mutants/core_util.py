"""The planted bugs of src/composetrain/core/util.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/util.py",
        "find": "    if index < minimum or (maximum is not None and index > maximum):",
        "replace": "    if index < minimum:",
        "tests": [
            "tests/test_conventions.py::test_the_edges_of_each_arguments_rule[cache-seed]",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule[cache-seed]",
            "tests/test_conventions.py::test_the_edges_of_each_arguments_rule[ct.hdf5-seed]",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule[ct.hdf5-seed]",
            "tests/test_hdf5.py::test_a_seed_beyond_64_bits_is_refused_when_made",
        ],
        "why": "check_int's maximum ignored: a seed past int64 accepted by ct.cache and ct.hdf5",
        "from": "conventions_data",
    },
]

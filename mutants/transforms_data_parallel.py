"""The planted bugs of src/composetrain/transforms/data_parallel.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/data_parallel.py",
        "find": "    refuses_inside = refused_inside(role)",
        "replace": '    refuses_inside = refused_inside("distributed")',
        "tests": [
            "tests/test_composition_rules.py::test_a_transforms_refuses_inside_is_its_row_of_the_table",
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": "31.4.11: data_parallel reads distributed's row: it wraps mixed_precision (unscaling each replica)",
        "from": "composition_rules",
    },
]

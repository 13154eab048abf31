"""The planted bugs of src/composetrain/transforms/accumulate.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": '    refuses_inside = refused_inside("accumulate")',
        "replace": '    refuses_inside = refused_inside("accumulate_auto")',
        "tests": [
            "tests/test_composition_rules.py::test_a_transforms_refuses_inside_is_its_row_of_the_table",
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": (
            "31.4.10: accumulate(n) reads accumulate('auto')'s row: it refuses mixed_precision inside it and "
            "wraps accumulate('auto')"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "last_backward=ctx.last_backward and i == last",
        "replace": "last_backward=ctx.last_backward",
        "tests": [
            "tests/test_accumulate.py",
            "tests/test_distributed.py",
        ],
        "why": "every micro-batch's backward syncs gradients (no no_sync)",
        "from": "core",
    },
]

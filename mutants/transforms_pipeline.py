"""The planted bugs of src/composetrain/transforms/pipeline.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/pipeline.py",
        "find": "    refuses_inside = refused_inside(role)",
        "replace": '    refuses_inside = {**refused_inside(role), "ema": "planted"}',
        "tests": [
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": (
            "31.4.15: a refusal added outside the table (a transform's own dict): pipeline_split(ema(step)) is refused"
        ),
        "from": "composition_rules",
    },
]

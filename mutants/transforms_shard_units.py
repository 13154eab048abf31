"""The planted bugs of src/composetrain/transforms/_shard_units.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_shard_units.py",
        "find": 'ordered = sorted(units, key=lambda n: -n.count("."))',
        "replace": 'ordered = sorted(units, key=lambda n: n.count("."))',
        "tests": [
            "tests/test_shard_unit_ties.py",
        ],
        "why": "20.4: the outermost unit owns a parameter: a weight tied between nested units passes",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/transforms/_shard_units.py",
        "find": "        isinstance(modules, (tuple, list)) and modules and all(isinstance(m, type) for m in modules)",
        "replace": "        isinstance(modules, tuple) and modules and all(isinstance(m, type) for m in modules)",
        "tests": [
            "tests/test_module_predicates.py::test_sharded_takes_classes_as_a_list_or_a_tuple_as_checkpoint_activations_does",
        ],
        "why": "sharded(modules=[Block, nn.Linear]) refused as 'must be submodule names'",
        "from": "integration",
    },
]

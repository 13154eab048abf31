"""The planted bugs of src/composetrain/checkpoint/shards.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/shards.py",
        "find": 'params = [p for g in self.state.optimizer.param_groups for p in g["params"]]',
        "replace": "params = list(self.state.model.parameters())",
        "tests": [
            "tests/test_sharded_setup.py::test_resume_and_load_are_bit_exact_with_the_optimizer_in_another_order",
        ],
        "why": "20.3: optimizer state numbered in model.parameters() order, not the optimizer's",
        "from": "issue20",
    },
]

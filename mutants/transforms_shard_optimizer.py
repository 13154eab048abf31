"""The planted bugs of src/composetrain/transforms/_shard_optimizer.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_shard_optimizer.py",
        "find": "if v.dtype != w.dtype or v.shape != w.shape or not torch.equal(v, w):",
        "replace": "if v.dtype != w.dtype or v.shape != w.shape:",
        "tests": [
            "tests/test_sharded_setup.py::test_adagrad_state_made_by_training_is_refused_before_sharding",
        ],
        "why": "Adagrad state made by training taken for its initial state, and lost by sharding",
        "from": "issue19",
    },
]

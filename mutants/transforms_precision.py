"""The planted bugs of src/composetrain/transforms/precision.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/precision.py",
        "find": "        if ctx.notes.get(self.role) and not state.transform_state(self.role, LossScaling).unscaled:",
        "replace": "        if False:",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: the never-unscaled refusal gone from verify: the update runs on unscaled gradients",
        "from": "issue29_atomic",
    },
]

"""The planted bugs of src/composetrain/transforms/_deferred_sync.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_deferred_sync.py",
        "find": "params = [p for p in self.ddp.module.parameters() if p.requires_grad and p.grad is not None]",
        "replace": "params = [p for p in self.ddp.module.parameters() if p.requires_grad]",
        "tests": [
            "tests/test_auto_unused_parameters.py",
        ],
        "why": "20.6: the deferred sync gives a never-used parameter a zero gradient (momentum, decay move it)",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/transforms/_deferred_sync.py",
        "find": "            last.refuse_with(ctx.agree)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_distributed.py::test_a_refusal_on_one_rank_is_a_refusal_on_every_rank",
        ],
        "why": "an error of the passes after the last all-reduce is not told: the other ranks apply the update",
        "from": "issue29_x_atomic",
    },
]

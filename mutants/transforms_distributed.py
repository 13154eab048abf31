"""The planted bugs of src/composetrain/transforms/distributed.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "            if ddp.static_graph:  # before the pass's forward: nothing has changed yet",
        "replace": "            if False:  # before the pass's forward: nothing has changed yet",
        "tests": [
            "tests/test_distributed.py::test_static_graph_with_micro_batches_is_refused_before_any_change_and_works_without_them",
        ],
        "why": "static_graph=True with accumulate(n>1): torch's reducer asserts at the first no_sync backward",
        "from": "integration",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": 'self.options["bucket_cap_mb"] < _FIRST_BUCKET_MB',
        "replace": 'self.options["bucket_cap_mb"] < _FIRST_BUCKET_MB / 1e9',
        "tests": [
            "tests/test_compile.py::test_under_distributed_buckets_below_ddps_first_are_refused_with_the_fix",
        ],
        "why": "23.8: small DDP buckets under compile reach torch's bare AssertionError in DDPOptimizer",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "                return last.around(contextlib.nullcontext())\n",
        "replace": "                return contextlib.nullcontext()\n",
        "tests": [
            "tests/test_distributed.py::test_a_refusal_on_one_rank_is_a_refusal_on_every_rank",
        ],
        "why": (
            "the last backward's all-reduce is never marked as passed: an error of accumulate's passes after it "
            "is kept from the other ranks"
        ),
        "from": "issue29_x_atomic",
    },
]

"""The planted bugs of src/composetrain/transforms/distributed.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "agreed_layout(state, lambda: self._layout(world), self, self.group)  # once: before any other",
        "replace": "None  # once: before any other",
        "tests": [
            "tests/test_meshes_adversary.py::test_ranks_that_lay_out_the_job_differently_are_refused_on_every_rank_before_any_group",
        ],
        "why": "a pipeline on one rank beside plain DDP on the others: mismatched collectives abort the job",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": (
            "dist.all_reduce(units, group=place.data_group)  # over the data shards only: a split's ranks share theirs"
        ),
        "replace": "dist.all_reduce(units, group=place.world_group)",
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[tp_ddp]",
        ],
        "why": "pitfall 44: token counts summed over the tensor-parallel dimension too: each token counted T times",
        "from": "meshes",
    },
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
        "find": "                return last.around(replica.wait_for_gradients())\n",
        "replace": "                return replica.wait_for_gradients()\n",
        "tests": [
            "tests/test_distributed.py::test_a_refusal_on_one_rank_is_a_refusal_on_every_rank",
        ],
        "why": (
            "the last backward's all-reduce is never marked as passed: an error of accumulate's passes after it "
            "is kept from the other ranks"
        ),
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "return last.around(replica.wait_for_gradients())",
        "replace": "return last.around(contextlib.nullcontext())",
        "tests": [
            "tests/test_stragglers.py::test_the_slowed_rank_is_named_with_its_host_and_what_it_waited_on",
        ],
        "why": "distributed does not time the gradient all-reduce's wait: the rank slow in its step goes unnamed",
        "from": "observability",
    },
]

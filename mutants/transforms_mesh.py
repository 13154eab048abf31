"""The planted bugs of src/composetrain/transforms/_mesh.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": "    every = differing((type(problem).__name__ if problem else None, layout), group)",
        "replace": "    every = differing(type(problem).__name__ if problem else None, group)",
        "tests": [
            "tests/test_meshes_adversary.py::test_ranks_that_lay_out_the_job_differently_are_refused_on_every_rank_before_any_group",
        ],
        "why": "the ranks compare their refusals only, not their layouts: different groups, a hang",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": '("refused it (see its error)" if p else "no mesh"',
        "replace": '("no mesh"',
        "tests": [
            "tests/test_meshes_adversary.py::test_ranks_that_lay_out_the_job_differently_are_refused_on_every_rank_before_any_group",
        ],
        "why": (
            "a rank that refused its own layout is shown as having no mesh: the message points away from its error"
        ),
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": 'ORDER = ("pp", "replicate", "shard", "dp", "tp")  # outermost first',
        "replace": 'ORDER = ("tp", "pp", "replicate", "shard", "dp")  # outermost first',
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[tp_fsdp]",
        ],
        "why": (
            "mesh dimensions swapped: tensor-parallel groups of ranks r and r + W/T, which read different data shards"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": "        flat /= size\n",
        "replace": "",
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[tp_ddp]",
        ],
        "why": "distributed's own reduction of a split model sums the replicas' gradients instead of averaging them",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": "        made = dist.new_group(row, timeout=timeout) if timeout is not None else dist.new_group(row)",
        "replace": "        made = dist.new_group(row)",
        "tests": [
            "tests/test_meshes.py::test_every_group_of_the_mesh_waits_as_long_as_the_job_does",
        ],
        "why": (
            "the mesh's groups wait torch's 30 minutes, not the job's timeout, in every send, receive and collective"
        ),
        "from": "meshes",
    },
]

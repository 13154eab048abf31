"""The planted bugs of src/composetrain/transforms/pipeline_parallel.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": "made = kind(stage, n_microbatches=len(micros), loss_fn=loss_fn, scale_grads=False)",
        "replace": "made = kind(stage, n_microbatches=len(micros), loss_fn=loss_fn)",
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[pp_ddp_gpipe]",
        ],
        "why": (
            "pitfall 43: torch's default scale_grads=True divides the globally weighted gradients again by the "
            "micro-batch count"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": "share = weights[i] / ctx.total_weight  # the global count: never scale_grads' per-step rescale",
        "replace": "share = 1.0 / len(micros)",
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[pp_ddp_gpipe]",
        ],
        "why": (
            "an average of the micro-batches' token means, not the mean over the global token count (torchtitan #1733)"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": (
            "            if ctx.last_backward:  # what every pass of the update added, once (a second sum would "
            "add the first twice)\n"
        ),
        "replace": "            if True:\n",
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[pp_ddp_gpipe]",
        ],
        "why": (
            "tied gradients added over the stages after every pass: under accumulate the first pass's sum is "
            "added twice"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": (
            "            for t in [*model.parameters(), *model.buffers()]:\n"
            "                dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)"
        ),
        "replace": ("            for t in []:\n                pass"),
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[pp_ddp_gpipe]",
        ],
        "why": (
            "each stage keeps its own rank's initial weights: the split model is no one model (and tied copies differ)"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": "        if self._split(state):  # one process",
        "replace": "        if not self._split(state):  # one process",
        "tests": [
            "tests/test_meshes.py",
        ],
        "why": "the early size check skipped where the stages are split (and made where one process takes any size)",
        "from": "stop43",
    },
]

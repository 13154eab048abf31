"""The planted bugs of src/composetrain/transforms/_stages.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "        dist.all_reduce(total, group=self.group)\n",
        "replace": "",
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[pp_ddp_gpipe]",
        ],
        "why": "the clipping norm misses the other stages: each stage clips by its own part (torchtitan #596)",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "self._elsewhere = {i for i, n in names.items() if plan.holders[n][0] != stage}",
        "replace": "self._elsewhere = set()",
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[pp_ddp_gpipe]",
        ],
        "why": "a weight tied across stages counted in the norm once per stage holding it",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": 'whole["model"] = {k: model[k] for k in self.plan.paths if k in model}',
        "replace": 'whole["model"] = dict(here["model"])',
        "tests": [
            "tests/test_meshes.py::test_pipeline_checkpoints_hold_the_unsplit_model_and_resume_on_another_schedule",
        ],
        "why": "a pipeline's checkpoint holds rank 0's stage only: the unsplit model cannot load it",
        "from": "meshes",
    },
]

"""The planted bugs of src/composetrain/transforms/_stages.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "            g = torch.zeros(shape, dtype=plan.dtypes[name], device=device)",
        "replace": "            g = torch.zeros(shape, dtype=torch.float32, device=device)",
        "tests": [
            "tests/test_meshes_adversary.py::test_a_stage_without_gradients_or_parameters_is_the_plain_step",
        ],
        "why": "a stage holding no parameter sends a tied weight's zeros in float32: gloo aborts the job",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "        total = norm.to(self.dtype).pow(norm_type)",
        "replace": "        total = norm.pow(norm_type)",
        "tests": [
            "tests/test_meshes_adversary.py::test_a_stage_without_gradients_or_parameters_is_the_plain_step",
        ],
        "why": "a frozen stage's empty norm (float32) meets float64 norms in the all-reduce: gloo aborts the job",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "functools.reduce(torch.promote_types, floating) if floating else torch.get_default_dtype()",
        "replace": "torch.get_default_dtype()",
        "tests": [
            "tests/test_meshes_adversary.py::test_a_stage_without_gradients_or_parameters_is_the_plain_step",
        ],
        "why": "the stages' norm combined in float32 for a float64 model: the clip coefficient off in the 8th digit",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": '_renamed(_whole(here["transforms"]), {a: c for a, c in aliases.items() if a != c})',
        "replace": '_whole(here["transforms"])',
        "tests": [
            "tests/test_meshes_adversary.py::test_a_pipeline_ema_with_a_tied_weight_keeps_the_unsplit_models_names",
        ],
        "why": (
            "the head's stage names the tied weight's average by its own path: the checkpoint's averages are not "
            "the unsplit model's"
        ),
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "            transforms = _renamed(transforms, {c: a for c, a in back.items() if a != c})",
        "replace": "            transforms = transforms",
        "tests": [
            "tests/test_meshes_adversary.py::test_a_pipeline_ema_with_a_tied_weight_keeps_the_unsplit_models_names",
        ],
        "why": "resuming a pipeline, the head's stage finds no average of its tied weight under its own name",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "        refused = [(s, text) for s, text in enumerate(every) if text is not None]",
        "replace": "        refused: list[tuple[int, str]] = []",
        "tests": [
            "tests/test_meshes_adversary.py::test_a_checkpoint_one_stage_refuses_is_loaded_by_no_stage",
        ],
        "why": "the stages gather their refusals but a stage whose part was fine ignores the others'",
        "from": "adv34_load",
    },
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

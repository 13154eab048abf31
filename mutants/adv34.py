"""Planted bugs of the issue-34 adversary's fixes (pipeline stages without gradients, ct.ema's names across stages,
tensor-parallel plans that break ties or meet a submodule twice, the ranks' agreement on the mesh layout)."""

T = "tests/test_meshes_adversary.py::"
STAGES_ = T + "test_a_stage_without_gradients_or_parameters_is_the_plain_step"
EMA = T + "test_a_pipeline_ema_with_a_tied_weight_keeps_the_unsplit_models_names"
PLANS = T + "test_plans_that_break_a_tie_or_meet_a_submodule_twice_are_refused"
LAYOUTS = T + "test_ranks_that_lay_out_the_job_differently_are_refused_on_every_rank_before_any_group"

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "            g = torch.zeros(shape, dtype=plan.dtypes[name], device=device)",
        "replace": "            g = torch.zeros(shape, dtype=torch.float32, device=device)",
        "tests": [STAGES_],
        "why": "a stage holding no parameter sends a tied weight's zeros in float32: gloo aborts the job",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "        total = norm.to(self.dtype).pow(norm_type)",
        "replace": "        total = norm.pow(norm_type)",
        "tests": [STAGES_],
        "why": "a frozen stage's empty norm (float32) meets float64 norms in the all-reduce: gloo aborts the job",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "functools.reduce(torch.promote_types, floating) if floating else torch.get_default_dtype()",
        "replace": "torch.get_default_dtype()",
        "tests": [STAGES_],
        "why": "the stages' norm combined in float32 for a float64 model: the clip coefficient off in the 8th digit",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": '_renamed(_whole(here["transforms"]), {a: c for a, c in aliases.items() if a != c})',
        "replace": '_whole(here["transforms"])',
        "tests": [EMA],
        "why": (
            "the head's stage names the tied weight's average by its own path: the checkpoint's averages are not "
            "the unsplit model's"
        ),
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "            transforms = _renamed(transforms, {c: a for c, a in back.items() if a != c})",
        "replace": "            transforms = transforms",
        "tests": [EMA],
        "why": "resuming a pipeline, the head's stage finds no average of its tied weight under its own name",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "                _check_ties(model, self.plan, self)\n",
        "replace": "                pass\n",
        "tests": [PLANS],
        "why": "a plan splitting a tied embedding or head breaks the tie silently",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": '                path = f"{where}.{local}"',
        "replace": "                path = local",
        "tests": [PLANS],
        "why": "ties looked up by the submodule's own parameter name, not the model's path: none is ever found",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "    broken = [paths for paths in ties if len({id(now[q]) for q in paths}) > 1]",
        "replace": "    broken: list[list[str]] = []",
        "tests": [PLANS],
        "why": "a plan given as a function breaks a tie and trains on",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "            if n in seen and _style(seen[n][1]) != _style(style):",
        "replace": "            if n in seen and False:",
        "tests": [PLANS],
        "why": "two keys meeting one submodule with different styles: the later applies silently",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": "    every = differing((type(problem).__name__ if problem else None, layout), group)",
        "replace": "    every = differing(type(problem).__name__ if problem else None, group)",
        "tests": [LAYOUTS],
        "why": "the ranks compare their refusals only, not their layouts: different groups, a hang",
    },
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "agreed_layout(state, lambda: self._layout(world), self, self.group)  # once: before any other",
        "replace": "None  # once: before any other",
        "tests": [LAYOUTS],
        "why": "HSDP on one rank beside plain FSDP on the others: one builds a mesh while the others all-gather counts",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "agreed_layout(state, lambda: self._layout(world), self, self.group)  # once: before any other",
        "replace": "None  # once: before any other",
        "tests": [LAYOUTS],
        "why": "a pipeline on one rank beside plain DDP on the others: mismatched collectives abort the job",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": '("refused it (see its error)" if p else "no mesh"',
        "replace": '("no mesh"',
        "tests": [LAYOUTS],
        "why": "a rank that refused its own layout is shown as having no mesh: the message points away from its error",
    },
]

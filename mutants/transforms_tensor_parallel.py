"""The planted bugs of src/composetrain/transforms/tensor_parallel.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "                _check_ties(model, self.plan, self)\n",
        "replace": "                pass\n",
        "tests": [
            "tests/test_meshes_adversary.py::test_plans_that_break_a_tie_or_meet_a_submodule_twice_are_refused",
        ],
        "why": "a plan splitting a tied embedding or head breaks the tie silently",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": '                path = f"{where}.{local}"',
        "replace": "                path = local",
        "tests": [
            "tests/test_meshes_adversary.py::test_plans_that_break_a_tie_or_meet_a_submodule_twice_are_refused",
        ],
        "why": "ties looked up by the submodule's own parameter name, not the model's path: none is ever found",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "    broken = [paths for paths in ties if len({id(now[q]) for q in paths}) > 1]",
        "replace": "    broken: list[list[str]] = []",
        "tests": [
            "tests/test_meshes_adversary.py::test_plans_that_break_a_tie_or_meet_a_submodule_twice_are_refused",
        ],
        "why": "a plan given as a function breaks a tie and trains on",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "            if n in seen and _style(seen[n][1]) != _style(style):",
        "replace": "            if n in seen and False:",
        "tests": [
            "tests/test_meshes_adversary.py::test_plans_that_break_a_tie_or_meet_a_submodule_twice_are_refused",
        ],
        "why": "two keys meeting one submodule with different styles: the later applies silently",
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": (
            "        for t in [*model.parameters(), *model.buffers()]:\n"
            "            dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)"
        ),
        "replace": ("        for t in []:\n            pass"),
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[tp_fsdp]",
        ],
        "why": (
            "a tensor-parallel group's ranks keep their own copies of the layers the plan leaves whole "
            "(LayerNorms, embeddings)"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "    if active:\n",
        "replace": "    if False:\n",
        "tests": [
            "tests/test_meshes.py::test_bad_layouts_and_plans_are_refused_on_every_rank_alike[dropout]",
        ],
        "why": "dropout under TP trained silently, its split masks not the unsplit layer's",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "                _check_names(model, self.plan, self)\n",
        "replace": "                pass\n",
        "tests": [
            "tests/test_meshes.py::test_bad_layouts_and_plans_are_refused_on_every_rank_alike[plan_missing]",
            "tests/test_meshes.py::test_bad_layouts_and_plans_are_refused_on_every_rank_alike[plan_kind]",
        ],
        "why": "a plan entry that matches nothing is skipped with torch's warning: the layer trains whole",
        "from": "meshes",
    },
]

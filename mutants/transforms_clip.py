"""The planted bugs of src/composetrain/transforms/clip.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "if p.grad is not None]",
        "replace": "if p.grad is not None][:-1]",
        "tests": [
            "tests/test_clip.py",
        ],
        "why": "the clipping norm leaves out one parameter",
        "from": "core",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": 'return Update(applied.skipped, {**applied.metrics, "grad_norm": norm})',
        "replace": 'return Update(False, {**applied.metrics, "grad_norm": norm})',
        "tests": [
            "tests/test_clip.py",
            "tests/test_precision.py",
        ],
        "why": "a skipped update is reported as applied",
        "from": "core",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "    return [p for p in (*model, *outside) if p.grad is not None]",
        "replace": '    return [p for g in state.optimizer.param_groups for p in g["params"] if p.grad is not None]',
        "tests": [
            "tests/test_clip_order.py::test_any_group_split_clips_bit_for_bit_as_model_parameters",
        ],
        "why": "24.1: the norm summed over the optimizer's groups in group order (the old code): last bits differ",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "    return [p for p in (*model, *outside) if p.grad is not None]",
        "replace": "    return [p for p in model if p.grad is not None]",
        "tests": [
            "tests/test_clip_order.py::test_frozen_parameters_and_parameters_outside_the_optimizer",
        ],
        "why": "24.1: a tensor the optimizer updates outside the model is neither counted nor clipped",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": 'for p in group["params"] if id(p) not in inside]',
        "replace": 'for p in group["params"]]',
        "tests": [
            "tests/test_clip_order.py::test_any_group_split_clips_bit_for_bit_as_model_parameters",
        ],
        "why": "24.1: the optimizer's parameters counted a second time after the model's",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "    changes_update = True\n",
        "replace": "",
        "tests": [
            "tests/test_check.py::test_the_reference_keeps_the_transforms_that_change_the_update",
        ],
        "why": "24.6: clip_grad_norm not declared as changing the update: ct.check compares it with no clipping",
        "from": "issue24_recipes",
    },
]

"""The planted bugs of src/composetrain/transforms/agc.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/agc.py",
        "find": "    return x.norm(norm_type, dim=tuple(range(1, x.ndim)), keepdim=True)",
        "replace": "    return x.norm(norm_type)",
        "tests": [
            "tests/test_clip_value_agc.py::test_each_mode_is_timms_dispatch_clip_grad_bit_for_bit",
        ],
        "why": "37.4: AGC by the whole tensor's norm, not unit by unit",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/agc.py",
        "find": "        return {id(p) for n, p in named if n in self.excluded}",
        "replace": "        return set()",
        "tests": [
            "tests/test_clip_value_agc.py::test_each_mode_is_timms_dispatch_clip_grad_bit_for_bit",
        ],
        "why": "37.4: exclude= ignored: timm's head clipped too",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/agc.py",
        "find": "            missing = [n for n in self.excluded if n not in names]",
        "replace": "            missing = []",
        "tests": [
            "tests/test_clip_value_agc.py::test_an_excluded_name_the_model_lacks_is_refused_before_anything_changes",
        ],
        "why": "37.4: a misspelt exclude name silently excludes nothing",
        "from": "timm_recipes",
    },
]

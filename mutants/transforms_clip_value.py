"""The planted bugs of src/composetrain/transforms/clip_value.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/clip_value.py",
        "find": (
            "        with torch.no_grad():\n"
            "            torch.nn.utils.clip_grad_value_(clipped(state), self.clip_value, foreach=self.foreach)\n"
            "        return self._inner().update(state, ctx)"
        ),
        "replace": (
            "        applied = self._inner().update(state, ctx)\n"
            "        with torch.no_grad():\n"
            "            torch.nn.utils.clip_grad_value_(clipped(state), self.clip_value, foreach=self.foreach)\n"
            "        return applied"
        ),
        "tests": [
            "tests/test_clip_value_agc.py::test_each_mode_is_timms_dispatch_clip_grad_bit_for_bit",
        ],
        "why": "37.4: clipped after the optimizer stepped: the update unclipped",
        "from": "timm_recipes",
    },
]

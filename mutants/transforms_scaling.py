"""The planted bugs of src/composetrain/transforms/_scaling.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_scaling.py",
        "find": "carried = self.scaler.state_dict() if mode == self.mode else None",
        "replace": "carried = self.scaler.state_dict() if mode == self.mode and device == self.device else None",
        "tests": [
            "tests/test_loss_scale_moves.py",
        ],
        "why": "20.7: a model moved to another device type restarts its loss scale at 2**16",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/transforms/_scaling.py",
        "find": "found[device] = torch.zeros(1, dtype=torch.float32, device=device)",
        "replace": "found[device] = torch.zeros(1, device=device)",
        "tests": [
            "tests/test_default_dtype.py::test_the_scaling_constants_are_float32_whatever_the_default",
        ],
        "why": "the found-inf flag follows the default dtype, which the fused kernel refuses",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/_scaling.py",
        "find": "self._ones[device] = torch.ones(1, dtype=torch.float32, device=device)",
        "replace": "self._ones[device] = torch.ones(1, device=device)",
        "tests": [
            "tests/test_default_dtype.py::test_the_scaling_constants_are_float32_whatever_the_default",
        ],
        "why": "the scale of 1 follows the default dtype, which the fused kernel refuses",
        "from": "issue19",
    },
]

"""The planted bugs of src/composetrain/checking/_result.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checking/_result.py",
        "find": 'low = "" if self.lowest in (None, self.dtype) else',
        "replace": 'low = "" if True else',
        "tests": [
            "tests/test_hf.py::test_check_judges_the_models_own_float32_loss_at_float32_and_still_names_a_misweighing",
        ],
        "why": "29.13: the printout hides the lower precision the tolerance followed",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/_result.py",
        "find": '            lines.append(f"  {self.reason}")',
        "replace": "            pass",
        "tests": [
            "tests/test_check_answers.py::test_a_step_drawing_from_its_own_generator_is_said_to_be_not_deterministic",
        ],
        "why": "29: the printed result says DIFFERS with no layer and no reason",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/_result.py",
        "find": 'lines.append(f"  update phase, given the same gradients: {self.update!r}',
        "replace": 'lines.append(f"  {self.update!r}',
        "tests": [
            "tests/test_check_update.py::test_a_sign_flipped_small_update_under_a_float32_loss_is_named",
        ],
        "why": "the printout hides the update-phase gap that made check differ",
        "from": "issue29_x_check",
    },
]

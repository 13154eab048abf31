"""The planted bugs of src/composetrain/driver/global_batches.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "    return start, start + base + (rank < extra)",
        "replace": "    return start, start + base + (rank <= extra)",
        "tests": [
            "tests/test_global_batch.py::test_each_update_is_the_same_samples_on_any_number_of_processes",
        ],
        "why": "a rank's share one sample too long: neighbouring ranks read a sample twice",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "        return order[k * self.global_batch_size : (k + 1) * self.global_batch_size]",
        "replace": "        return order[k * self.global_batch_size + 1 : (k + 1) * self.global_batch_size + 1]",
        "tests": [
            "tests/test_global_batch.py::test_each_update_is_the_same_samples_on_any_number_of_processes",
        ],
        "why": "the update's slice off by one: the epoch's first sample never trained, one shared by two updates",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": '        g.manual_seed(derive_seed(self.seed, "order", epoch=epoch))',
        "replace": '        g.manual_seed(derive_seed(self.seed, "order", epoch=epoch) + self.world_size)',
        "tests": [
            "tests/test_global_batch.py::test_each_update_is_the_same_samples_on_any_number_of_processes",
            "tests/test_resume_anywhere.py::test_the_same_job_on_1_2_and_3_processes_trains_the_same_model_and_logs_the_same_records",
        ],
        "why": "the epoch's order drawn with the world size in its seed: another W trains on other updates",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "        return full + (short > 0 and not self.drop_last)",
        "replace": "        return full + (short > 0)",
        "tests": [
            "tests/test_global_batch.py::test_each_update_is_the_same_samples_on_any_number_of_processes",
        ],
        "why": "drop_last ignored in the count: an empty last update, or the short one kept",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "    if g % w:\n",
        "replace": "    if g % w and g < w:\n",
        "tests": [
            "tests/test_global_batch.py::test_what_the_processes_cannot_run_is_named_with_the_numbers_and_the_fix",
        ],
        "why": "W not dividing G is refused only when G < W: ranks read unequal shares of every update",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "    if 0 < short < w:\n",
        "replace": "    if 0 < short < w - 1:\n",
        "tests": [
            "tests/test_resume_anywhere.py::test_what_cannot_be_exact_is_refused_before_anything_changes",
        ],
        "why": "a short update with one sample fewer than processes passes: a rank gets an empty batch",
        "from": "global_batch",
    },
]

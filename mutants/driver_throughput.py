"""The planted bugs of src/composetrain/driver/throughput.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "        self.done = True\n",
        "replace": "",
        "tests": [
            "tests/test_flops.py::test_the_flops_are_counted_on_the_first_update_only",
        ],
        "why": "the FLOPs counted on every update (FlopCounterMode slows each down)",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "return float(self.total) if samples == self.samples else self.total * samples / self.samples",
        "replace": "return float(self.total)",
        "tests": [
            "tests/test_flops.py::test_an_update_of_another_size_is_scaled_by_its_samples",
        ],
        "why": "a short update's FLOPs taken as a full one's",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": '            f.write("5")  # resets VmHWM to the current resident size\n',
        "replace": "            pass\n",
        "tests": [
            "tests/test_flops.py::test_each_record_holds_its_own_peak_memory",
        ],
        "why": "the peak memory never reset: every later record repeats the run's peak",
        "from": "observability",
    },
]

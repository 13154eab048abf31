"""The planted bugs of src/composetrain/driver/profiling.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": ("        if self.left == 0:\n            self.profiler.stop()\n            self.profiler = None\n"),
        "replace": "",
        "tests": [
            "tests/test_profile_window.py::test_no_profiler_exists_and_nothing_is_marked_outside_the_windows",
        ],
        "why": "the profiler left running after its window: it records every later update, and no second window",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": "                self.watch.window.after()\n",
        "replace": "                pass\n",
        "tests": [
            "tests/test_profile_window.py::test_the_windows_traces_parse_and_hold_their_updates_and_phases",
        ],
        "why": "the profiler never stepped: its schedule stays in warm-up, no trace is written",
        "from": "observability",
    },
]

"""The planted bugs of src/composetrain/driver/profiling.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": '_UNCOUNTED = frozenset({"compile", "pipeline", "data_parallel"})',
        "replace": '_UNCOUNTED = frozenset({"compile", "pipeline"})',
        "tests": [
            "tests/test_flops.py::test_a_data_parallel_composition_is_not_counted",
        ],
        "why": "data_parallel counted: its replicas' threads are unseen by the dispatch mode, 0 FLOPs logged",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": "            self.cut = True  # a window cut short",
        "replace": "            self.cut = False  # a window cut short",
        "tests": [
            "tests/test_profile_window.py::test_a_run_that_ends_before_its_window_is_complete_says_so",
        ],
        "why": "a window the run ended inside forgotten by the time the run ends: the wrong warning, or none",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": "                if step >= first\n",
        "replace": "                if step >= last\n",
        "tests": [
            "tests/test_profile_window.py::test_a_run_that_ends_before_its_window_is_complete_says_so",
        ],
        "why": "a window cut short while recording said to have written nothing, though its trace holds updates",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": "            self.traces += 1\n",
        "replace": "",
        "tests": [
            "tests/test_profile_window.py::test_a_complete_window_warns_of_nothing",
        ],
        "why": "complete windows not counted: every profiled run warns that no trace was written",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": (
            "        if self.left == 0:\n            self.profiler.stop()\n            self.profiler = None\n"
            "            self.traces += 1\n"
        ),
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

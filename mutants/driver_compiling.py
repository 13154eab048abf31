"""The planted bugs of src/composetrain/driver/compiling.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/compiling.py",
        "find": "return len(frames), float(sum(frames) + sum(record.get(_BACKWARD, [])))",
        "replace": "return len(frames), float(sum(frames))",
        "tests": [
            "tests/test_compile_run.py::test_compile_seconds_include_the_backward_compiled_at_the_first_backward",
        ],
        "why": "23.18: compile_s leaves out the backward graphs compiled lazily at the first backward",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/compiling.py",
        "find": '_BACKWARD = "backward._backward_impl"',
        "replace": '_BACKWARD = "backward._backward"',
        "tests": [
            "tests/test_compile_run.py::test_compile_seconds_include_the_backward_compiled_at_the_first_backward",
        ],
        "why": "23.19: the backward compile read under a name torch does not record: silently nothing",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/compiling.py",
        "find": "            except FileExistsError:",
        "replace": "            except NotADirectoryError:",
        "tests": [
            "tests/test_compile_run.py::test_a_compile_cache_that_is_no_folder_is_refused_with_the_fix",
        ],
        "why": "23.27: a compile_cache that is a file or a dangling link fails with mkdir's bare FileExistsError",
        "from": "issue23_compile",
    },
]

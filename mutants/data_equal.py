"""The planted bugs of src/composetrain/data/equal.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/equal.py",
        "find": "    if _kind(a) is not _kind(b):",
        "replace": "    if type(a) is not type(b):",
        "tests": [
            "tests/test_cache_odd.py::test_numpy_memmap_rows_are_stored_and_verify_accepts_them_other_subclasses_are_refused",
        ],
        "why": "verify=True refuses a correct store of a dataset returning rows of a np.memmap",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/equal.py",
        "find": "        if not a.numel():",
        "replace": "        if False:",
        "tests": [
            "tests/test_cache_odd.py::test_empty_complex_tensors_come_back_viewable_and_verify_compares_them",
        ],
        "why": "verify=True crashes comparing an empty complex tensor",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/equal.py",
        "find": ("    if isinstance(x, np.generic):\n        return np.generic\n"),
        "replace": "",
        "tests": [
            "tests/test_cache_odd.py::test_numpy_scalars_of_an_alias_type_pass_verify",
        ],
        "why": "verify=True refuses a correct store of np.longlong scalars (read back as np.int64, the same dtype)",
        "from": "issue22_cache",
    },
]

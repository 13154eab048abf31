"""The planted bugs of src/composetrain/data/layout.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/layout.py",
        "find": "        if not -(2**63) <= value < 2**63:",
        "replace": "        if not -(2**63) <= value <= 2**63:",
        "tests": [
            "tests/test_cache_store.py::test_ints_at_the_edge_of_int64_are_stored_exactly_and_one_past_is_refused",
        ],
        "why": "2**63 is stored (wrapped to -2**63, or as uint64)",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": "        if not -(2**63) <= value < 2**63:",
        "replace": "        if not -(2**63) < value < 2**63:",
        "tests": [
            "tests/test_cache_store.py::test_ints_at_the_edge_of_int64_are_stored_exactly_and_one_past_is_refused",
        ],
        "why": "-2**63, an int64, is refused",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": 'NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")',
        "replace": 'NAME = re.compile(r"^[A-Za-z0-9_./]{1,64}$")',
        "tests": [
            "tests/test_cache_hostile.py",
        ],
        "why": "a manifest may name an array outside the store's folder",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": "        if value.is_quantized:",
        "replace": "        if False:",
        "tests": [
            "tests/test_cache_odd.py::test_quantized_tensors_are_refused_rather_than_read_back_without_their_scale",
        ],
        "why": "a quantized tensor is stored without its scale and read back as an unusable tensor",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": "type(value) not in (np.ndarray, np.memmap):",
        "replace": "type(value) not in (np.ndarray, np.memmap, np.ma.MaskedArray, np.matrix):",
        "tests": [
            "tests/test_cache_odd.py::test_numpy_memmap_rows_are_stored_and_verify_accepts_them_other_subclasses_are_refused",
        ],
        "why": "a masked array's mask is silently dropped",
        "from": "issue22_cache",
    },
]

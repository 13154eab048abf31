"""The planted bugs of src/composetrain/data/hdf5.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": '    seed = check_int(seed, HDF5, "seed", minimum=-(2**63), maximum=2**63 - 1, example="seed=0")',
        "replace": "    seed = int(seed)",
        "tests": [
            "tests/test_conventions.py::test_the_edges_of_each_arguments_rule[ct.hdf5-seed]",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule[ct.hdf5-seed]",
        ],
        "why": "ct.hdf5's seed taken by int(): 1.5 and True accepted, a string a ValueError, a seed past int64 kept",
        "from": "conventions_data",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "        if self._pid != os.getpid():",
        "replace": "        if self._file is None:",
        "tests": [
            "tests/test_hdf5.py::test_a_forked_process_opens_the_file_again",
        ],
        "why": "a forked loader worker reads through the parent's h5py handle (HDF5 state shared across fork)",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": 'return {**super().__getstate__(), "_file": None, "_pid": -1}',
        "replace": "return {**super().__getstate__()}",
        "tests": [
            "tests/test_hdf5.py::test_it_pickles_by_path_and_reads_in_another_process",
        ],
        "why": "the open h5py file pickled with the dataset (h5py objects do not pickle: no loader workers)",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "path = os.path.abspath(os.fsdecode(file))",
        "replace": "path = os.fsdecode(file)",
        "tests": [
            "tests/test_hdf5.py::test_a_relative_path_still_reads_after_a_change_of_folder",
        ],
        "why": "a relative path kept: a change of folder (or a worker started elsewhere) reads another file",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "if len(set(lengths.values())) > 1:",
        "replace": "if len(set(lengths.values())) > 2:",
        "tests": [
            "tests/test_hdf5.py::test_bad_keys_are_refused_by_name",
        ],
        "why": "datasets of two different lengths accepted: items past the shorter one fail mid-run",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "            if dset.ndim == 0:",
        "replace": "            if False:",
        "tests": [
            "tests/test_hdf5.py::test_bad_keys_are_refused_by_name",
        ],
        "why": "a scalar dataset (no rows) accepted: an IndexError from its shape instead of naming it",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "    if not h5py.is_hdf5(path):",
        "replace": "    if False:",
        "tests": [
            "tests/test_hdf5.py::test_a_file_that_is_not_hdf5_or_not_there",
        ],
        "why": "a file that is not HDF5 reaches h5py: an OSError about signatures instead of naming the file",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "        return not self._by_h5py",
        "replace": "        return True",
        "tests": [
            "tests/test_hdf5.py::test_auto_reads_memory_maps_here_and_weighs_workers_for_what_h5py_reads",
        ],
        "why": "num_workers='auto' never weighs workers for chunked or compressed datasets that h5py reads slowly",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "            item = tuple(fields[name] for name in keys)",
        "replace": "            item = tuple(fields[name] for name in sorted(keys))",
        "tests": [
            "tests/test_hdf5.py::test_items_have_the_structure_of_the_keys",
        ],
        "why": "an item's tuple in the file's (sorted) order, not the order of the keys given",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "name: Region(file_of(dset), offset, dset.dtype.str, tuple(dset.shape))",
        "replace": "name: Region(path, offset, dset.dtype.str, tuple(dset.shape))",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_dataset_behind_an_external_link_is_read_from_the_linked_file",
        ],
        "why": "an external link's dataset mapped at its offset in the linking file: other bytes, silently",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "            check_unchanged(self._stamps)\n",
        "replace": "",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_file_changed_after_ct_hdf5_is_refused_not_misread",
        ],
        "why": "a file rewritten, moved, cut short or removed after ct.hdf5 is mapped as it is now: its rows misread",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "[path, *(file_of(d) for d in columns.values())]",
        "replace": "[path]",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_dataset_behind_an_external_link_is_read_from_the_linked_file",
        ],
        "why": "only the opened file stamped, not one an external link leads to",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": 'HDF5, "seed", minimum=-(2**63), maximum=2**63 - 1',
        "replace": 'HDF5, "seed", minimum=-(2**99), maximum=2**99',
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_seed_beyond_64_bits_is_refused_when_made",
        ],
        "why": "a seed past int64 accepted: an OverflowError at the first augmented read, far from the call",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "    if os.path.isdir(path):",
        "replace": "    if False:",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_path_that_is_not_a_path_or_a_directory_is_named",
        ],
        "why": "a directory reported as 'no file'",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": "            if h5py.check_ref_dtype(dtype)\n",
        "replace": "            if False\n",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_dataset_of_object_references_is_named_as_such",
        ],
        "why": "a dataset of object references called variable-length",
        "from": "issue22_hdf5",
    },
]

"""Planted bugs for ct.hdf5 (issue 22's HDF5 part), each caught by the test named for it (see tools/mutants.py)."""

T = "tests/test_hdf5.py::"
H = "src/composetrain/data/hdf5.py"
F = "src/composetrain/data/h5files.py"

MUTANTS = [
    {
        "file": F,
        "find": "if end is None or dset.id.get_storage_size() < dset.size * dset.dtype.itemsize:",
        "replace": "if end is None:",
        "tests": [T + "test_external_compact_and_unwritten_data_are_read_by_h5py"],
        "why": "an unwritten dataset (no storage) behind a userblock has an undefined address inside the file: mapped",
    },
    {
        "file": F,
        "find": "        return out.astype(self.dtype, copy=False)",
        "replace": "        return out",
        "tests": [T + "test_any_index_list_reads_what_h5py_reads"],
        "why": "rows h5py reads from a big-endian chunked dataset handed to torch unswapped",
    },
    {
        "file": F,
        "find": 'return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype',
        "replace": "return dtype",
        "tests": [T + "test_big_endian_rows_come_native"],
        "why": "big-endian rows handed to torch as they are (torch has no big-endian tensors)",
    },
    {
        "file": F,
        "find": "return self.array[index].astype(native(self.array.dtype))",
        "replace": "return self.array[index]",
        "tests": [T + "test_big_endian_rows_come_native"],
        "why": "a big-endian memory map gathered but not swapped",
    },
    {
        "file": F,
        "find": "out = out if len(unique) == len(index) and (unique == index).all() else out[inverse.reshape(-1)]",
        "replace": "out = out if len(unique) == len(index) else out[inverse.reshape(-1)]",
        "tests": [T + "test_any_index_list_reads_what_h5py_reads"],
        "why": "distinct but unsorted indices returned in h5py's sorted order",
    },
    {
        "file": F,
        "find": "out = out if len(unique) == len(index) and (unique == index).all() else out[inverse.reshape(-1)]",
        "replace": "out = out",
        "tests": [T + "test_any_index_list_reads_what_h5py_reads"],
        "why": "repeated indices read once: the batch comes back short and sorted",
    },
    {
        "file": H,
        "find": "        if self._pid != os.getpid():",
        "replace": "        if self._file is None:",
        "tests": [T + "test_a_forked_process_opens_the_file_again"],
        "why": "a forked loader worker reads through the parent's h5py handle (HDF5 state shared across fork)",
    },
    {
        "file": H,
        "find": 'return {**super().__getstate__(), "_file": None, "_pid": -1}',
        "replace": "return {**super().__getstate__()}",
        "tests": [T + "test_it_pickles_by_path_and_reads_in_another_process"],
        "why": "the open h5py file pickled with the dataset (h5py objects do not pickle: no loader workers)",
    },
    {
        "file": H,
        "find": "path = os.path.abspath(os.fsdecode(file))",
        "replace": "path = os.fsdecode(file)",
        "tests": [T + "test_a_relative_path_still_reads_after_a_change_of_folder"],
        "why": "a relative path kept: a change of folder (or a worker started elsewhere) reads another file",
    },
    {
        "file": H,
        "find": "if len(set(lengths.values())) > 1:",
        "replace": "if len(set(lengths.values())) > 2:",
        "tests": [T + "test_bad_keys_are_refused_by_name"],
        "why": "datasets of two different lengths accepted: items past the shorter one fail mid-run",
    },
    {
        "file": H,
        "find": "            if dset.ndim == 0:",
        "replace": "            if False:",
        "tests": [T + "test_bad_keys_are_refused_by_name"],
        "why": "a scalar dataset (no rows) accepted: an IndexError from its shape instead of naming it",
    },
    {
        "file": H,
        "find": "    if not h5py.is_hdf5(path):",
        "replace": "    if False:",
        "tests": [T + "test_a_file_that_is_not_hdf5_or_not_there"],
        "why": "a file that is not HDF5 reaches h5py: an OSError about signatures instead of naming the file",
    },
    {
        "file": H,
        "find": "        return not self._by_h5py",
        "replace": "        return True",
        "tests": [T + "test_auto_reads_memory_maps_here_and_weighs_workers_for_what_h5py_reads"],
        "why": "num_workers='auto' never weighs workers for chunked or compressed datasets that h5py reads slowly",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "plain = self.indexed or (self._mapped and dataset.augment is None and dataset.memory_mapped)",
        "replace": "plain = self.indexed or (self._mapped and dataset.augment is None)",
        "tests": [T + "test_auto_reads_memory_maps_here_and_weighs_workers_for_what_h5py_reads"],
        "why": "the reader ignores whether a mapped dataset is all memory maps",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "with contextlib.suppress(TypeError, ValueError), warnings.catch_warnings():",
        "replace": "with contextlib.suppress(TypeError), warnings.catch_warnings():",
        "tests": [T + "test_big_endian_rows_come_native"],
        "why": "a big-endian memory map makes torch.from_numpy raise ValueError when the maps open",
    },
    {
        "file": H,
        "find": "            item = tuple(fields[name] for name in keys)",
        "replace": "            item = tuple(fields[name] for name in sorted(keys))",
        "tests": [T + "test_items_have_the_structure_of_the_keys"],
        "why": "an item's tuple in the file's (sorted) order, not the order of the keys given",
    },
]

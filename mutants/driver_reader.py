"""The planted bugs of src/composetrain/driver/reader.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "    if got < expected:",
        "replace": "    if False:",
        "tests": [
            "tests/test_data.py::test_a_stopiteration_in_a_loader_worker_is_an_error_not_the_end_of_the_epoch",
        ],
        "why": "finding 6: a worker's StopIteration ends ct.run's epoch early, silently: 3 of 5 batches trained",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "    shares = isinstance(sampler, GlobalBatches) and not whole",
        "replace": "    shares = False",
        "tests": [
            "tests/test_global_batch.py::test_loader_workers_read_the_samples_the_sequence_says",
        ],
        "why": "loader workers take the shares as a per-sample sampler: the sequence depends on num_workers",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "return max(0, min(8, cores // max(1, local_world_size) - 1))",
        "replace": "return max(0, min(8, cores - 1))",
        "tests": [
            "tests/test_auto_workers.py",
        ],
        "why": "20.8: num_workers='auto' gives every process of the node the whole node's cores",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "self.sampler.start += done * self.batch_size",
        "replace": "self.sampler.start = done * self.batch_size",
        "tests": [
            "tests/test_data.py::test_a_run_stopped_after_any_update_resumes_bit_identically",
        ],
        "why": "20.14: the workers that take over part-way forget the resumed position",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": (
            'read_whole(self.dataset, indices, getattr(inner, "epoch", 0), getattr(inner, "rank", 0), self._given)'
        ),
        "replace": 'read_whole(self.dataset, indices, 0, getattr(inner, "rank", 0), self._given)',
        "tests": [
            "tests/test_cache_run.py::test_augmentation_in_loader_workers_draws_as_in_this_process",
        ],
        "why": "ct.run's own reader augments every epoch as the first",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "        if self._mapped:  # one gather per field",
        "replace": "        if False:  # one gather per field",
        "tests": [
            "tests/test_cache_run.py::test_a_run_over_the_cache_is_bit_identical_to_one_over_the_original_and_reads_whole_batches",
        ],
        "why": "ct.run reads a cache item by item and collates (slow path)",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "    return dataset.augment is not None or (not dataset.ragged and collate_fn is None)",
        "replace": "    return not dataset.ragged and collate_fn is None",
        "tests": [
            "tests/test_cache_odd.py::test_an_augmented_cache_with_a_collate_fn_is_augmented_per_epoch_by_ct_run",
        ],
        "why": "ct.run over an augmented cache with a collate_fn draws the same augmentation every epoch",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "store is not None and store.augment is None and store.memory_mapped)",
        "replace": "store is not None and store.augment is None)",
        "tests": [
            "tests/test_hdf5.py::test_auto_reads_memory_maps_here_and_weighs_workers_for_what_h5py_reads",
        ],
        "why": "the reader ignores whether a mapped dataset is all memory maps",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "    return dataset.augment is not None or (not dataset.ragged and collate_fn is None)",
        "replace": "    return not dataset.ragged and collate_fn is None",
        "tests": [
            "tests/test_hdf5_hostile.py::test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn",
        ],
        "why": (
            "with a collate_fn, augmented items read with the dataset's epoch (never set): one draw for every epoch"
        ),
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": 'getattr(inner, "rank", 0), self._given)',
        "replace": 'getattr(inner, "rank", 0))',
        "tests": [
            "tests/test_hdf5_hostile.py::test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn",
        ],
        "why": "the collate_fn given dropped in this process: batches collated by default_collate",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "Batches(dataset, collate_fn) if whole else dataset,",
        "replace": "Batches(dataset) if whole else dataset,",
        "tests": [
            "tests/test_hdf5_hostile.py::test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn",
        ],
        "why": "the collate_fn given dropped in loader workers",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "        return bool(augmented_inside(given)) and joined(given) is not None",
        "replace": "        return False",
        "tests": [
            "tests/test_cache_wrapped.py",
        ],
        "why": "a Subset of an augmented store read through Subset.__getitems__: the same draw every epoch",
        "from": "issue29_reader",
    },
]

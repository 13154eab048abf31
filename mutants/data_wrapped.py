"""The planted bugs of src/composetrain/data/wrapped.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "    return batch if collate is None else collate(split_batch(batch, len(indices)))",
        "replace": "    return batch",
        "tests": [
            "tests/test_cache_odd.py::test_an_augmented_cache_with_a_collate_fn_is_augmented_per_epoch_by_ct_run",
        ],
        "why": "loader workers ignore the collate_fn given to ct.run for an augmented cache",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "        if not -n <= i < n:",
        "replace": "        if not -n <= i <= n:",
        "tests": [
            "tests/test_cache_wrapped.py",
        ],
        "why": "one past the end of a Subset or ConcatDataset wraps to its first item",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "        return stores[0].read_batch([j for _, j in places], epoch, rank)",
        "replace": "        return stores[0].read_batch([j for _, j in places], 0, rank)",
        "tests": [
            "tests/test_cache_wrapped.py",
        ],
        "why": "a wrapped store's batches drawn with epoch 0's augmentation every epoch",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "k = bisect.bisect_right(dataset.cumulative_sizes, i)",
        "replace": "k = bisect.bisect_left(dataset.cumulative_sizes, i)",
        "tests": [
            "tests/test_cache_wrapped.py",
        ],
        "why": "a ConcatDataset's first item of each part read from the part before it",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "    if inner is None:\n",
        "replace": "    if False:\n",
        "tests": [
            "tests/test_cache_wrapped.py",
        ],
        "why": "a wrapper ct.run cannot follow is not refused",
        "from": "issue29_reader",
    },
]

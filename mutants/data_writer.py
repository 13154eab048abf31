"""The planted bugs of src/composetrain/data/writer.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/writer.py",
        "find": "        elif made != nests:",
        "replace": "        elif False:",
        "tests": [
            "tests/test_cache.py::test_items_whose_containers_differ_are_refused_or_come_back_as_they_were",
        ],
        "why": "finding 1: a tuple and a list (or empty containers) share their leaves: item 0's served for each",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "        containers.append((where, kind))",
        "replace": "        containers.append((where, tuple))",
        "tests": [
            "tests/test_cache.py::test_items_whose_containers_differ_are_refused_or_come_back_as_they_were",
        ],
        "why": "finding 1: containers compared by place only, not type: a list in item 1 comes back as a tuple",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "    if count != n:",
        "replace": "    if False:",
        "tests": [
            "tests/test_cache.py::test_a_stopiteration_while_a_store_is_written_by_workers_is_named",
        ],
        "why": "finding 7: a worker's StopIteration ends the items early: a bare AssertionError from the bookkeeping",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "prefetch_factor=4, generator=torch.Generator().manual_seed(0))",
        "replace": "prefetch_factor=4)",
        "tests": [
            "tests/test_cache.py::test_writing_with_loader_workers_leaves_the_global_random_state_alone",
        ],
        "why": "finding 9: writing with workers draws their base seed from the global torch generator",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "_SEEDED = 5",
        "replace": "_SEEDED = 0",
        "tests": [
            "tests/test_cache_store.py::test_a_store_of_other_items_is_refused_by_default",
        ],
        "why": "the fingerprint holds only the first, middle and last items",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "    return sorted({0, n // 2, n - 1, *seeded}) if n else []",
        "replace": "    return sorted({0, n // 2, n - 1, *seeded})",
        "tests": [
            "tests/test_cache_store.py::test_an_empty_dataset_makes_an_empty_store_that_opens_as_empty",
        ],
        "why": "an empty dataset's fingerprint names items -1 and 0: its store is refused as it is written",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "        elif here != paths:",
        "replace": "        elif len(here) != len(paths):",
        "tests": [
            "tests/test_cache.py::test_items_that_cannot_be_stored_are_refused_by_name",
        ],
        "why": "an item whose dict keys come in another order is stored field by field into the wrong columns",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "        if all(s == first for s in self.shapes):",
        "replace": "        if all(len(s) == len(first) for s in self.shapes):",
        "tests": [
            "tests/test_cache_hostile.py::test_ragged_items_come_back_and_batches_need_a_collate_fn",
        ],
        "why": "a field whose shape varies is taken for a fixed one",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "t = value.detach().resolve_conj().resolve_neg().contiguous()",
        "replace": "t = value.detach().contiguous()",
        "tests": [
            "tests/test_cache_odd.py::test_conjugate_and_negative_views_are_stored_as_their_values",
        ],
        "why": "a conjugate view (x.conj()) cannot be written: numpy() refuses it",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "    return sorted({0, n // 2, n - 1, *seeded}) if n else []",
        "replace": "    return sorted({0, n - 1, *seeded}) if n else []",
        "tests": [
            "tests/test_cache_odd.py::test_the_store_records_a_fingerprint_of_some_items_and_verify_finds_a_change_in_the_middle",
        ],
        "why": "the fingerprint samples only the items verify already compares with the store",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "            digest.update(repr((where, leaf_kind(value, where))).encode())\n",
        "replace": "",
        "tests": [
            "tests/test_cache_odd.py::test_the_store_records_a_fingerprint_of_some_items_and_verify_finds_a_change_in_the_middle",
        ],
        "why": "the fingerprint ignores structure, dtype and shape: only bytes",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "    if depth > DEPTH:\n",
        "replace": "    if depth > DEPTH + 1:\n",
        "tests": [
            "tests/test_cache_agree.py",
        ],
        "why": "an item one container deeper than the reader reads is written and published",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "            manifest_text(_skeleton(item, iter(first)), n, origin)\n",
        "replace": "",
        "tests": [
            "tests/test_cache_agree.py::test_a_manifest_larger_than_the_reader_reads_is_refused_at_the_first_item",
        ],
        "why": "a manifest too large for the reader refused only after every item is written",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "            kept[i] = copy.deepcopy(item)",
        "replace": "            kept[i] = item",
        "tests": [
            "tests/test_cache_store.py",
        ],
        "why": "the fingerprint is made of the items as the last read left them: a correct store refused as altered",
        "from": "issue29_y_data",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": '    n = origin["length"]',
        "replace": "    n = len(dataset)",
        "tests": [
            "tests/test_cache_odd.py",
        ],
        "why": "a dataset whose len changes while written: a store of another length is published, then refused",
        "from": "issue29_y_data",
    },
]

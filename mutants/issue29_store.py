"""Planted bugs for issues 29 and 30 (ct.cache's store identity, paths and publishing), each caught by the tests
named for it (see tools/mutants.py)."""

S = "tests/test_cache_store.py"
T = "tests/test_cache.py"

MUTANTS = [
    {
        "file": "src/composetrain/data/store.py",
        "find": "        read_manifest(path)\n    except NotAStore as e:",
        "replace": "        pass\n    except NotAStore as e:",
        "tests": [f"{S}::test_a_folder_with_a_manifest_of_its_own_is_never_replaced"],
        "why": "any folder with a manifest.json counts as a store: rebuild=True deletes a WebDataset folder",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": 'raise NotAStore(f"{folder / MANIFEST} is not a cache manifest")',
        "replace": 'raise StoreError(f"{folder / MANIFEST} is not a cache manifest")',
        "tests": [f"{S}::test_a_folder_with_a_manifest_of_its_own_is_never_replaced"],
        "why": "a JSON manifest of other keys is taken for a damaged store, and rebuilt over",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "        check_replaceable(path)  # again: what is there now is what is renamed away\n",
        "replace": "",
        "tests": [f"{S}::test_a_manifest_replaced_under_the_lock_is_not_renamed_away"],
        "why": "what was put at the path while the store was written is renamed away and deleted",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    if not written:\n        _compare(dataset, data)",
        "replace": "    if verify and not written:\n        _compare(dataset, data)",
        "tests": [f"{S}::test_a_store_of_other_items_is_refused_by_default"],
        "why": "the fingerprint compared only under verify=True: a store of another seed is served silently",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "_SEEDED = 5",
        "replace": "_SEEDED = 0",
        "tests": [f"{S}::test_a_store_of_other_items_is_refused_by_default"],
        "why": "the fingerprint holds only the first, middle and last items",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "        indices = list(range(start, min(start + 256, len(data))))",
        "replace": "        indices = [start]",
        "tests": [f"{S}::test_verify_compares_every_item"],
        "why": "verify=True compares a sample, not every item",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": (
            "        if self._arrays is None:\n            check_unchanged(self.path, self.stamps)\n            try:"
        ),
        "replace": "        if self._arrays is None:\n            try:",
        "tests": [f"{S}::test_a_store_changed_after_it_was_opened_is_refused_before_it_is_mapped"],
        "why": "a process maps the rebuilt store's files with the shapes opened before (a bare mmap error)",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "            try:  # replaced between the check and the maps: the maps may be of the new files\n"
        "                check_unchanged(self.path, self.stamps)\n",
        "replace": "            try:\n                pass\n",
        "tests": [f"{S}::test_a_store_rebuilt_while_it_is_mapped_is_refused"],
        "why": "a rebuild between the check and the maps: the new store's files read with the old manifest",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)",
        "replace": "    return (s.st_dev, 0, s.st_size, 0)",
        "tests": [f"{S}::test_a_store_changed_after_it_was_opened_is_refused_before_it_is_mapped"],
        "why": "a rebuilt store of the same sizes passes for the one opened: workers read other data",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    if folder is None or _folder(path) != folder:",
        "replace": "    if folder is None:",
        "tests": [f"{S}::test_an_open_racing_a_rebuild_maps_the_new_store_whole"],
        "why": "an open racing a rebuild pairs the old manifest with the new files",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "        named = _TEMPORARY.fullmatch(n[len(prefix) :]) if n.startswith(prefix) else None",
        "replace": "        named = _TEMPORARY.search(n) if n.startswith(prefix) else None",
        "tests": [f"{S}::test_stale_temporaries_are_matched_by_name_not_by_glob"],
        "why": "the writer of store s[1].tmp-old has its folder deleted by the writer of s[1]",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    if not path.is_dir() or os.path.lexists(path / MANIFEST):\n        return",
        "replace": "    if True:\n        return",
        "tests": [f"{S}::test_a_folder_that_cannot_be_renamed_is_refused_before_an_item_is_read"],
        "why": "a bind mount is found only once the whole store is written beside it (a bare EBUSY)",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    if os.path.lexists(path) and os.path.ismount(path):",
        "replace": "    if False:",
        "tests": [f"{S}::test_a_mount_point_is_refused_before_an_item_is_read"],
        "why": "a mount point is written over on the parent's disk",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "            except ValueError:\n                if not rebuild:\n                    raise",
        "replace": "            except ValueError:\n                if True:\n                    raise",
        "tests": [f"{S}::test_rebuild_after_waiting_for_a_writer_of_other_items_writes_its_own"],
        "why": "rebuild=True, after waiting for another writer, is told to pass rebuild=True",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": '    check_bool(verify, CACHE, "verify")\n',
        "replace": "",
        "tests": [f"{S}::test_verify_and_progress_must_be_bools"],
        "why": 'verify="no" verifies',
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    if stat.S_ISREG(mode):\n        return",
        "replace": "    if True:\n        return",
        "tests": [f"{S}::test_a_lock_file_that_is_not_a_file_is_refused_by_name"],
        "why": "a lock file planted as a link or a folder fails with a bare OSError (or is locked as a FIFO)",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "        and (not n or {0, n // 2, n - 1} <= set(sampled))",
        "replace": "",
        "tests": [f"{S}::test_a_crafted_fingerprint_is_refused_rather_than_read_whole_or_skipped"],
        "why": "a manifest that names no items (or not the first and last) skips the fingerprint",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "isinstance(sampled, list) and len(sampled) <= _MOST and",
        "replace": "isinstance(sampled, list) and",
        "tests": [f"{S}::test_a_crafted_fingerprint_is_refused_rather_than_read_whole_or_skipped"],
        "why": "a manifest that names every item makes each open iterate the dataset",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "    return sorted({0, n // 2, n - 1, *seeded}) if n else []",
        "replace": "    return sorted({0, n // 2, n - 1, *seeded})",
        "tests": [f"{S}::test_an_empty_dataset_makes_an_empty_store_that_opens_as_empty"],
        "why": "an empty dataset's fingerprint names items -1 and 0: its store is refused as it is written",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": "        if not -(2**63) <= value < 2**63:",
        "replace": "        if not -(2**63) <= value <= 2**63:",
        "tests": [f"{S}::test_ints_at_the_edge_of_int64_are_stored_exactly_and_one_past_is_refused"],
        "why": "2**63 is stored (wrapped to -2**63, or as uint64)",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": "        if not -(2**63) <= value < 2**63:",
        "replace": "        if not -(2**63) < value < 2**63:",
        "tests": [f"{S}::test_ints_at_the_edge_of_int64_are_stored_exactly_and_one_past_is_refused"],
        "why": "-2**63, an int64, is refused",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    return _open(dataset, path, origin, augment, seed, verify, written=True)",
        "replace": "    return _open(dataset, path, origin, augment, seed, verify)",
        "tests": [f"{T}::test_items_come_back_equal_for_every_structure_and_dtype"],
        "why": "the writer reads the fingerprint's items again right after writing them",
    },
]

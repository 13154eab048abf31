"""Planted bugs for issues 29 and 30 (reading stores: wrapped augmented stores, writer/reader agreement, HDF5
virtual sources and links, index bounds), each caught by the tests named for it (see tools/mutants.py)."""

T_WRAP = "tests/test_cache_wrapped.py"
T_AGREE = "tests/test_cache_agree.py"
T_BOUNDS = "tests/test_cache_bounds.py"
T_REFUSE = "tests/test_cache_refusals.py"
T_LINKS = "tests/test_hdf5_links.py"

MUTANTS = [
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "        if not -n <= i < n:",
        "replace": "        if not -n <= i <= n:",
        "tests": [T_WRAP],
        "why": "one past the end of a Subset or ConcatDataset wraps to its first item",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "        return stores[0].read_batch([j for _, j in places], epoch, rank)",
        "replace": "        return stores[0].read_batch([j for _, j in places], 0, rank)",
        "tests": [T_WRAP],
        "why": "a wrapped store's batches drawn with epoch 0's augmentation every epoch",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "k = bisect.bisect_right(dataset.cumulative_sizes, i)",
        "replace": "k = bisect.bisect_left(dataset.cumulative_sizes, i)",
        "tests": [T_WRAP],
        "why": "a ConcatDataset's first item of each part read from the part before it",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "    if inner is None:\n",
        "replace": "    if False:\n",
        "tests": [T_WRAP],
        "why": "a wrapper ct.run cannot follow is not refused",
    },
    {
        "file": "src/composetrain/data/kinds.py",
        "find": "    return None if as_mapped(dataset) is None and _wrapped(dataset) else [dataset]",
        "replace": "    return [dataset]",
        "tests": [T_WRAP],
        "why": "another library's wrapper taken for a dataset ct.run can read whole",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "        return bool(augmented_inside(given)) and joined(given) is not None",
        "replace": "        return False",
        "tests": [T_WRAP],
        "why": "a Subset of an augmented store read through Subset.__getitems__: the same draw every epoch",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "which pass no epoch on\n        store.set_epoch(epoch)",
        "replace": "which pass no epoch on\n        store.set_epoch(0)",
        "tests": [f"{T_WRAP}::test_a_given_dataloader_over_a_subset_of_an_augmented_store_draws_anew_each_epoch"],
        "why": "a given DataLoader's epoch never reaches a store inside its Subset",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "        augmented = augmented or bool(augmented_inside(data.dataset))",
        "replace": "        augmented = augmented",
        "tests": [f"{T_WRAP}::test_a_given_dataloader_over_a_subset_of_an_augmented_store_draws_anew_each_epoch"],
        "why": "persistent workers over a Subset of an augmented store accepted: they keep their first epoch",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    if augmented_inside(dataset):  # a Subset of one: its items are drawn too",
        "replace": "    if False:",
        "tests": [T_WRAP],
        "why": "ct.cache of a Subset of an augmented store stores one draw as the data",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "    if depth > DEPTH:\n",
        "replace": "    if depth > DEPTH + 1:\n",
        "tests": [T_AGREE],
        "why": "an item one container deeper than the reader reads is written and published",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "            manifest_text(_skeleton(item, iter(first)), n, origin)\n",
        "replace": "",
        "tests": [f"{T_AGREE}::test_a_manifest_larger_than_the_reader_reads_is_refused_at_the_first_item"],
        "why": "a manifest too large for the reader refused only after every item is written",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "    if len(text.encode()) > _LIMIT:",
        "replace": "    if len(text.encode()) > 2 * _LIMIT:",
        "tests": [f"{T_AGREE}::test_a_manifest_larger_than_the_reader_reads_is_refused_at_the_first_item"],
        "why": "the writer's manifest limit is not the reader's: a store published that its reader refuses",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "    if not dset.is_virtual:\n        return []",
        "replace": "    if True:\n        return []",
        "tests": [T_LINKS],
        "why": "a virtual dataset's missing source read as fill values; its sources never checked for change",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "    tried += [os.path.join(p, base) for p in prefixes] + [os.path.join(folder, base), base]",
        "replace": "    tried += [os.path.join(p, base) for p in prefixes] + [base]",
        "tests": [f"{T_LINKS}::test_a_virtual_dataset_whose_sources_are_there_reads_their_rows_from_any_folder"],
        "why": "a relative source looked for in the working folder only: one beside the file refused",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "        if isinstance(link, h5py.ExternalLink):",
        "replace": "        if False:",
        "tests": [f"{T_LINKS}::test_a_dangling_link_is_named_with_its_missing_file_or_target"],
        "why": "a dangling external link reported as no such dataset, not naming its missing file",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        return check_rows(augmented, len(idx))",
        "replace": "        return augmented",
        "tests": [T_REFUSE],
        "why": "an augment that drops rows accepted by ct.run's own loader (refused through a DataLoader)",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    if augment is not None and data.ragged:",
        "replace": "    if False:",
        "tests": [f"{T_REFUSE}::test_a_ragged_store_with_augment_is_refused_by_ct_cache_naming_augment"],
        "why": "a ragged store with augment= accepted, to fail at the first batch asking for a collate_fn",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if not -self.length <= i < self.length:",
        "replace": "        if not -self.length <= i <= self.length:",
        "tests": [T_BOUNDS],
        "why": "cached[len(cached)] wraps to item 0",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if not -self.length <= i < self.length:",
        "replace": "        if not -self.length - 1 <= i < self.length:",
        "tests": [T_BOUNDS],
        "why": "cached[-len(cached) - 1] wraps to the last item",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        return int(i) % self.length",
        "replace": "        return int(i)",
        "tests": [T_BOUNDS],
        "why": "a negative index not counted from the end (a ragged field's offsets read backwards)",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if past or not (-self.length <= int(low) and int(high) < self.length):",
        "replace": "        if past or not (-self.length <= int(low) and int(high) <= self.length):",
        "tests": [T_BOUNDS],
        "why": "a batch holding one past the end is not refused by the store (left to whatever reads the rows)",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        return idx if int(low) >= 0 else torch.where(idx < 0, idx + self.length, idx)",
        "replace": "        return idx",
        "tests": [T_BOUNDS],
        "why": "negative indices in a batch not counted from the end",
    },
]

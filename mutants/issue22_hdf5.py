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

# found by the adversary a-hdf5 (tests/test_hdf5_hostile.py, tests/test_cached_images_example.py)
A = "tests/test_hdf5_hostile.py::"
E = "tests/test_cached_images_example.py::"
M = "src/composetrain/data/mapped.py"
R = "src/composetrain/driver/reader.py"

MUTANTS += [
    {
        "file": H,
        "find": "name: Region(file_of(dset), offset, dset.dtype.str, tuple(dset.shape))",
        "replace": "name: Region(path, offset, dset.dtype.str, tuple(dset.shape))",
        "tests": [A + "test_a_dataset_behind_an_external_link_is_read_from_the_linked_file"],
        "why": "an external link's dataset mapped at its offset in the linking file: other bytes, silently",
    },
    {
        "file": F,
        "find": "    except OSError as error:  # cut short, damaged",
        "replace": "    except KeyError as error:  # cut short, damaged",
        "tests": [A + "test_a_file_cut_short_before_ct_hdf5_is_named"],
        "why": "a file cut short reported by h5py alone, without ct.hdf5 or the file's name",
    },
    {
        "file": H,
        "find": "            check_unchanged(self._stamps)\n",
        "replace": "",
        "tests": [A + "test_a_file_changed_after_ct_hdf5_is_refused_not_misread"],
        "why": "a file rewritten, moved, cut short or removed after ct.hdf5 is mapped as it is now: its rows misread",
    },
    {
        "file": F,
        "find": "        if now == then:",
        "replace": "        if now is None or then is None or now[2] == then[2]:",
        "tests": [A + "test_a_file_changed_after_ct_hdf5_is_refused_not_misread"],
        "why": "only the size compared: a file rewritten with other values of the same size passes",
    },
    {
        "file": H,
        "find": "[path, *(file_of(d) for d in columns.values())]",
        "replace": "[path]",
        "tests": [A + "test_a_dataset_behind_an_external_link_is_read_from_the_linked_file"],
        "why": "only the opened file stamped, not one an external link leads to",
    },
    {
        "file": F,
        "find": "        self.opened = weakref.WeakMethod(opened)",
        "replace": "        self.opened = lambda: opened",
        "tests": [A + "test_a_dropped_dataset_closes_its_file_at_once"],
        "why": "the h5py reader holds its dataset strongly: a cycle keeps the file open until a garbage collection",
    },
    {
        "file": M,
        "find": "if idx.ndim != 1 or idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():",
        "replace": "if idx.ndim != 1:",
        "tests": [A + "test_index_lists_that_are_not_integers_are_refused"],
        "why": "read_batch([1.7]) reads row 1 and [True] row 1: indices rounded, never refused",
    },
    {
        "file": M,
        "find": "        if batch.ndim and len(batch) != n:",
        "replace": "        if False:",
        "tests": [A + "test_an_augment_that_changes_the_number_of_rows_is_named"],
        "why": "an augment returning more or fewer rows than indices: items dropped or an IndexError",
    },
    {
        "file": H,
        "find": "    if not -(2**63) <= seed < 2**63:",
        "replace": "    if False:",
        "tests": [A + "test_a_seed_beyond_64_bits_is_refused_when_made"],
        "why": "a seed past int64 accepted: an OverflowError at the first augmented read, far from the call",
    },
    {
        "file": H,
        "find": "    if os.path.isdir(path):",
        "replace": "    if False:",
        "tests": [A + "test_a_path_that_is_not_a_path_or_a_directory_is_named"],
        "why": "a directory reported as 'no file'",
    },
    {
        "file": H,
        "find": "            if h5py.check_ref_dtype(dtype)\n",
        "replace": "            if False\n",
        "tests": [A + "test_a_dataset_of_object_references_is_named_as_such"],
        "why": "a dataset of object references called variable-length",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "    if isinstance(data, HDF5Dataset) and not data.memory_mapped:",
        "replace": "    if False:",
        "tests": [A + "test_the_bottleneck_report_advises_what_fits_an_hdf5_file"],
        "why": "a file h5py reads called 'a ct.cache store already: make its augment cheaper'",
    },
    {
        "file": R,
        "find": "    return dataset.augment is not None or (not dataset.ragged and collate_fn is None)",
        "replace": "    return not dataset.ragged and collate_fn is None",
        "tests": [A + "test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn"],
        "why": "with a collate_fn, augmented items read with the dataset's epoch (never set): one draw for every epoch",
    },
    {
        "file": R,
        "find": 'getattr(inner, "rank", 0), self._given)',
        "replace": 'getattr(inner, "rank", 0))',
        "tests": [A + "test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn"],
        "why": "the collate_fn given dropped in this process: batches collated by default_collate",
    },
    {
        "file": "src/composetrain/driver/loading.py",
        "find": "Batches(data, collate_fn) if whole else data,",
        "replace": "Batches(data) if whole else data,",
        "tests": [A + "test_an_augment_draws_per_epoch_also_when_ct_run_gets_a_collate_fn"],
        "why": "the collate_fn given dropped in loader workers",
    },
    {
        "file": "examples/cached_images.py",
        "find": 'key={"size": args.size}, ',
        "replace": "",
        "tests": [E + "test_a_store_of_another_size_is_a_usage_error_not_a_shape_error"],
        "why": "a --cache store of another --size mapped: a shape error from the model",
    },
    {
        "file": "examples/cached_images.py",
        "find": "        warm_up(args)\n",
        "replace": "",
        "tests": [E + "test_the_epoch_speedup_counts_the_fixed_costs_of_a_run_alike"],
        "why": "the first run's one-off costs counted against the decoded epoch",
    },
    {
        "file": "examples/cached_images.py",
        "find": 'epoch = {"decoded": plain_s, "cached": once_s}',
        "replace": 'epoch = {"decoded": plain_s, "cached": once_s / args.epochs}',
        "tests": [E + "test_the_epoch_speedup_counts_the_fixed_costs_of_a_run_alike"],
        "why": "a run's fixed cost divided by --epochs on the cached side only",
    },
    {
        "file": F,
        "find": "    except BlockingIOError as error:",
        "replace": "    except KeyError as error:",
        "tests": [A + "test_a_file_another_process_writes_is_named_with_the_fix"],
        "why": "h5py's 'unable to lock file, errno = 11' passed on without the file's name or the fix",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    if isinstance(dataset, MappedDataset) and dataset.augment is not None:",
        "replace": "    if False:",
        "tests": [A + "test_caching_an_augmented_dataset_is_refused_not_one_draw_frozen"],
        "why": "ct.cache of an augmented ct.hdf5 dataset stores one draw of the augmentation for every epoch",
    },
]

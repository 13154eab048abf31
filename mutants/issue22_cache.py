"""Planted bugs for issue 22 (ct.cache), each caught by the tests named for it (see tools/mutants.py)."""

T = "tests/test_cache.py"
T_RUN = "tests/test_cache_run.py"
T_BAD = "tests/test_cache_hostile.py"
T_PROC = "tests/test_cache_processes.py"
T_ODD = "tests/test_cache_odd.py"  # the adversary a-cache's findings

MUTANTS = [
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "            f.flush()\n            os.fsync(f.fileno())",
        "replace": "            f.flush()",
        "tests": [f"{T}::test_every_file_and_the_folder_are_fsynced_before_the_store_is_renamed_into_place"],
        "why": "an array file not fsynced before the store is renamed into place: a crash can publish zeros",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "        os.rename(tmp, path)\n        fsync_folder(path.parent)",
        "replace": "        os.rename(tmp, path)",
        "tests": [f"{T}::test_every_file_and_the_folder_are_fsynced_before_the_store_is_renamed_into_place"],
        "why": "the rename that publishes the store is not made durable",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "if (path / MANIFEST).exists() and (not rebuild or fresh):",
        "replace": "if (path / MANIFEST).exists():",
        "tests": [
            f"{T}::test_a_store_made_from_another_dataset_is_refused_and_rebuilt_on_request",
            f"{T}::test_rebuild_writes_again_a_store_whose_fingerprint_items_agree",
        ],
        "why": "rebuild=True never rebuilds: the old store is checked (and refused) again",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "fresh = started <= _created(path) <= time.time()",
        "replace": "fresh = False",
        "tests": [f"{T}::test_processes_waiting_for_a_rebuild_map_it_instead_of_rebuilding_again"],
        "why": "every rank of a job called with rebuild=True rebuilds the store again, one after the other",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "        remove_store(stale, temporary=True)",
        "replace": "        pass",
        "tests": [f"{T_PROC}::test_a_writer_killed_mid_write_leaves_nothing_complete_and_a_rerun_starts_over"],
        "why": "a killed writer's temporary folder is left for ever",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    except BaseException as e:\n        remove_store(tmp, temporary=True)",
        "replace": "    except BaseException as e:\n        pass",
        "tests": [
            f"{T_PROC}::test_a_full_disk_is_a_clear_error_and_leaves_nothing",
            f"{T}::test_items_that_cannot_be_stored_are_refused_by_name",
        ],
        "why": "a failed write (full disk, a refused item) leaves its half-written folder",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "    if info.st_size != size:",
        "replace": "    if info.st_size < size:",
        "tests": [T_BAD],
        "why": "an array file longer than its header says (altered) is accepted",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK",
        "replace": "_READ = os.O_RDONLY | os.O_NONBLOCK",
        "tests": [f"{T_BAD}::test_symbolic_links_inside_a_store_are_refused"],
        "why": "an array file that is a symbolic link (to anywhere) is followed and mapped",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": 'NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")',
        "replace": 'NAME = re.compile(r"^[A-Za-z0-9_./]{1,64}$")',
        "tests": [T_BAD],
        "why": "a manifest may name an array outside the store's folder",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "key = np.array([self.seed, epoch, rank, *indices], dtype=np.int64).tobytes()",
        "replace": "key = np.array([self.seed, rank, *indices], dtype=np.int64).tobytes()",
        "tests": [f"{T_RUN}::test_augmentation_differs_per_epoch_and_batch_and_resumes_bit_exactly"],
        "why": "the augmentation repeats every epoch",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": 'read_whole(self.dataset, indices, getattr(inner, "epoch", 0), getattr(inner, "rank", 0), self._given)',
        "replace": 'read_whole(self.dataset, indices, 0, getattr(inner, "rank", 0), self._given)',
        "tests": [f"{T_RUN}::test_augmentation_in_loader_workers_draws_as_in_this_process"],
        "why": "ct.run's own reader augments every epoch as the first",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "    whole = mapped(data, collate_fn)",
        "replace": "    whole = False",
        "tests": [f"{T_RUN}::test_augmentation_in_loader_workers_draws_as_in_this_process"],
        "why": "loader workers read a cache through __getitems__: their copy never sees the epoch",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "            t = torch.empty(t.shape, dtype=t.dtype)\n        dtype = torch_dtype(field.dtype)\n"
        "        return t if t.dtype == dtype else t.view(dtype)",
        "replace": "            t = torch.empty(t.shape, dtype=t.dtype)\n        return t",
        "tests": [f"{T}::test_dtypes_numpy_lacks_come_back_as_themselves"],
        "why": "a bfloat16 or float8 tensor comes back as the integers it is stored as",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "        elif here != paths:",
        "replace": "        elif len(here) != len(paths):",
        "tests": [f"{T}::test_items_that_cannot_be_stored_are_refused_by_name"],
        "why": "an item whose dict keys come in another order is stored field by field into the wrong columns",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "        if self._mapped:  # one gather per field",
        "replace": "        if False:  # one gather per field",
        "tests": [
            f"{T_RUN}::test_a_run_over_the_cache_is_bit_identical_to_one_over_the_original_and_reads_whole_batches"
        ],
        "why": "ct.run reads a cache item by item and collates (slow path)",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "for k, v in origin.items() if made.get(k) != v]",
        "replace": 'for k, v in origin.items() if k != "key" and made.get(k) != v]',
        "tests": [f"{T}::test_a_store_made_from_another_dataset_is_refused_and_rebuilt_on_request"],
        "why": "a store written under another key (another preprocessing) is used as is",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "        if all(s == first for s in self.shapes):",
        "replace": "        if all(len(s) == len(first) for s in self.shapes):",
        "tests": [f"{T_BAD}::test_ragged_items_come_back_and_batches_need_a_collate_fn"],
        "why": "a field whose shape varies is taken for a fixed one",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "key = np.array([self.seed, epoch, rank, *indices], dtype=np.int64).tobytes()",
        "replace": "key = np.array([self.seed, epoch, *indices], dtype=np.int64).tobytes()",
        "tests": [f"{T_RUN}::test_augmentation_differs_per_epoch_and_batch_and_resumes_bit_exactly"],
        "why": "two ranks reading the same indices (a padded last batch) augment them alike",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": 'return {**self.__dict__, "_arrays": None, "_views": {}}',
        "replace": "return dict(self.__dict__)",
        "tests": [f"{T}::test_the_store_is_mapped_never_loaded_and_loader_workers_get_no_copy_of_it"],
        "why": "every loader worker receives a pickled copy of the whole store",
    },
    # a-cache (adversary): the fixes for what it found
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    if isinstance(dataset, IterableDataset):",
        "replace": "    if False:",
        "tests": [f"{T_ODD}::test_an_iterable_dataset_is_refused_even_with_a_len"],
        "why": "an IterableDataset with a __len__ fails in torch's inherited __getitem__ (NotImplementedError)",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "t = value.detach().resolve_conj().resolve_neg().contiguous()",
        "replace": "t = value.detach().contiguous()",
        "tests": [f"{T_ODD}::test_conjugate_and_negative_views_are_stored_as_their_values"],
        "why": "a conjugate view (x.conj()) cannot be written: numpy() refuses it",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": "        if value.is_quantized:",
        "replace": "        if False:",
        "tests": [f"{T_ODD}::test_quantized_tensors_are_refused_rather_than_read_back_without_their_scale"],
        "why": "a quantized tensor is stored without its scale and read back as an unusable tensor",
    },
    {
        "file": "src/composetrain/data/layout.py",
        "find": "type(value) not in (np.ndarray, np.memmap):",
        "replace": "type(value) not in (np.ndarray, np.memmap, np.ma.MaskedArray, np.matrix):",
        "tests": [f"{T_ODD}::test_numpy_memmap_rows_are_stored_and_verify_accepts_them_other_subclasses_are_refused"],
        "why": "a masked array's mask is silently dropped",
    },
    {
        "file": "src/composetrain/data/equal.py",
        "find": "    if _kind(a) is not _kind(b):",
        "replace": "    if type(a) is not type(b):",
        "tests": [f"{T_ODD}::test_numpy_memmap_rows_are_stored_and_verify_accepts_them_other_subclasses_are_refused"],
        "why": "verify=True refuses a correct store of a dataset returning rows of a np.memmap",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if idx.ndim > 1 or idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():",
        "replace": "        if idx.ndim > 1 or idx.is_complex():",
        "tests": [f"{T_ODD}::test_indices_that_are_not_ints_are_refused_and_integer_tensors_index_as_in_the_dataset"],
        "why": "read_batch([1.7]) silently reads item 1, read_batch([True, False]) items 1 and 0",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "            i = operator.index(i)",
        "replace": "            i = i if isinstance(i, int | np.integer) else int(i.foo)",
        "tests": [f"{T_ODD}::test_indices_that_are_not_ints_are_refused_and_integer_tensors_index_as_in_the_dataset"],
        "why": "a 0-dim integer tensor indexes the original dataset but not the cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK",
        "replace": "_READ = os.O_RDONLY | os.O_NOFOLLOW",
        "tests": [f"{T_ODD}::test_a_fifo_in_a_store_is_refused_without_blocking"],
        "why": "a FIFO in a crafted store blocks the reader for ever",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "    except (ValueError, RecursionError) as e:",
        "replace": "    except ValueError as e:",
        "tests": [f"{T_ODD}::test_a_deeply_nested_or_overflowing_manifest_is_refused_as_a_store_error"],
        "why": "a deeply nested manifest escapes as a RecursionError rather than a StoreError",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "            and bool(np.all(np.prod(block.astype(np.float64), axis=1) < 2**62))",
        "replace": "",
        "tests": [f"{T_ODD}::test_a_deeply_nested_or_overflowing_manifest_is_refused_as_a_store_error"],
        "why": "ragged shapes whose product wraps around int64 pass the check and fail when read",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "    if (mapped_data := as_mapped(loader.dataset)) is not None:\n        mapped_data.set_epoch(epoch)",
        "replace": "    pass",
        "tests": [f"{T_ODD}::test_a_given_dataloader_run_by_ct_run_augments_each_epoch_anew"],
        "why": "ct.run over a given DataLoader of an augmented cache draws the same augmentation every epoch",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "        fd = self._reopen(os.O_WRONLY | os.O_APPEND)\n        try:\n"
        '            left = memoryview(b"".join(self.pending))\n            while left:\n'
        "                left = left[os.write(fd, left) :]\n        finally:\n            os.close(fd)\n",
        "replace": '        fd = self.keep = getattr(self, "keep", None) or self._reopen(os.O_WRONLY | os.O_APPEND)\n'
        '        left = memoryview(b"".join(self.pending))\n        while left:\n'
        "            left = left[os.write(fd, left) :]\n",
        "tests": [f"{T_ODD}::test_items_with_more_leaves_than_open_files_allowed_are_written"],
        "why": "one file held open per leaf: an item with more leaves than the open-file limit fails (EMFILE)",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    path = Path(os.path.realpath(path))",
        "replace": "    path = Path(os.path.abspath(path))",
        "tests": [f"{T_ODD}::test_a_link_to_a_store_is_followed_and_a_rebuild_writes_where_it_points"],
        "why": "a rebuild through a link replaces the link by a folder (on the wrong disk) and leaves the link beside",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if batch.ndim and len(batch) != n:",
        "replace": "        if False:",
        "tests": [f"{T_ODD}::test_an_augment_that_changes_the_batch_size_is_named"],
        "why": "an augment returning fewer rows fails with IndexError: list index out of range",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if not t.numel():  # NumPy may give",
        "replace": "        if False:  # NumPy may give",
        "tests": [f"{T_ODD}::test_empty_complex_tensors_come_back_viewable_and_verify_compares_them"],
        "why": "an empty tensor comes back with zero strides: .view(dtype) on it fails",
    },
    {
        "file": "src/composetrain/data/equal.py",
        "find": "        if not a.numel():",
        "replace": "        if False:",
        "tests": [f"{T_ODD}::test_empty_complex_tensors_come_back_viewable_and_verify_compares_them"],
        "why": "verify=True crashes comparing an empty complex tensor",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if e.errno != errno.ENOMEM:",
        "replace": "        if True:",
        "tests": [f"{T_ODD}::test_a_map_refused_for_lack_of_address_space_says_so"],
        "why": "a store mapped past ulimit -v fails with a bare 'Cannot allocate memory'",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": '    if sampled and fingerprint(items[i] for i in sampled) != recorded.get("blake2b"):',
        "replace": "    if False:",
        "tests": [
            f"{T_ODD}::test_the_store_records_a_fingerprint_of_some_items_and_verify_finds_a_change_in_the_middle"
        ],
        "why": "verify=True misses a dataset changed only between its first and last items",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "    return sorted({0, n // 2, n - 1, *seeded}) if n else []",
        "replace": "    return sorted({0, n - 1, *seeded}) if n else []",
        "tests": [
            f"{T_ODD}::test_the_store_records_a_fingerprint_of_some_items_and_verify_finds_a_change_in_the_middle"
        ],
        "why": "the fingerprint samples only the items verify already compares with the store",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "            digest.update(repr((where, leaf_kind(value, where))).encode())\n",
        "replace": "",
        "tests": [
            f"{T_ODD}::test_the_store_records_a_fingerprint_of_some_items_and_verify_finds_a_change_in_the_middle"
        ],
        "why": "the fingerprint ignores structure, dtype and shape: only bytes",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "    return dataset.augment is not None or (not dataset.ragged and collate_fn is None)",
        "replace": "    return not dataset.ragged and collate_fn is None",
        "tests": [f"{T_ODD}::test_an_augmented_cache_with_a_collate_fn_is_augmented_per_epoch_by_ct_run"],
        "why": "ct.run over an augmented cache with a collate_fn draws the same augmentation every epoch",
    },
    {
        "file": "src/composetrain/data/wrapped.py",
        "find": "    return batch if collate is None else collate(split_batch(batch, len(indices)))",
        "replace": "    return batch",
        "tests": [f"{T_ODD}::test_an_augmented_cache_with_a_collate_fn_is_augmented_per_epoch_by_ct_run"],
        "why": "loader workers ignore the collate_fn given to ct.run for an augmented cache",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "            with contextlib.suppress(OSError):\n                os.ftruncate(fd, 0)",
        "replace": "            with contextlib.nullcontext():\n                os.ftruncate(fd, 0)",
        "tests": [f"{T_ODD}::test_a_disk_too_full_for_the_lock_files_note_fails_as_a_full_disk_with_the_cache_message"],
        "why": "a disk full at the lock's first byte fails with a bare errno, without the cache's message",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "fresh = started <= _created(path) <= time.time()",
        "replace": "fresh = started <= _created(path)",
        "tests": [f"{T_ODD}::test_rebuild_is_not_skipped_for_a_store_dated_in_the_future"],
        "why": "rebuild=True keeps (and maps) a store whose clock was ahead: stale items, silently",
    },
    {
        "file": "src/composetrain/data/equal.py",
        "find": "    if isinstance(x, np.generic):\n        return np.generic\n",
        "replace": "",
        "tests": [f"{T_ODD}::test_numpy_scalars_of_an_alias_type_pass_verify"],
        "why": "verify=True refuses a correct store of np.longlong scalars (read back as np.int64, the same dtype)",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": '    timeout = check_real(timeout, CACHE, "timeout",',
        "replace": '    timeout = float(timeout) if timeout is True else check_real(timeout, CACHE, "timeout",',
        "tests": [f"{T_ODD}::test_a_bool_timeout_is_refused_rather_than_taken_for_one_second"],
        "why": "timeout=True is taken for one second",
    },
]

"""Planted bugs for issue 22 (ct.cache), each caught by the tests named for it (see tools/mutants.py)."""

T = "tests/test_cache.py"
T_RUN = "tests/test_cache_run.py"
T_BAD = "tests/test_cache_hostile.py"
T_PROC = "tests/test_cache_processes.py"

MUTANTS = [
    {
        "file": "src/composetrain/data/files.py",
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
        "tests": [f"{T}::test_a_store_made_from_another_dataset_is_refused_and_rebuilt_on_request"],
        "why": "rebuild=True never rebuilds: the old store is checked (and refused) again",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "fresh = waited or _created(path) >= started",
        "replace": "fresh = _created(path) >= started",
        "tests": [f"{T}::test_processes_waiting_for_a_rebuild_map_it_instead_of_rebuilding_again"],
        "why": "every rank of a job called with rebuild=True rebuilds the store again, one after the other",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "        shutil.rmtree(stale, ignore_errors=True)",
        "replace": "        pass",
        "tests": [f"{T_PROC}::test_a_writer_killed_mid_write_leaves_nothing_complete_and_a_rerun_starts_over"],
        "why": "a killed writer's temporary folder is left for ever",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    except BaseException as e:\n        shutil.rmtree(tmp, ignore_errors=True)",
        "replace": "    except BaseException as e:\n        pass",
        "tests": [
            f"{T_PROC}::test_a_full_disk_is_a_clear_error_and_leaves_nothing",
            f"{T}::test_items_that_cannot_be_stored_are_refused_by_name",
        ],
        "why": "a failed write (full disk, a refused item) leaves its half-written folder",
    },
    {
        "file": "src/composetrain/data/files.py",
        "find": "    if info.st_size != size:",
        "replace": "    if info.st_size < size:",
        "tests": [T_BAD],
        "why": "an array file longer than its header says (altered) is accepted",
    },
    {
        "file": "src/composetrain/data/files.py",
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
        "find": 'return self.dataset.read_batch(indices, getattr(inner, "epoch", 0), getattr(inner, "rank", 0))',
        "replace": 'return self.dataset.read_batch(indices, 0, getattr(inner, "rank", 0))',
        "tests": [f"{T_RUN}::test_augmentation_in_loader_workers_draws_as_in_this_process"],
        "why": "ct.run's own reader augments every epoch as the first",
    },
    {
        "file": "src/composetrain/driver/loading.py",
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
]

"""Planted bugs for the fixes of the third data adversary's findings (issue 31, the data round after item 1): a
store's items in other containers, indices past int64, types ct.hdf5 must leave to h5py, the files a rebuild may
remove, the lock file never a user's, an epoch cut short by a StopIteration, opening in memory independent of the
length, the writer's own generator, the working folder, names too long, disk errors, crafted manifests; each caught
by the tests named for it (see tools/mutants.py). Grouped by the source files they plant into (issue 31 item 5)."""

CACHE = "src/composetrain/data/cache.py"
FILES = "src/composetrain/data/store_files.py"
STORE = "src/composetrain/data/store.py"
WRITER = "src/composetrain/data/writer.py"
MAPPED = "src/composetrain/data/mapped.py"
H5FILES = "src/composetrain/data/h5files.py"
READER = "src/composetrain/driver/reader.py"

T_CACHE = "tests/test_cache.py::"
T_BOUNDS = "tests/test_cache_bounds.py::"
T_STORE = "tests/test_cache_store.py::"
T_DAMAGED = "tests/test_cache_damaged.py::"
T_WRITERS = "tests/test_cache_writers.py::"
T_HDF5 = "tests/test_hdf5.py::"

MUTANTS = [
    # -- writer.py: items, containers, the loader --------------------------------------------------------------
    {
        "file": WRITER,
        "find": "        elif made != nests:",
        "replace": "        elif False:",
        "tests": [T_CACHE + "test_items_whose_containers_differ_are_refused_or_come_back_as_they_were"],
        "why": "finding 1: a tuple and a list (or empty containers) share their leaves: item 0's served for each",
    },
    {
        "file": WRITER,
        "find": "        containers.append((where, kind))",
        "replace": "        containers.append((where, tuple))",
        "tests": [T_CACHE + "test_items_whose_containers_differ_are_refused_or_come_back_as_they_were"],
        "why": "finding 1: containers compared by place only, not type: a list in item 1 comes back as a tuple",
    },
    {
        "file": WRITER,
        "find": "    if count != n:",
        "replace": "    if False:",
        "tests": [T_CACHE + "test_a_stopiteration_while_a_store_is_written_by_workers_is_named"],
        "why": "finding 7: a worker's StopIteration ends the items early: a bare AssertionError from the bookkeeping",
    },
    {
        "file": WRITER,
        "find": "prefetch_factor=4, generator=torch.Generator().manual_seed(0))",
        "replace": "prefetch_factor=4)",
        "tests": [T_CACHE + "test_writing_with_loader_workers_leaves_the_global_random_state_alone"],
        "why": "finding 9: writing with workers draws their base seed from the global torch generator",
    },
    # -- mapped.py: indices ------------------------------------------------------------------------------------
    {
        "file": MAPPED,
        "find": "        past = given.dtype == torch.uint64 and int(given.cpu().numpy().max()) >= self.length",
        "replace": "        past = False",
        "tests": [T_BOUNDS + "test_an_unsigned_index_past_the_end_is_an_index_error_not_an_item_from_the_end"],
        "why": "finding 2: the cast to int64 reads 2**64 - 1 as -1: the last item served for an index past the end",
    },
    {
        "file": MAPPED,
        "find": "                i = i.item()  # past int64",
        "replace": "                pass  # past int64",
        "tests": [T_BOUNDS + "test_an_index_past_int64_is_an_index_error_naming_it"],
        "why": "finding 13: a 0-dim uint64 tensor past int64 is a bare RuntimeError, naming neither dataset nor index",
    },
    {
        "file": MAPPED,
        "find": "        except (TypeError, ValueError, RuntimeError):  # an int past int64",
        "replace": "        except TypeError:  # an int past int64",
        "tests": [T_BOUNDS + "test_an_index_past_int64_is_an_index_error_naming_it"],
        "why": "finding 13: a Python int past int64 in a batch is a bare ValueError 'Overflow when unpacking long'",
    },
    # -- h5files.py: what is memory-mapped ---------------------------------------------------------------------
    {
        "file": H5FILES,
        "find": "    if not dset.id.get_type().equal(h5py.h5t.py_create(dset.dtype, logical=True)):\n",
        "replace": "    if False:\n",
        "tests": [T_HDF5 + "test_a_contiguous_dataset_of_a_type_numpy_does_not_lay_out_reads_as_h5py_reads_it"],
        "why": "finding 3: a 12-bit or offset integer type is mapped as its dtype's bytes: -100 read as 3996",
    },
    # -- store.py: the files a rebuild removes, the lock file, disk errors -------------------------------------
    {
        "file": STORE,
        "find": "        if not (plain and (name in own or (temporary and _OWN.fullmatch(name)))):",
        "replace": "        if not (plain and (name in own or _OWN.fullmatch(name))):",
        "tests": [T_STORE + "test_rebuild_never_removes_a_users_array_named_like_one_the_store_does_not_have"],
        "why": "finding 4: the store's own arrays matched by name (f<n>[os].npy): a user's f7.npy deleted on rebuild",
    },
    {
        "file": STORE,
        "find": '[f"f{n}.npy", *([f"f{n}o.npy", f"f{n}s.npy"] if r else [])]',
        "replace": '[f"f{n}.npy", f"f{n}o.npy", f"f{n}s.npy"]',
        "tests": [T_STORE + "test_rebuild_never_removes_a_users_array_named_like_one_the_store_does_not_have"],
        "why": "finding 4: a fixed field's offsets and shapes names taken as the store's: a user's f0s.npy deleted",
    },
    {
        "file": STORE,
        "find": "    if info.st_nlink == 1 and (not text or _HOLDER.fullmatch(text)):",
        "replace": "    if not text or _HOLDER.fullmatch(text):",
        "tests": [T_WRITERS + "test_a_file_at_the_lock_files_path_is_never_overwritten"],
        "why": "finding 5: a hard link at the lock's path is written into: the user's file at its other name changes",
    },
    {
        "file": STORE,
        "find": "    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):",
        "replace": "    elif e.errno in (errno.EROFS,):",
        "tests": [T_WRITERS + "test_a_full_or_read_only_disk_before_the_first_item_is_a_cache_error_with_the_fix"],
        "why": "finding 15: a folder this process cannot write fails at the lock file with a bare EACCES",
    },
    # -- cache.py: the lock, the place, dates, the fingerprint's items -----------------------------------------
    {
        "file": CACHE,
        "find": "        writable = created or check_lock_owner(lock, fd)",
        "replace": "        writable = True",
        "tests": [T_WRITERS + "test_a_file_at_the_lock_files_path_is_never_overwritten"],
        "why": "finding 5: a user's file at the lock's path is truncated and written with the holder's line",
    },
    {
        "file": CACHE,
        "find": "                return os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644), True",
        "replace": "                return os.open(lock, flags | os.O_CREAT, 0o644), True",
        "tests": [T_WRITERS + "test_a_file_at_the_lock_files_path_is_never_overwritten"],
        "why": "finding 5: without O_EXCL every lock file counts as made by this call: a user's file written into",
    },
    {
        "file": CACHE,
        "find": "            if (error := disk_error(lock, e)) is not None:\n                raise error from e",
        "replace": "            if False:\n                raise e",
        "tests": [T_WRITERS + "test_a_full_or_read_only_disk_before_the_first_item_is_a_cache_error_with_the_fix"],
        "why": "finding 15: a full or read-only disk at the lock file is a bare OSError naming .store.lock",
    },
    {
        "file": CACHE,
        "find": "        if (error := disk_error(path, e)) is not None:\n            raise error from e\n        raise",
        "replace": "        raise",
        "tests": [T_WRITERS + "test_a_full_or_read_only_disk_before_the_first_item_is_a_cache_error_with_the_fix"],
        "why": "finding 15: a disk out of inodes at the temporary folder is a bare OSError naming .store.tmp-<hex>",
    },
    {
        "file": CACHE,
        "find": "    if here is not None and (path == here or path in here.parents):",
        "replace": "    if here is not None and path in here.parents:",
        "tests": [T_STORE + "test_caching_into_the_working_folder_leaves_the_process_a_working_folder"],
        "why": "finding 10: ct.cache(data, '.') renames the working folder away and removes it",
    },
    {
        "file": CACHE,
        "find": "    if 0 < most < longest:",
        "replace": "    if 0 < most < size:",
        "tests": [T_WRITERS + "test_a_store_name_too_long_for_the_files_beside_it_is_refused_before_anything_is_made"],
        "why": "finding 14: a name of 238-255 bytes: the lock file made, then a bare 'File name too long' for a temp",
    },
    {
        "file": CACHE,
        "find": "    except OverflowError:  # an int past the floats",
        "replace": "    except ZeroDivisionError:  # an int past the floats",
        "tests": [T_DAMAGED + "test_a_store_dated_past_the_floats_is_rebuilt_on_request"],
        "why": "finding 16: a manifest dated 10**400 makes rebuild=True die with a bare OverflowError",
    },
    {
        "file": CACHE,
        "find": "and (not sampled or (sampled[0] >= 0 and sampled[-1] < n))",
        "replace": "and set(sampled) <= set(range(n))",
        "tests": [T_STORE + "test_opening_a_store_takes_memory_independent_of_its_length"],
        "why": "finding 8: every open builds a set of every index: 60 GB for a store of 10**9 items",
    },
    # -- files.py: reading a manifest and an array -------------------------------------------------------------
    {
        "file": FILES,
        "find": "            data = f.read(min(info.st_size, limit) + 1)",
        "replace": "            data = f.read(limit + 1)",
        "tests": [T_STORE + "test_opening_a_store_takes_memory_independent_of_its_length"],
        "why": "finding 8: every open of a store allocates the manifest's 16 MiB limit, whatever its size",
    },
    {
        "file": FILES,
        "find": "    except (ValueError, RecursionError) as e:  # ValueError: not JSON",
        "replace": "    except (json.JSONDecodeError, RecursionError) as e:  # ValueError: not JSON",
        "tests": [T_DAMAGED + "test_a_manifest_of_another_tool_with_a_huge_integer_is_named_and_never_replaced"],
        "why": "finding 11: a manifest with a 5000-digit int is a bare ValueError, and taken for a damaged store",
    },
    {
        "file": FILES,
        "find": "    info = os.fstat(fd)\n    if not stat.S_ISREG(info.st_mode):  # checked before fdopen",
        "replace": "    info = os.fstat(fd)\n    if False:  # checked before fdopen",
        "tests": [T_DAMAGED + "test_an_array_file_that_is_a_folder_is_refused_as_a_store_error"],
        "why": "finding 12: a folder named f0.npy is a bare IsADirectoryError naming a file descriptor",
    },
    # -- driver/reader.py: an epoch cut short ------------------------------------------------------------------
    {
        "file": READER,
        "find": "    if got < expected:",
        "replace": "    if False:",
        "tests": ["tests/test_data.py::test_a_stopiteration_in_a_loader_worker_is_an_error_not_the_end_of_the_epoch"],
        "why": "finding 6: a worker's StopIteration ends ct.run's epoch early, silently: 3 of 5 batches trained",
    },
]

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
HDF5 = "src/composetrain/data/hdf5.py"

T_CACHE = "tests/test_cache.py::"
T_BOUNDS = "tests/test_cache_bounds.py::"
T_STORE = "tests/test_cache_store.py::"
T_DAMAGED = "tests/test_cache_damaged.py::"
T_WRITERS = "tests/test_cache_writers.py::"
T_HDF5 = "tests/test_hdf5.py::"
T_LINKS = "tests/test_hdf5_links.py::"
T_RUN = "tests/test_cache_run.py::"

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
        "find": '    return [name for name, suffix in zip(names, ("", "o", "s"), strict=False) '
        'if name == f"f{n}{suffix}"]',
        "replace": '    return [f"f{n}{suffix}" for suffix in ("", "o", "s")]',
        "tests": [T_STORE + "test_rebuild_never_removes_a_users_array_named_like_one_the_store_does_not_have"],
        "why": "finding 4: a fixed field's offsets and shapes names taken as the store's: a user's f0s.npy deleted",
    },
    {
        "file": STORE,
        "find": "    if info.st_nlink == 1 and info.st_size == len(text) <= _LINE "
        "and (not text or _HOLDER.fullmatch(text)):",
        "replace": "    if info.st_size == len(text) <= _LINE and (not text or _HOLDER.fullmatch(text)):",
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
        "find": "    places = [here, *here.parents] if here is not None and found is not None else []",
        "replace": "    places = [*here.parents] if here is not None and found is not None else []",
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
    # == the fourth data round (issue 31): W = worst, H = high, L = low, as the round's findings are numbered =======
    # -- store.py: the lock file's whole content, a writer's temporary folders, a field's own arrays -------------
    {
        "file": STORE,
        "find": "    info, text = os.fstat(fd), os.pread(fd, _LINE + 1, 0)\n"
        "    if info.st_nlink == 1 and info.st_size == len(text) <= _LINE and (not text or _HOLDER.fullmatch(text)):",
        "replace": "    info, text = os.fstat(fd), os.pread(fd, 512, 0)\n"
        '    if info.st_nlink == 1 and (not text or re.fullmatch(rb"process [0-9]+ on [^\\n]{0,255}", text)):',
        "tests": [T_WRITERS + "test_a_lock_file_longer_than_a_holders_line_is_never_truncated"],
        "why": "round 4, W4: a 2.5 kB file whose first 512 bytes read as a holder's line is truncated to one",
    },
    {
        "file": STORE,
        "find": "    temporary = temporary and not os.path.lexists(folder / MANIFEST)",
        "replace": "    temporary = bool(temporary)",
        "tests": [T_WRITERS + "test_a_users_folder_named_like_a_writers_temporary_keeps_its_files"],
        "why": "round 4, W5: a dead writer's folder loses every f<n>.npy, its manifest (another tool's) unread",
    },
    {
        "file": STORE,
        "find": "    except (OSError, NotAStore):\n        return set()",
        "replace": "    except (OSError, NotAStore):\n        return {MANIFEST}",
        "tests": [T_WRITERS + "test_a_users_folder_named_like_a_writers_temporary_keeps_its_files"],
        "why": "round 4, W5: another tool's manifest.json in a folder named like a dead writer's is deleted",
    },
    {
        "file": STORE,
        "find": '    return [name for name, suffix in zip(names, ("", "o", "s"), strict=False) '
        'if name == f"f{n}{suffix}"]',
        "replace": '    return [f"f{n}{suffix}" for name, suffix in zip(names, ("", "o", "s"), strict=False) '
        'if name is None or name == f"f{n}{suffix}"]',
        "tests": [T_DAMAGED + "test_a_field_the_manifest_does_not_call_ragged_owns_no_offsets_or_shapes"],
        "why": "round 4, W6: a field that names no offsets or shapes owns f<n>o.npy, f<n>s.npy by its place",
    },
    {
        "file": STORE,
        "find": '        elif _gone(int(named["pid"])):',
        "replace": "        else:",
        "tests": [T_WRITERS + "test_a_writers_temporary_folder_is_removed_only_once_its_writer_is_gone"],
        "why": "round 4, H4: a live writer's temporary folder (flock not honoured) is emptied by a second writer",
    },
    {
        "file": STORE,
        "find": '        if named["host"] != host:',
        "replace": "        if False:",
        "tests": [T_WRITERS + "test_a_writers_temporary_folder_is_removed_only_once_its_writer_is_gone"],
        "why": "round 4, H4: another host's writer judged by a pid of this host: removed when that pid is free here",
    },
    # -- store_files.py: an array removed or cut short under its writer, a ragged field's check in blocks --------
    {
        "file": FILES,
        "find": "            return os.open(self.path, flags)",
        "replace": "            return os.open(self.path, flags | os.O_CREAT, 0o644)",
        "tests": [T_WRITERS + "test_a_writers_array_changed_by_another_process_is_never_published"],
        "why": "round 4, H4: an array removed under its writer is made again mid-way, its header over later rows",
    },
    {
        "file": FILES,
        "find": "    step = max(1, _BLOCK // (8 * (shapes.shape[1] + 1))) if ok else 1",
        "replace": "    step = max(1, length) if ok else 1",
        "tests": [T_STORE + "test_opening_a_ragged_store_takes_memory_independent_of_its_length"],
        "why": "round 4, H1: every open loads a ragged field's offsets and shapes whole: 8 GB per rank for 10**8",
    },
    {
        "file": FILES,
        "find": "    for start in range(0, length if ok else 0, step):",
        "replace": "    for start in range(0, min(length, step) if ok else 0, step):",
        "tests": [T_DAMAGED + "test_a_ragged_store_whose_shapes_are_wrong_past_the_first_block_is_refused"],
        "why": "round 4, H1: only a ragged field's first block checked: wrong shapes further on served",
    },
    # -- cache.py: the written open under the lock, a call inside another, rebuild after waiting, publishing ---
    {
        "file": CACHE,
        "find": "        return _open(dataset, path, origin, augment, seed, verify, written=True)  # locked: no other "
        "store swapped in",
        "replace": "    return _open(dataset, path, origin, augment, seed, verify, written=True)",
        "tests": [T_STORE + "test_a_store_just_written_is_not_swapped_for_another_writers_before_it_is_opened"],
        "why": "round 4, W2: the lock released before the written open: another job's store served as this one's",
    },
    {
        "file": CACHE,
        "find": "                if path in held:  # an flock is per open file",
        "replace": "                if False:  # an flock is per open file",
        "tests": [T_WRITERS + "test_a_cache_call_inside_another_of_the_same_store_is_refused_not_waited_for"],
        "why": "round 4, W2: a ct.cache of a store inside another call of it waits for itself until its timeout",
    },
    {
        "file": CACHE,
        "find": "        fresh = started <= _created(path) <= time.time()",
        "replace": "        fresh = _created(path) <= time.time()",
        "tests": [T_STORE + "test_rebuild_after_waiting_for_an_older_write_writes_this_datasets_items"],
        "why": "round 4, W3: rebuild=True after waiting maps a store begun before it: the buggy item 3 served",
    },
    {
        "file": CACHE,
        "find": "        _check_written(tmp, path)\n",
        "replace": "",
        "tests": [T_WRITERS + "test_a_writers_array_changed_by_another_process_is_never_published"],
        "why": "round 4, H4: an array cut short by a second writer is published: the store refused at every open",
    },
    {
        "file": CACHE,
        "find": "    holding = [p for p in places if _folder(p) == found]",
        "replace": "    holding = [p for p in places if p == path]",
        "tests": [T_STORE + "test_the_working_folder_seen_through_a_bind_mount_is_refused"],
        "why": "round 4, L1: the working folder seen through a bind mount is renamed away and removed",
    },
    # -- hdf5.py, h5files.py: the files rows come from, types NumPy lacks, filters without a plugin -------------
    {
        "file": HDF5,
        "find": "        self._by_h5py = {name: (file_of(d), d.name, tuple(d.shape), d.dtype, sources[name])",
        "replace": "        self._by_h5py = {name: (path, name, tuple(d.shape), d.dtype, sources[name])",
        "tests": [T_LINKS + "test_rows_behind_an_external_link_come_from_the_file_ct_hdf5_found"],
        "why": "round 4, W1: a relative external link followed again at each read: rows of another file after a cd",
    },
    {
        "file": H5FILES,
        "find": "        if self.sources:  # a virtual dataset: HDF5 finds its sources again at this read",
        "replace": "        if False:  # a virtual dataset: HDF5 finds its sources again at this read",
        "tests": [T_LINKS + "test_rows_of_a_virtual_dataset_come_from_the_sources_ct_hdf5_checked"],
        "why": "round 4, W1: a virtual dataset's relative source found elsewhere at a read: another file's rows",
    },
    {
        "file": HDF5,
        "find": "    except TypeError:  # an HDF5 type NumPy has no dtype for",
        "replace": "    except ZeroDivisionError:  # an HDF5 type NumPy has no dtype for",
        "tests": [T_HDF5 + "test_an_hdf5_integer_type_numpy_has_no_dtype_for_is_named"],
        "why": "round 4, H2: 3-byte integers are h5py's bare TypeError \"data type '<i3' not understood\"",
    },
    {
        "file": HDF5,
        "find": "            check_filters(name, dset, path)",
        "replace": "            pass",
        "tests": [T_HDF5 + "test_an_hdf5_dataset_whose_filter_is_not_installed_is_named"],
        "why": "round 4, H3: a zstd dataset without hdf5plugin fails at its first read with HDF5's words only",
    },
    # -- writer.py, mapped.py: two messages -----------------------------------------------------------------------
    {
        "file": WRITER,
        "find": "    what = f\"NumPy {'scalar' if scalar else 'array'}\" if kind == \"numpy\" else kind",
        "replace": "    what = kind",
        "tests": [T_CACHE + "test_a_numpy_scalar_then_a_zero_dim_array_is_said_as_such"],
        "why": "round 4, L2: a NumPy scalar then a 0-dim array said as 'a numpy of <f4, and in item 0 a numpy of <f4'",
    },
    {
        "file": MAPPED,
        "find": "            if not isinstance(indices, Iterable):",
        "replace": "            if False:",
        "tests": [T_BOUNDS + "test_read_batch_given_a_slice_names_itself"],
        "why": "round 4, L3: read_batch(slice(0, 3)) is Python's bare \"'slice' object is not iterable\"",
    },
]

"""The planted bugs of src/composetrain/data/store.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/store.py",
        "find": ("        read_manifest(path)\n    except NotAStore as e:"),
        "replace": ("        pass\n    except NotAStore as e:"),
        "tests": [
            "tests/test_cache_store.py::test_a_folder_with_a_manifest_of_its_own_is_never_replaced",
        ],
        "why": "any folder with a manifest.json counts as a store: rebuild=True deletes a WebDataset folder",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)",
        "replace": "    return (s.st_dev, 0, s.st_size, 0)",
        "tests": [
            "tests/test_cache_store.py::test_a_store_changed_after_it_was_opened_is_refused_before_it_is_mapped",
        ],
        "why": "a rebuilt store of the same sizes passes for the one opened: workers read other data",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "n.startswith(prefix) and _TEMPORARY.fullmatch(n[len(prefix) :])]",
        "replace": "n.startswith(prefix)]",
        "tests": [
            "tests/test_cache_store.py::test_stale_temporaries_are_matched_by_name_not_by_glob",
        ],
        "why": "the writer of store s[1].tmp-old has its folder deleted by the writer of s[1]",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": ("    if not path.is_dir() or os.path.lexists(path / MANIFEST):\n        return"),
        "replace": ("    if True:\n        return"),
        "tests": [
            "tests/test_cache_store.py::test_a_folder_that_cannot_be_renamed_is_refused_before_an_item_is_read",
        ],
        "why": "a bind mount is found only once the whole store is written beside it (a bare EBUSY)",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    if os.path.lexists(path) and os.path.ismount(path):",
        "replace": "    if False:",
        "tests": [
            "tests/test_cache_store.py::test_a_mount_point_is_refused_before_an_item_is_read",
        ],
        "why": "a mount point is written over on the parent's disk",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": ("    if stat.S_ISREG(mode):\n        return"),
        "replace": ("    if True:\n        return"),
        "tests": [
            "tests/test_cache_store.py::test_a_lock_file_that_is_not_a_file_is_refused_by_name",
        ],
        "why": "a lock file planted as a link or a folder fails with a bare OSError (or is locked as a FIFO)",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "        if not (plain and (name in own or (temporary and _OWN.fullmatch(name)))):",
        "replace": "        if not (plain and (name in own or _OWN.fullmatch(name))):",
        "tests": [
            "tests/test_cache_store.py::test_rebuild_never_removes_a_users_array_named_like_one_the_store_does_not_have",
        ],
        "why": "finding 4: the store's own arrays matched by name (f<n>[os].npy): a user's f7.npy deleted on rebuild",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": '[f"f{n}.npy", *([f"f{n}o.npy", f"f{n}s.npy"] if r else [])]',
        "replace": '[f"f{n}.npy", f"f{n}o.npy", f"f{n}s.npy"]',
        "tests": [
            "tests/test_cache_store.py::test_rebuild_never_removes_a_users_array_named_like_one_the_store_does_not_have",
        ],
        "why": "finding 4: a fixed field's offsets and shapes names taken as the store's: a user's f0s.npy deleted",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    if info.st_nlink == 1 and (not text or _HOLDER.fullmatch(text)):",
        "replace": "    if not text or _HOLDER.fullmatch(text):",
        "tests": [
            "tests/test_cache_writers.py::test_a_file_at_the_lock_files_path_is_never_overwritten",
        ],
        "why": "finding 5: a hard link at the lock's path is written into: the user's file at its other name changes",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):",
        "replace": "    elif e.errno in (errno.EROFS,):",
        "tests": [
            "tests/test_cache_writers.py::test_a_full_or_read_only_disk_before_the_first_item_is_a_cache_error_with_the_fix",
        ],
        "why": "finding 15: a folder this process cannot write fails at the lock file with a bare EACCES",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "    others = foreign(path) if replacing else []",
        "replace": "    others = []",
        "tests": [
            "tests/test_cache_store.py",
        ],
        "why": (
            "rebuild=True replaces a store folder holding the user's files (or a copied manifest): they are deleted"
        ),
        "from": "issue29_y_data",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "        if name not in others:",
        "replace": "        if True:",
        "tests": [
            "tests/test_cache_store.py",
        ],
        "why": "removing an old store deletes whatever is in it (a file put there as it was replaced)",
        "from": "issue29_y_data",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "        if not (plain and (name in own or (temporary and _OWN.fullmatch(name)))):",
        "replace": "        if not (plain and (name[:-4] + '.npy' in own or (temporary and _OWN.fullmatch(name)))):",
        "tests": [
            "tests/test_cache_store.py",
        ],
        "why": "a user's file whose name resembles a store's array is taken for the store's own and removed",
        "from": "issue29_y_data",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "        if not (plain and (name in own or (temporary and _OWN.fullmatch(name)))):",
        "replace": "        if not (name in own or (temporary and _OWN.fullmatch(name))):",
        "tests": [
            "tests/test_cache_damaged.py",
        ],
        "why": "a link named like a store's array is taken for the store's own",
        "from": "issue29_y_data",
    },
]

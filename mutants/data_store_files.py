"""The planted bugs of src/composetrain/data/store_files.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/store_files.py",
        "find": '(truncated or altered): {REWRITE}"',
        "replace": '(truncated or altered)"',
        "tests": [
            "tests/test_cache_store.py::test_a_damaged_store_is_still_a_store_and_is_rebuilt_on_request",
        ],
        "why": "a truncated array's message without the fix (ct.cache no longer appends one)",
        "from": "conventions_data",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": 'raise NotAStore(f"{folder / MANIFEST} is not a cache manifest")',
        "replace": 'raise StoreError(f"{folder / MANIFEST} is not a cache manifest")',
        "tests": [
            "tests/test_cache_store.py::test_a_folder_with_a_manifest_of_its_own_is_never_replaced",
        ],
        "why": "a JSON manifest of other keys is taken for a damaged store, and rebuilt over",
        "from": "issue29_store",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": 'if type(raw["format"]) is not int or raw["format"] < 1:',
        "replace": "if False:",
        "tests": [
            "tests/test_cache_store.py",
        ],
        "why": "a manifest with the four keys and format 'webdataset' or null is taken for a store and replaced",
        "from": "issue29_x_data",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": 'if type(raw["format"]) is not int or raw["format"] < 1:',
        "replace": 'if not isinstance(raw["format"], int) or raw["format"] < 1:',
        "tests": [
            "tests/test_cache_store.py",
        ],
        "why": "format true (a bool is an int) is taken for version 1",
        "from": "issue29_x_data",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "            data = f.read(min(info.st_size, limit) + 1)",
        "replace": "            data = f.read(limit + 1)",
        "tests": [
            "tests/test_cache_store.py::test_opening_a_store_takes_memory_independent_of_its_length",
        ],
        "why": "finding 8: every open of a store allocates the manifest's 16 MiB limit, whatever its size",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "    except (ValueError, RecursionError) as e:  # ValueError: not JSON",
        "replace": "    except (json.JSONDecodeError, RecursionError) as e:  # ValueError: not JSON",
        "tests": [
            "tests/test_cache_damaged.py::test_a_manifest_of_another_tool_with_a_huge_integer_is_named_and_never_replaced",
        ],
        "why": "finding 11: a manifest with a 5000-digit int is a bare ValueError, and taken for a damaged store",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": ("    info = os.fstat(fd)\n    if not stat.S_ISREG(info.st_mode):  # checked before fdopen"),
        "replace": ("    info = os.fstat(fd)\n    if False:  # checked before fdopen"),
        "tests": [
            "tests/test_cache_damaged.py::test_an_array_file_that_is_a_folder_is_refused_as_a_store_error",
        ],
        "why": "finding 12: a folder named f0.npy is a bare IsADirectoryError naming a file descriptor",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": ("            f.flush()\n            os.fsync(f.fileno())"),
        "replace": "            f.flush()",
        "tests": [
            "tests/test_cache.py::test_every_file_and_the_folder_are_fsynced_before_the_store_is_renamed_into_place",
        ],
        "why": "an array file not fsynced before the store is renamed into place: a crash can publish zeros",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "    if info.st_size != size:",
        "replace": "    if info.st_size < size:",
        "tests": [
            "tests/test_cache_hostile.py",
        ],
        "why": "an array file longer than its header says (altered) is accepted",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK",
        "replace": "_READ = os.O_RDONLY | os.O_NONBLOCK",
        "tests": [
            "tests/test_cache_hostile.py::test_symbolic_links_inside_a_store_are_refused",
        ],
        "why": "an array file that is a symbolic link (to anywhere) is followed and mapped",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK",
        "replace": "_READ = os.O_RDONLY | os.O_NOFOLLOW",
        "tests": [
            "tests/test_cache_odd.py::test_a_fifo_in_a_store_is_refused_without_blocking",
        ],
        "why": "a FIFO in a crafted store blocks the reader for ever",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "    except (ValueError, RecursionError) as e:",
        "replace": "    except ValueError as e:",
        "tests": [
            "tests/test_cache_odd.py::test_a_deeply_nested_or_overflowing_manifest_is_refused_as_a_store_error",
        ],
        "why": "a deeply nested manifest escapes as a RecursionError rather than a StoreError",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "        and bool(np.all(np.prod(shapes.astype(np.float64), axis=1) < 2**62))",
        "replace": "",
        "tests": [
            "tests/test_cache_odd.py::test_a_deeply_nested_or_overflowing_manifest_is_refused_as_a_store_error",
        ],
        "why": "ragged shapes whose product wraps around int64 pass the check and fail when read",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": ('        with open(self.path, "ab") as f:\n            f.writelines(self.pending)'),
        "replace": (
            '        self.keep = getattr(self, "keep", None) or open(self.path, "ab")  # noqa: SIM115\n'
            "        self.keep.writelines(self.pending)\n"
            "        self.keep.flush()"
        ),
        "tests": [
            "tests/test_cache_odd.py::test_items_with_more_leaves_than_open_files_allowed_are_written",
        ],
        "why": "one file held open per leaf: an item with more leaves than the open-file limit fails (EMFILE)",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": "    if len(text.encode()) > _LIMIT:",
        "replace": "    if len(text.encode()) > 2 * _LIMIT:",
        "tests": [
            "tests/test_cache_agree.py::test_a_manifest_larger_than_the_reader_reads_is_refused_at_the_first_item",
        ],
        "why": "the writer's manifest limit is not the reader's: a store published that its reader refuses",
        "from": "issue29_reader",
    },
]

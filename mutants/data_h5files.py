"""The planted bugs of src/composetrain/data/h5files.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "    if not dset.id.get_type().equal(h5py.h5t.py_create(dset.dtype, logical=True)):\n",
        "replace": "    if False:\n",
        "tests": [
            "tests/test_hdf5.py::test_a_contiguous_dataset_of_a_type_numpy_does_not_lay_out_reads_as_h5py_reads_it",
        ],
        "why": "finding 3: a 12-bit or offset integer type is mapped as its dtype's bytes: -100 read as 3996",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "if end is None or dset.id.get_storage_size() != dset.size * dset.dtype.itemsize:",
        "replace": "if end is None:",
        "tests": [
            "tests/test_hdf5.py::test_external_compact_and_unwritten_data_are_read_by_h5py",
        ],
        "why": (
            "an unwritten dataset (no storage) behind a userblock has an undefined address inside the file: mapped"
        ),
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "        return out.astype(self.dtype, copy=False)",
        "replace": "        return out",
        "tests": [
            "tests/test_hdf5.py::test_big_endian_rows_that_h5py_reads_come_native",
        ],
        "why": "rows h5py reads from a big-endian chunked dataset handed to torch unswapped",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": 'return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype',
        "replace": "return dtype",
        "tests": [
            "tests/test_hdf5.py::test_big_endian_rows_come_native",
        ],
        "why": "big-endian rows handed to torch as they are (torch has no big-endian tensors)",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "return self.array[index].astype(native(self.array.dtype))",
        "replace": "return self.array[index]",
        "tests": [
            "tests/test_hdf5.py::test_big_endian_rows_come_native",
        ],
        "why": "a big-endian memory map gathered but not swapped",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "out = out if len(unique) == len(index) and (unique == index).all() else out[inverse.reshape(-1)]",
        "replace": "out = out if len(unique) == len(index) else out[inverse.reshape(-1)]",
        "tests": [
            "tests/test_hdf5.py::test_any_index_list_reads_what_h5py_reads",
        ],
        "why": "distinct but unsorted indices returned in h5py's sorted order",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "out = out if len(unique) == len(index) and (unique == index).all() else out[inverse.reshape(-1)]",
        "replace": "out = out",
        "tests": [
            "tests/test_hdf5.py::test_any_index_list_reads_what_h5py_reads",
        ],
        "why": "repeated indices read once: the batch comes back short and sorted",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "    except OSError as error:  # cut short, damaged",
        "replace": "    except KeyError as error:  # cut short, damaged",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_file_cut_short_before_ct_hdf5_is_named",
        ],
        "why": "a file cut short reported by h5py alone, without ct.hdf5 or the file's name",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "        if now == then:",
        "replace": "        if now is None or then is None or now[2] == then[2]:",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_file_changed_after_ct_hdf5_is_refused_not_misread",
        ],
        "why": "only the size compared: a file rewritten with other values of the same size passes",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "        self.opened = weakref.WeakMethod(opened)",
        "replace": "        self.opened = lambda: opened",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_dropped_dataset_closes_its_file_at_once",
        ],
        "why": "the h5py reader holds its dataset strongly: a cycle keeps the file open until a garbage collection",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "    except BlockingIOError as error:",
        "replace": "    except KeyError as error:",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_file_another_process_writes_is_named_with_the_fix",
        ],
        "why": "h5py's 'unable to lock file, errno = 11' passed on without the file's name or the fix",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": ("    if not dset.is_virtual:\n        return []"),
        "replace": ("    if True:\n        return []"),
        "tests": [
            "tests/test_hdf5_links.py",
        ],
        "why": "a virtual dataset's missing source read as fill values; its sources never checked for change",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "    tried += [os.path.join(p, base) for p in prefixes] + [os.path.join(folder, base), base]",
        "replace": "    tried += [os.path.join(p, base) for p in prefixes] + [base]",
        "tests": [
            "tests/test_hdf5_links.py::test_a_virtual_dataset_whose_sources_are_there_reads_their_rows_from_any_folder",
        ],
        "why": "a relative source looked for in the working folder only: one beside the file refused",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/h5files.py",
        "find": "        if isinstance(link, h5py.ExternalLink):",
        "replace": "        if False:",
        "tests": [
            "tests/test_hdf5_links.py::test_a_dangling_link_is_named_with_its_missing_file_or_target",
        ],
        "why": "a dangling external link reported as no such dataset, not naming its missing file",
        "from": "issue29_reader",
    },
]

"""The planted bugs of src/composetrain/data/mapped.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        past = given.dtype == torch.uint64 and int(given.cpu().numpy().max()) >= self.length",
        "replace": "        past = False",
        "tests": [
            "tests/test_cache_bounds.py::test_an_unsigned_index_past_the_end_is_an_index_error_not_an_item_from_the_end",
        ],
        "why": "finding 2: the cast to int64 reads 2**64 - 1 as -1: the last item served for an index past the end",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "                i = i.item()  # past int64",
        "replace": "                pass  # past int64",
        "tests": [
            "tests/test_cache_bounds.py::test_an_index_past_int64_is_an_index_error_naming_it",
        ],
        "why": (
            "finding 13: a 0-dim uint64 tensor past int64 is a bare RuntimeError, naming neither dataset nor index"
        ),
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        except (TypeError, ValueError, RuntimeError):  # an int past int64",
        "replace": "        except TypeError:  # an int past int64",
        "tests": [
            "tests/test_cache_bounds.py::test_an_index_past_int64_is_an_index_error_naming_it",
        ],
        "why": "finding 13: a Python int past int64 in a batch is a bare ValueError 'Overflow when unpacking long'",
        "from": "data_store_fixes",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "key = np.array([self.seed, epoch, rank, *indices], dtype=np.int64).tobytes()",
        "replace": "key = np.array([self.seed, rank, *indices], dtype=np.int64).tobytes()",
        "tests": [
            "tests/test_cache_run.py::test_augmentation_differs_per_epoch_and_batch_and_resumes_bit_exactly",
        ],
        "why": "the augmentation repeats every epoch",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": (
            "            t = torch.empty(t.shape, dtype=t.dtype)\n"
            "        dtype = torch_dtype(field.dtype)\n"
            "        return t if t.dtype == dtype else t.view(dtype)"
        ),
        "replace": ("            t = torch.empty(t.shape, dtype=t.dtype)\n        return t"),
        "tests": [
            "tests/test_cache.py::test_dtypes_numpy_lacks_come_back_as_themselves",
        ],
        "why": "a bfloat16 or float8 tensor comes back as the integers it is stored as",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "key = np.array([self.seed, epoch, rank, *indices], dtype=np.int64).tobytes()",
        "replace": "key = np.array([self.seed, epoch, *indices], dtype=np.int64).tobytes()",
        "tests": [
            "tests/test_cache_run.py::test_augmentation_differs_per_epoch_and_batch_and_resumes_bit_exactly",
        ],
        "why": "two ranks reading the same indices (a padded last batch) augment them alike",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": 'return {**self.__dict__, "_arrays": None, "_views": {}}',
        "replace": "return dict(self.__dict__)",
        "tests": [
            "tests/test_cache.py::test_the_store_is_mapped_never_loaded_and_loader_workers_get_no_copy_of_it",
        ],
        "why": "every loader worker receives a pickled copy of the whole store",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if idx.ndim > 1 or idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():",
        "replace": "        if idx.ndim > 1 or idx.is_complex():",
        "tests": [
            "tests/test_cache_odd.py::test_indices_that_are_not_ints_are_refused_and_integer_tensors_index_as_in_the_dataset",
        ],
        "why": "read_batch([1.7]) silently reads item 1, read_batch([True, False]) items 1 and 0",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "            i = operator.index(i)",
        "replace": "            i = i if isinstance(i, int | np.integer) else int(i.foo)",
        "tests": [
            "tests/test_cache_odd.py::test_indices_that_are_not_ints_are_refused_and_integer_tensors_index_as_in_the_dataset",
        ],
        "why": "a 0-dim integer tensor indexes the original dataset but not the cache",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if batch.ndim and len(batch) != n:",
        "replace": "        if False:",
        "tests": [
            "tests/test_cache_odd.py::test_an_augment_that_changes_the_batch_size_is_named",
        ],
        "why": "an augment returning fewer rows fails with IndexError: list index out of range",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if not t.numel():  # NumPy may give",
        "replace": "        if False:  # NumPy may give",
        "tests": [
            "tests/test_cache_odd.py::test_empty_complex_tensors_come_back_viewable_and_verify_compares_them",
        ],
        "why": "an empty tensor comes back with zero strides: .view(dtype) on it fails",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if e.errno != errno.ENOMEM:",
        "replace": "        if True:",
        "tests": [
            "tests/test_cache_odd.py::test_a_map_refused_for_lack_of_address_space_says_so",
        ],
        "why": "a store mapped past ulimit -v fails with a bare 'Cannot allocate memory'",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "with contextlib.suppress(TypeError, ValueError), warnings.catch_warnings():",
        "replace": "with contextlib.suppress(TypeError), warnings.catch_warnings():",
        "tests": [
            "tests/test_hdf5.py::test_big_endian_rows_come_native",
        ],
        "why": "a big-endian memory map makes torch.from_numpy raise ValueError when the maps open",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "if idx.ndim > 1 or idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():",
        "replace": "if idx.ndim > 1:",
        "tests": [
            "tests/test_hdf5_hostile.py::test_index_lists_that_are_not_integers_are_refused",
        ],
        "why": "read_batch([1.7]) reads row 1 and [True] row 1: indices rounded, never refused",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if batch.ndim and len(batch) != n:",
        "replace": "        if False:",
        "tests": [
            "tests/test_hdf5_hostile.py::test_an_augment_that_changes_the_number_of_rows_is_named",
        ],
        "why": "an augment returning more or fewer rows than indices: items dropped or an IndexError",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        return check_rows(augmented, len(idx))",
        "replace": "        return augmented",
        "tests": [
            "tests/test_cache_refusals.py",
        ],
        "why": "an augment that drops rows accepted by ct.run's own loader (refused through a DataLoader)",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if not -self.length <= i < self.length:",
        "replace": "        if not -self.length <= i <= self.length:",
        "tests": [
            "tests/test_cache_bounds.py",
        ],
        "why": "cached[len(cached)] wraps to item 0",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if not -self.length <= i < self.length:",
        "replace": "        if not -self.length - 1 <= i < self.length:",
        "tests": [
            "tests/test_cache_bounds.py",
        ],
        "why": "cached[-len(cached) - 1] wraps to the last item",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        return int(i) % self.length",
        "replace": "        return int(i)",
        "tests": [
            "tests/test_cache_bounds.py",
        ],
        "why": "a negative index not counted from the end (a ragged field's offsets read backwards)",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        if past or not (-self.length <= int(low) and int(high) < self.length):",
        "replace": "        if past or not (-self.length <= int(low) and int(high) <= self.length):",
        "tests": [
            "tests/test_cache_bounds.py",
        ],
        "why": "a batch holding one past the end is not refused by the store (left to whatever reads the rows)",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/data/mapped.py",
        "find": "        return idx if int(low) >= 0 else torch.where(idx < 0, idx + self.length, idx)",
        "replace": "        return idx",
        "tests": [
            "tests/test_cache_bounds.py",
        ],
        "why": "negative indices in a batch not counted from the end",
        "from": "issue29_reader",
    },
]

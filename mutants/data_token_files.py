"""The planted bugs of src/composetrain/data/token_files.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "except (KeyError, ValueError, SyntaxError, tokenize.TokenError) as e:",
        "replace": "except (KeyError, ValueError, SyntaxError) as e:",
        "tests": [
            "tests/test_tokens_refusals.py::test_an_npy_file_with_a_damaged_header_is_refused_naming_it",
        ],
        "why": "a header cut inside a bracket raises tokenize's bare TokenError, naming no file",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "return [inputs, torch.from_numpy(rows[:, 1:].astype(np.int64))]",
        "replace": "return [inputs, torch.from_numpy(rows[:, :-1].astype(np.int64))]",
        "tests": [
            "tests/test_tokens.py::test_every_window_is_the_files_slice_read_alone_or_in_a_batch",
        ],
        "why": "targets not shifted: the model is taught to copy its input",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": 'which = np.searchsorted(self.first, idx, side="right") - 1',
        "replace": 'which = np.searchsorted(self.first, idx, side="left") - 1',
        "tests": [
            "tests/test_tokens.py::test_a_batch_across_files_of_different_dtypes_reads_each_file_once",
        ],
        "why": "a file's first window looked up in the file before it (windows counted file after file, off by one)",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "if low < 0 or high >= vocab_size:",
        "replace": "if low < 0 or high > vocab_size:",
        "tests": [
            "tests/test_tokens_refusals.py::test_a_token_outside_the_vocabulary_is_refused_by_file_and_offset",
        ],
        "why": (
            "the token vocab_size itself passes the check (an embedding of vocab_size rows then fails in training)"
        ),
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": 'f"{TOKENS}: {file.path} holds the token {int(wide[at])} at token {done + at} (byte "',
        "replace": 'f"{TOKENS}: {file.path} holds the token {int(wide[at])} at token {at} (byte "',
        "tests": [
            "tests/test_tokens_refusals.py::test_a_token_outside_the_vocabulary_is_refused_by_file_and_offset",
        ],
        "why": "the offset of a bad token counted from its chunk, not from the file's start",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": ("            _check_unchanged(self.files)\n            flat = super().arrays()"),
        "replace": "            flat = super().arrays()",
        "tests": [
            "tests/test_tokens.py::test_a_file_changed_after_ct_tokens_checked_it_is_refused_when_a_process_maps_it",
        ],
        "why": "PITFALLS 41: a loader worker maps whatever is at the path now (a rewritten shard, other tokens)",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "    if size % dtype.itemsize:",
        "replace": "    if False:",
        "tests": [
            "tests/test_tokens_refusals.py::test_a_size_that_is_not_a_whole_number_of_tokens_is_refused",
        ],
        "why": "a file of another dtype (or cut short) read as whole tokens, its last bytes dropped",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "        if stamp[:2] in seen:",
        "replace": "        if path in seen.values():",
        "tests": [
            "tests/test_tokens_refusals.py::test_paths_that_are_missing_a_folder_or_the_same_file_twice_are_refused",
        ],
        "why": "the same file through a link read twice per epoch",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": 'return {**super().__getstate__(), "_rows": None}',
        "replace": "return super().__getstate__()",
        "tests": [
            "tests/test_tokens.py::test_reading_maps_the_files_and_pickles_without_them",
        ],
        "why": "the windows pickled to every loader worker: the shard's tokens copied, the map not reopened",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "        if count < seq_len + 1:",
        "replace": "        if count < seq_len:",
        "tests": [
            "tests/test_tokens_refusals.py::test_an_empty_file_and_one_shorter_than_a_window_are_refused_naming_them",
        ],
        "why": "a file of exactly seq_len tokens holds no window, and is silently read as none",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": 'dtype.kind not in "ui" or dtype.itemsize > 8 or dtype == np.uint64:',
        "replace": 'dtype.kind not in "ui" or dtype.itemsize > 8:',
        "tests": [
            "tests/test_tokens_refusals.py::test_a_dtype_that_is_not_an_integer_type_int64_holds_is_refused",
        ],
        "why": "uint64 ids past 2**63 wrap to negative int64 ids",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "            if dtype is not None and dtype != found:",
        "replace": "            if False:",
        "tests": [
            "tests/test_tokens_refusals.py::test_a_dtype_given_that_the_npy_header_contradicts_is_refused",
        ],
        "why": (
            "a dtype given that the .npy header contradicts passes unsaid (the user's belief about the file is wrong)"
        ),
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "        _check_unchanged([self.files[n] for n in files.tolist()])\n",
        "replace": "",
        "tests": [
            "tests/test_tokens.py::test_a_file_changed_after_this_process_mapped_it_is_refused_at_the_next_read",
        ],
        "why": "a file cut short after it was mapped kills the process with SIGBUS at the next read",
        "from": "adv33",
    },
]

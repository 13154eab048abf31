"""The planted bugs of src/composetrain/data/token_writer.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": ("                out.flush()\n                os.fsync(out.fileno())"),
        "replace": "                out.flush()",
        "tests": [
            "tests/test_write_tokens.py::test_the_new_file_is_fsynced_before_it_replaces_the_old_and_the_folder_after",
        ],
        "why": "renamed before durable: a crash can leave an empty or partial shard at the path",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": ("            temporary.unlink(missing_ok=True)\n            raise"),
        "replace": "            raise",
        "tests": [
            "tests/test_write_tokens.py::test_an_id_the_dtype_cannot_hold_changes_nothing",
        ],
        "why": "a failed call leaves its temporary file beside the shard",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "        fcntl.flock(fd, fcntl.LOCK_EX)",
        "replace": "        pass",
        "tests": [
            "tests/test_write_tokens.py::test_writers_in_one_folder_take_turns_and_lose_no_append",
        ],
        "why": "two writers copy the same old file and the second rename drops the first's append",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "    if low < 0 or high > top:",
        "replace": "    if high > top:",
        "tests": [
            "tests/test_write_tokens.py::test_an_id_the_dtype_cannot_hold_changes_nothing",
        ],
        "why": "a negative id wraps to 65535 in uint16",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "                shutil.copymode(target, temporary)  # the file keeps who may read it",
        "replace": "                pass",
        "tests": [
            "tests/test_write_tokens.py::test_the_file_keeps_its_permissions",
        ],
        "why": "an append resets the shard's permissions to the umask's",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "                    out.write(_npy_header(dtype_, count + added))",
        "replace": "                    out.write(_npy_header(dtype_, added))",
        "tests": [
            "tests/test_write_tokens.py::test_calls_append_their_arrays_in_order",
        ],
        "why": "the .npy header counts only this call's tokens: the file's size contradicts it",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "                        old.seek(offset)",
        "replace": "                        pass",
        "tests": [
            "tests/test_write_tokens.py::test_calls_append_their_arrays_in_order",
        ],
        "why": "an .npy file's header copied as tokens when it is appended to",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": ("            raise\n        fsync_folder(target.parent)"),
        "replace": "            raise",
        "tests": [
            "tests/test_write_tokens.py::test_the_new_file_is_fsynced_before_it_replaces_the_old_and_the_folder_after",
        ],
        "why": "the rename not made durable: after a crash the folder may still name the old file",
        "from": "tokens",
    },
]

"""The planted bugs of src/composetrain/data/token_writer.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "    if low < 0:  # no dtype holds it as a token: a wider one is no fix",
        "replace": "    if low < -1:  # no dtype holds it as a token: a wider one is no fix",
        "tests": [
            "tests/test_write_tokens.py::test_an_id_the_dtype_cannot_hold_changes_nothing",
        ],
        "why": "-1 (a padding or end id of some tokenizers) written as 65535 into a uint16 file",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):",
        "replace": "    if not os.access(target, os.W_OK):",
        "tests": [
            "tests/test_write_tokens.py::test_a_file_nobody_may_write_is_not_appended_to",
        ],
        "why": "read-only judged by os.access, which says writable to root: a protected shard is replaced",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": 'pattern = re.compile(rf"\\.{re.escape(target.name)}\\.\\d+\\.[0-9a-f]{{8}}\\.tmp")',
        "replace": 'pattern = re.compile(rf"\\.{re.escape(target.name)}.*\\.tmp")',
        "tests": [
            "tests/test_write_tokens.py::test_a_killed_writers_temporary_file_is_removed_by_the_next_write_and_nothing_else",
        ],
        "why": "leftovers matched too loosely: a file of the user's named like a temporary is deleted",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "                    ours = False\n",
        "replace": "                    ours = True\n",
        "tests": [
            "tests/test_write_tokens.py::test_a_folder_it_may_not_write_is_named_and_a_callers_own_os_error_passes_as_it_came",
        ],
        "why": "the caller's own OSError (its tokenizer's full cache) relabelled as the writer's full disk",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "    errno.EFBIG: _FULL,  # a file size limit (ulimit -f)\n",
        "replace": "",
        "tests": [
            "tests/test_write_tokens.py::test_a_full_disk_is_named_with_the_file_and_changes_nothing",
        ],
        "why": "a file size limit (ulimit -f, EFBIG) raises a bare OSError naming no function",
        "from": "adv33",
    },
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
        "find": ("            temporary.unlink(missing_ok=True)\n            failed ="),
        "replace": "            failed =",
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
        "find": "    if low < 0:  # no dtype holds it as a token: a wider one is no fix",
        "replace": "    if False:  # no dtype holds it as a token: a wider one is no fix",
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

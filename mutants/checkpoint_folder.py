"""The planted bugs of src/composetrain/checkpoint/folder.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/folder.py",
        "find": 'return int(match[1]) if match and name == f"step-{int(match[1]):09d}" else None',
        "replace": "return int(match[1]) if match else None",
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_step_name_with_a_spare_leading_zero_is_the_users_and_never_pruned",
        ],
        "why": "step-0000000005 (a spare zero, a copy named by hand) taken for a checkpoint",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/checkpoint/folder.py",
        "find": "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "replace": "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_second_holder_of_the_folder_is_refused_until_the_first_closes",
        ],
        "why": "a shared lock: two runs hold the folder together",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/checkpoint/folder.py",
        "find": ("    if stat.S_ISREG(mode):\n        return None"),
        "replace": ("    if not stat.S_ISDIR(mode):\n        return None"),
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_fifo_in_place_of_a_file_is_never_opened",
        ],
        "why": "only folders refused: a FIFO named state.pt is opened and blocks the resume",
        "from": "issue19",
    },
]

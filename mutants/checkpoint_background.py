"""The planted bugs of src/composetrain/checkpoint/background.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/background.py",
        "find": "                storages[key] = storage.clone()",
        "replace": "                storages[key] = storage",
        "tests": [
            "tests/test_checkpoint_staging.py::test_changing_the_live_tensors_after_staging_changes_nothing_in_the_copy",
        ],
        "why": (
            "staging aliases the live tensors' storage: the next update changes what the writer reads (torchtitan #930)"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/background.py",
        "find": "    return Staged(copied, event)",
        "replace": "    return Staged(value, event)",
        "tests": [
            "tests/test_checkpoint_async.py::test_the_copy_is_taken_when_save_async_returns_and_written_as_a_synchronous_save_would_be",
        ],
        "why": "no copy at the boundary: the writer reads the live state, whatever the updates since made of it",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/background.py",
        "find": ("        if id(t) in memo:\n            return memo[id(t)]\n"),
        "replace": "",
        "tests": [
            "tests/test_checkpoint_staging.py::test_tied_weights_and_views_share_one_copy_and_nothing_with_the_live_state",
        ],
        "why": (
            "a tensor that appears twice (tied weights) is copied as two objects: the file differs from a "
            "synchronous save"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/background.py",
        "find": "                setattr(out, name, walk(attribute))",
        "replace": "                pass",
        "tests": [
            "tests/test_checkpoint_staging.py::test_the_copy_is_saved_byte_for_byte_as_the_live_state",
        ],
        "why": (
            "a state_dict's _metadata (module versions) dropped from the copy: the async state.pt is not the "
            "synchronous one"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/background.py",
        "find": "                self._error = e",
        "replace": "                pass",
        "tests": [
            "tests/test_checkpoint_async.py::test_a_full_disk_in_the_background_stops_the_run_and_leaves_the_previous_checkpoint",
        ],
        "why": (
            "the writer thread swallows its error: a full disk is never said, the run goes on without its checkpoint"
        ),
        "from": "checkpoint_async",
    },
]

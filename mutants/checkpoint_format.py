"""The planted bugs of src/composetrain/checkpoint/format.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "STREAM_STATES = (dict, OrderedDict)",
        "replace": "STREAM_STATES = (dict,)",
        "tests": [
            "tests/test_streams.py::test_a_state_dict_returned_as_an_ordered_dict_is_saved_and_resumed",
        ],
        "why": "an OrderedDict state refused as 'not a dict', though it loads with weights_only as it was",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "    if applied == since or (since is None and applied <= step):",
        "replace": "    if applied <= step:",
        "tests": [
            "tests/test_global_batch.py::test_a_checkpoint_whose_unlogged_updates_do_not_add_up_is_set_aside",
        ],
        "why": "a window short of its updates since the last record passes: the next record another mean, silently",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": '    applied = sum(not entry["skipped"] for entry in window)',
        "replace": "    applied = len(window)",
        "tests": [
            "tests/test_global_batch.py::test_a_window_holding_skipped_updates_adds_up_by_its_applied_ones",
        ],
        "why": "skipped updates counted as applied: a sound checkpoint with a skip in its window set aside",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": (
            '    if problem is None and payload["settings"].get("global_batch_size") is not None:  # its window: '
            "ranks' means"
        ),
        "replace": '    if problem is None and payload["settings"].get("global_batch_size") is None:',
        "tests": [
            "tests/test_global_batch.py::test_a_checkpoint_whose_unlogged_updates_do_not_add_up_is_set_aside",
        ],
        "why": "state.pt's window checked in batch_size runs (where it is empty) and not in global batch ones",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "READS = (2, 3)",
        "replace": "READS = (3,)",
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_checkpoint_of_format_2_loads_without_checksums_and_one_of_format_3_needs_them",
        ],
        "why": "29.12: checkpoints written before checksums are refused",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": '    if settings.get("global_batch_size") is not None or (',
        "replace": '    if settings.get("batch_size") is not None or (',
        "tests": [
            "tests/test_resume_anywhere.py::test_what_cannot_be_exact_is_refused_before_anything_changes",
        ],
        "why": "the world-size check reads the wrong setting: a batch_size checkpoint resumes on another W",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'if payload["world_size"] != world_size:',
        "replace": 'if payload["world_size"] < world_size:',
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_checkpoint_of_two_processes_is_refused_in_one_and_kept",
        ],
        "why": "20.10: a checkpoint of more processes than the run has is resumed",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "    if not same_ranks(payload, world_size, data_shards):\n",
        "replace": "    if False:\n",
        "tests": [
            "tests/test_meshes.py::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh",
            "tests/test_checkpoint_format.py::test_a_rank_file_continues_only_on_processes_reading_the_same_data_shards",
        ],
        "why": (
            "a batch_size run (per-rank order and random states) resumed on another layout of its processes "
            "without a word"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": '    return payload["data_shards"] or list(range(payload["world_size"]))',
        "replace": '    return payload["data_shards"]',
        "tests": [
            "tests/test_checkpoint_format.py::test_a_rank_file_continues_only_on_processes_reading_the_same_data_shards",
        ],
        "why": "a checkpoint written before the stamp (no data_shards) never continues its ranks' own files",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'settings.get("stream") not in (None, "global state"):',
        "replace": 'settings.get("stream") not in (None, "global state", "state"):',
        "tests": [
            "tests/test_streams_ranks.py::test_a_stream_resumes_on_another_number_of_processes_only_where_its_state_is_the_jobs",
        ],
        "why": "a stream's per-rank state resumes on another world size: rank 0's state read by every rank",
        "from": "streams",
    },
]
